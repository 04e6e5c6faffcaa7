"""The status page without a browser: its records (pure), where they are kept, and its answers.

What the page keeps of each app (``agent.ui.records``): the yielded field in words, nothing of a
Secret's values, no new history for a steady pass (so no write), bounded history; the file store
that keeps history over a restart; who may read it (``agent.ui.auth``) and the headers of every
answer (``agent.run.statuspage``). The browser tests are ``tests/test_status_page_browser.py``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.config.types import HISTORY_PASSES
from agent.model import (
    AppHealth,
    ApplyResult,
    ClusterResult,
    Failure,
    FailureReason,
    FieldConflict,
    Health,
    HealthState,
    Note,
    ObjectKey,
    Outcome,
    Resolution,
    WaveWait,
)
from agent.run.record_store import FileStore
from agent.run.status import ClusterStatus
from agent.run.statuspage import CSP, ClusterSnapshot, Snapshot, StatusPage
from agent.ui import auth
from agent.ui.records import AppRecord, after_health, after_pass, encode

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SHA1, SHA2 = "1" * 40, "2" * 40
WEB = ObjectKey("apps", "Deployment", "shop", "web")
SECRET = ObjectKey("", "Secret", "shop", "db")
SCALE = FieldConflict(
    ("f:spec", "f:replicas"), "kube-controller-manager", "Update", "scale", Resolution.YIELD, 3, 5
)


def result(*objects: ApplyResult, revision: str = SHA1, at: int = 0, **kw: object) -> ClusterResult:
    start = T0 + timedelta(minutes=at)
    return ClusterResult(
        "prod",
        revision,
        results=list(objects),
        started=start,
        finished=start + timedelta(seconds=2),
        app="shop",
        **kw,  # type: ignore[arg-type]
    )


def yielded_web() -> ApplyResult:
    return ApplyResult(WEB, Outcome.UNCHANGED, note=Note.YIELDED, yielded=(SCALE,))


def test_a_yielded_field_names_its_path_owner_the_value_kept_and_gits() -> None:
    r = after_pass(None, result(yielded_web()), subject="scale web", now=T0)
    ((obj, y),) = r.yields
    assert obj.key == "Deployment.apps/shop/web"
    assert str(y) == "spec.replicas owned by kube-controller-manager (scale), kept 5, Git says 3"


def test_a_secrets_failure_message_and_yielded_values_never_reach_its_record() -> None:
    data = FieldConflict(("f:data", "f:password"), "kube-controller-manager", "Update", "", Resolution.YIELD)
    # What the plan hands over is masked already; the record masks again whatever it is given.
    leaked = FieldConflict(
        data.path, data.manager, "Update", "", Resolution.YIELD, "SENTINEL-git", "SENTINEL-live"
    )
    objects = (
        ApplyResult(SECRET, Outcome.UNCHANGED, note=Note.YIELDED, yielded=(leaked,)),
        ApplyResult(
            ObjectKey("", "Secret", "shop", "api"), Outcome.FAILED, status=422, message='data: "SENTINEL-msg"'
        ),
    )
    r = after_pass(None, result(*objects), subject="", now=T0)
    text = encode(r)
    assert "SENTINEL" not in text
    assert [str(y) for _, y in r.yields] == [
        "data.password owned by kube-controller-manager (Update), kept ***, Git says ***"
    ]
    failed = next(o for o in r.objects if o.outcome == "failed")
    assert failed.message == "HTTP 422"


def test_a_steady_pass_leaves_the_record_as_it_was_so_nothing_is_written() -> None:
    first = after_pass(None, result(ApplyResult(WEB, Outcome.CREATED)), subject="s", now=T0)
    second = after_pass(first, result(ApplyResult(WEB, Outcome.UNCHANGED), at=1), subject="s", now=T0)
    steady = after_pass(second, result(ApplyResult(WEB, Outcome.UNCHANGED), at=2), subject="s", now=T0)
    assert len(second.history) == 1  # ended as the first did: not a new entry
    assert encode(second) != encode(first)  # its objects are unchanged now: written once more
    assert encode(steady) == encode(second)
    assert steady.since == first.since


def test_a_failing_pass_repeated_at_one_revision_is_one_history_entry_and_one_event() -> None:
    bad = ApplyResult(WEB, Outcome.FAILED, status=422, message="spec.replicas: Invalid value")
    r = after_pass(None, result(bad), subject="s", now=T0)
    again = after_pass(r, result(bad, at=5), subject="s", now=T0)
    assert encode(again) == encode(r)
    assert [e.reason for e in again.events] == ["ApplyFailed"]
    assert again.problem == "Deployment.apps/shop/web: HTTP 422: spec.replicas: Invalid value"


def test_history_keeps_only_the_newest_passes() -> None:
    r: AppRecord | None = None
    for i in range(HISTORY_PASSES + 7):
        r = after_pass(r, result(ApplyResult(WEB, Outcome.CONFIGURED), at=i), subject=str(i), now=T0)
    assert r is not None and len(r.history) == HISTORY_PASSES
    assert r.history[-1].subject == str(HISTORY_PASSES + 6)


def test_a_pass_that_could_not_look_keeps_the_objects_the_agent_owns() -> None:
    r = after_pass(None, result(yielded_web()), subject="s", now=T0)
    down = after_pass(
        r, result(failure=Failure(FailureReason.UNREACHABLE, "connection refused"), at=1), subject="s", now=T0
    )
    assert down.state == "failed" and down.problem == "connection refused"
    assert down.objects == r.objects and down.since != r.since


def test_a_wait_that_ended_gives_each_object_its_health_and_one_event() -> None:
    r = after_pass(None, result(yielded_web()), subject="s", now=T0)
    failed = Health(HealthState.FAILED, "Back-off pulling image", reason="ImagePullBackOff")
    health = AppHealth("shop", SHA1, failed, done=True, objects=1, by_object=((WEB, failed),))
    after = after_health(r, health, now=T0)
    assert after.objects[0].health == "Failed" and after.objects[0].health_reason == "ImagePullBackOff"
    assert [e.reason for e in after.events] == ["HealthFailed"]
    assert after_health(after, health, now=T0) == after


def test_records_read_back_as_they_were_written() -> None:
    r = after_pass(None, result(yielded_web()), subject="<b>x</b>", now=T0)
    assert AppRecord.from_json(json.loads(encode(r))) == r
    assert AppRecord.from_json({**r.to_json(), "version": 999}) is None


def _page(store: FileStore, status: ClusterStatus, **kw: object) -> StatusPage:
    snap = Snapshot("agent", (ClusterSnapshot("prod", status),))
    page = StatusPage(lambda: snap, store, access=kw.pop("access", auth.Access.OPEN), **kw)  # type: ignore[arg-type]
    page.load()
    return page


def test_history_survives_a_restart_and_a_steady_pass_writes_no_file(tmp_path: Path) -> None:
    status = ClusterStatus("prod")
    status.app("shop")
    page = _page(FileStore(tmp_path), status)
    page.record_passes([result(yielded_web())], {SHA1: "scale web"}, may_write=lambda _: True)
    page.record_passes([result(yielded_web(), at=1)], {SHA1: "scale web"}, may_write=lambda _: True)
    assert page.writes == 1
    mtime = next(tmp_path.glob("*.json")).stat().st_mtime_ns
    restarted = _page(FileStore(tmp_path), status)
    restarted.record_passes([result(yielded_web(), at=2)], {SHA1: "scale web"}, may_write=lambda _: True)
    assert restarted.writes == 0 and next(tmp_path.glob("*.json")).stat().st_mtime_ns == mtime
    body = restarted.handle("GET", "/ui/history?cluster=prod&app=shop", {}).body.decode()
    assert "scale web" in body


@pytest.mark.parametrize(
    ("listen", "token", "expected"),
    [
        ("127.0.0.1:8080", "", auth.Access.OPEN),
        ("[::1]:8080", "", auth.Access.OPEN),
        ("localhost:8080", "", auth.Access.OPEN),
        ("0.0.0.0:8080", "", auth.Access.OFF),
        (":8080", "", auth.Access.OFF),
        ("10.0.0.5:8080", "t", auth.Access.TOKEN),
        ("127.0.0.1:8080", "t", auth.Access.TOKEN),
    ],
)
def test_the_page_is_open_on_loopback_needs_the_token_elsewhere_and_is_off_without_one(
    listen: str, token: str, expected: auth.Access
) -> None:
    assert auth.access(listen, token) is expected


def test_every_answer_carries_a_restrictive_content_security_policy_and_refuses_writes(
    tmp_path: Path,
) -> None:
    status = ClusterStatus("prod")
    status.app("shop")
    page = _page(FileStore(tmp_path), status)
    for method, path in [
        ("GET", "/ui/"),
        ("GET", "/ui/nothing"),
        ("POST", "/ui/"),
        ("GET", "/ui/static/page.css"),
    ]:
        answer = page.handle(method, path, {})
        assert dict(answer.headers)["Content-Security-Policy"] == CSP, path
    assert page.handle("POST", "/ui/clusters/prod", {}).code == 405
    assert page.handle("GET", "/ui/static/../../records.py", {}).code == 404


def test_with_a_token_only_the_cookie_or_bearer_reads_and_sign_in_stays_on_this_site(tmp_path: Path) -> None:
    status = ClusterStatus("prod")
    page = _page(FileStore(tmp_path), status, access=auth.Access.TOKEN, token="s3cret")
    assert page.handle("GET", "/ui/", {}).code == 303
    assert page.handle("GET", "/ui/", {"Authorization": "Bearer nope"}).code == 401
    assert page.handle("GET", "/ui/", {"Authorization": "Bearer s3cret"}).code == 200
    answer = page.handle("POST", "/ui/login", {}, b"token=s3cret&next=https%3A%2F%2Fevil.example%2F")
    headers = dict(answer.headers)
    assert answer.code == 303 and headers["Location"] == "/ui/"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "s3cret" not in cookie and "HttpOnly" in headers["Set-Cookie"]
    assert page.handle("GET", "/ui/", {"Cookie": cookie}).code == 200
    assert page.handle("POST", "/ui/login", {}, b"token=wrong").code == 401


def test_off_on_a_public_address_without_a_token_the_page_says_why(tmp_path: Path) -> None:
    page = _page(FileStore(tmp_path), ClusterStatus("prod"), access=auth.Access.OFF)
    answer = page.handle("GET", "/ui/", {})
    assert answer.code == 403 and b"ui_token_file" in answer.body


@pytest.mark.parametrize(
    "next_",
    ["/ui/%0d%0aSet-Cookie:%20gitops_agent_ui=forged", "/ui/%0aX-Injected:%201", "/ui/%09", "/ui\\evil"],
)
def test_a_sign_in_never_carries_a_control_character_of_next_into_the_location_header(
    tmp_path: Path, next_: str
) -> None:
    page = _page(FileStore(tmp_path), ClusterStatus("prod"), access=auth.Access.TOKEN, token="s3cret")
    answer = page.handle("POST", "/ui/login", {}, b"token=s3cret&next=" + next_.encode())
    location = dict(answer.headers)["Location"]
    assert answer.code == 303 and location == "/ui/"
    shown = page.handle("GET", "/ui/login?next=" + next_, {})
    assert b"Set-Cookie:" not in shown.body and b"X-Injected" not in shown.body


MIGRATE = ObjectKey("batch", "Job", "shop", "migrate")


def waiting(waited: float) -> WaveWait:
    running = Health(HealthState.IN_PROGRESS, "Job has not completed: 0 of 1 succeeded")
    return WaveWait("wave 1", 1, 2, 3, MIGRATE, running, waited, 300.0, 2.0)


def test_a_syncing_app_shows_its_wave_and_what_it_waits_for_on_the_grid_and_its_page(tmp_path: Path) -> None:
    status = ClusterStatus("prod")
    status.app("shop")
    page = _page(FileStore(tmp_path), status)
    page.record_passes([result(wave_wait=waiting(1.0))], {SHA1: "migrate"}, may_write=lambda _: True)
    # The same wave waiting longer is no new record: no write at every look.
    page.record_passes([result(wave_wait=waiting(4.0), at=1)], {SHA1: "migrate"}, may_write=lambda _: True)
    assert page.writes == 1

    grid = page.handle("GET", "/ui/", {}).body.decode()
    wave_tag = (
        '<span class="tag wave" title="wave 1 (2 of 3), waiting for Job.batch/shop/migrate: '
        'InProgress: Job has not completed: 0 of 1 succeeded">wave 1 (2 of 3)</span>'
    )
    assert 'data-state="syncing"' in grid and wave_tag in grid
    assert wave_tag in page.handle("GET", "/ui/clusters/prod", {}).body.decode()
    app = page.handle("GET", "/ui/clusters/prod/apps/shop", {}).body.decode()
    assert '<dd id="wave">wave 1 (2 of 3), waiting for <code>Job.batch/shop/migrate</code>' in app
    assert "InProgress: Job has not completed: 0 of 1 succeeded" in app and "at most 300s" in app

    # Once the sync is through, the wave goes from the record and the pages.
    page.record_passes([result(at=2)], {SHA1: "migrate"}, may_write=lambda _: True)
    assert 'class="tag wave"' not in page.handle("GET", "/ui/", {}).body.decode()
    assert 'id="wave"' not in page.handle("GET", "/ui/clusters/prod/apps/shop", {}).body.decode()


def test_a_records_wave_reads_back_and_a_record_written_before_waves_still_reads() -> None:
    r = after_pass(None, result(wave_wait=waiting(1.0)), subject="s", now=T0)
    assert r.state == "syncing" and r.wave is not None and r.wave.blocker == "Job.batch/shop/migrate"
    assert AppRecord.from_json(json.loads(encode(r))) == r
    older = {k: v for k, v in r.to_json().items() if k != "wave"}
    back = AppRecord.from_json(older)
    assert back is not None and back.wave is None
