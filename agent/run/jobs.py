"""The daemon's apscheduler jobs: each on an executor of its own, woken, paused, removed.

A job per source (poll), per cluster (pass) and per cluster's waits (health), each on an
executor of one worker named after the job: with ``max_instances=1`` a hung cluster or source
never holds a worker another one needs, and a pass still running when its job is removed
finishes (fenced) on its own thread. Plus the tick and reload jobs on shared executors.
``scheduler.Daemon`` decides when; this only tells apscheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

__all__ = ["Jobs"]


class Jobs:
    """One ``BackgroundScheduler`` and its jobs, by id (``cluster:NAME``, ``source:NAME``, ...)."""

    def __init__(self, on_done: Callable[[JobExecutionEvent], None]) -> None:
        self.scheduler = BackgroundScheduler(
            executors={n: ThreadPoolExecutor(max_workers=1) for n in ("default", "loop", "reload")},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone="UTC",
        )
        self.scheduler.add_listener(on_done, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)

    def shared(self, func: Callable[[], None], job_id: str, seconds: float, executor: str) -> None:
        """``func`` every ``seconds`` on a shared executor (``loop``: the tick; ``reload``)."""
        self.scheduler.add_job(func, "interval", seconds=seconds, id=job_id, executor=executor)

    def add(
        self,
        func: Callable[..., None],
        job_id: str,
        seconds: float,
        *,
        args: Sequence[Any] = (),
        jitter: float | None = None,
        first: datetime | None = None,
    ) -> None:
        """``func(*args)`` every ``seconds`` (plus ``jitter``), first at ``first`` (None: paused),
        on an executor of its own."""
        self.scheduler.add_executor(ThreadPoolExecutor(max_workers=1), alias=job_id)
        self.scheduler.add_job(
            func,
            "interval",
            seconds=seconds,
            jitter=jitter,
            id=job_id,
            args=list(args),
            executor=job_id,
            next_run_time=first,
        )

    def wake(self, job_id: str, when: datetime) -> bool:
        """Run the job next at ``when``; False: no such job."""
        job = self.scheduler.get_job(job_id)
        if job is None:
            return False
        job.modify(next_run_time=when)
        return True

    def pause(self, job_id: str) -> None:
        if (job := self.scheduler.get_job(job_id)) is not None:
            job.pause()

    def next_run(self, job_id: str) -> tuple[bool, datetime | None]:
        """Whether the job exists, and when it runs next (None: paused)."""
        job = self.scheduler.get_job(job_id)
        return (False, None) if job is None else (True, job.next_run_time)

    def exists(self, job_id: str) -> bool:
        return self.scheduler.get_job(job_id) is not None

    def reschedule(self, job_id: str, seconds: float, jitter: float) -> None:
        self.scheduler.reschedule_job(job_id, trigger="interval", seconds=seconds, jitter=jitter)

    def remove(self, job_id: str) -> None:
        """Remove the job and its executor; a run still going finishes on its own thread."""
        if self.scheduler.get_job(job_id) is not None:
            self.scheduler.remove_job(job_id)
        try:
            executor = self.scheduler._lookup_executor(job_id)
        except KeyError:
            return
        self.scheduler.remove_executor(job_id, shutdown=False)
        executor.shutdown(wait=False)

    def start(self) -> None:
        self.scheduler.start()

    def shutdown(self) -> None:
        self.scheduler.shutdown(wait=False)
