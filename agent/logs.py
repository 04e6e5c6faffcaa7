"""Structured logging setup (structlog), console or JSON, always on standard error.

Standard output holds only a command's product (YAML, a report, a table), so
that ``gitops-agent render ... | kubectl apply -f -`` gets nothing else:
importing ``agent`` points structlog's default logger (stdout out of the box)
at stderr before anything is configured (``default_to_stderr``), and
``configure`` (called by the CLI group for every command, then again by a
command once it knows its config) keeps it there. Stages log with bound
fields (cluster, revision, object); secrets never reach a log call because
plans are masked where they are made (``masking``) and URLs are masked by
``source``.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

import structlog


class _Stderr:
    """``sys.stderr`` looked up at each write: click's test runner and pytest swap it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


STDERR = cast(TextIO, _Stderr())


def default_to_stderr() -> None:
    """Unless the embedding application configured structlog, its default logger writes to stderr."""
    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=STDERR))


def configure(fmt: str, level: str) -> None:
    """Logs as ``fmt`` at ``level``, spelled as the config's ``LogFormat`` and ``LogLevel``.

    No defaults here: this module sits below ``agent.config``, whose ``AgentSettings`` holds them.
    """
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=STDERR),
        cache_logger_on_first_use=False,
    )
