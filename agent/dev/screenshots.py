"""``python -m agent.dev.screenshots``: the status page's screenshots in docs/img/, in one command.

A small fleet of synthetic passes (three clusters, apps ok, failing, suspended, rolling out,
yielding a field to an HPA) is recorded by the real ``StatusPage``, served by the agent's own
HTTP server on loopback, and photographed by the headless Chromium the tests use (Debian's
``chromium`` and ``chromium-driver``; the driver's path is given, so nothing is downloaded). The
clock is fixed, so the images change only when the page does. Not run by CI.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.model import (
    AppHealth,
    ApplyResult,
    Blocker,
    ClusterResult,
    Failure,
    FailureReason,
    FieldConflict,
    Health,
    HealthState,
    Note,
    ObjectKey,
    Outcome,
    PassState,
    PruneReason,
    PruneRefusal,
    Resolution,
)
from agent.run.record_store import FileStore
from agent.run.server import HealthServer, Metrics
from agent.run.status import ClusterStatus
from agent.run.statuspage import ClusterSnapshot, Snapshot, StatusPage
from agent.ui.auth import Access

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LAPTOP = (1366, 900)
PHONE = (390, 844)
NOW = datetime(2030, 3, 4, 12, 0, tzinfo=UTC)
HEAD, OLD = "9f4c2d1e8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d", "3b2a19f8e7d6c5b4a3928170f6e5d4c3b2a19f8e"
SUBJECTS = {HEAD: "payments: raise the connection pool to 40", OLD: "web: image 1.14.2"}


def chromium(size: tuple[int, int] = LAPTOP) -> Any:
    """A headless Chromium of this machine (raises ``FileNotFoundError`` naming what is missing)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    for p in (CHROMIUM, CHROMEDRIVER):
        if not p.is_file():
            raise FileNotFoundError(f"{p} missing: install the Debian packages chromium and chromium-driver")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root Chromium's sandbox cannot start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={size[0]},{size[1]}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


def _key(kind: str, ns: str, name: str, group: str = "") -> ObjectKey:
    return ObjectKey(group, kind, ns, name)


def _result(
    cluster: str, app: str, *objects: ApplyResult, at: int, revision: str = HEAD, **kw: Any
) -> ClusterResult:
    start = NOW - timedelta(minutes=at)
    return ClusterResult(
        cluster,
        revision,
        results=list(objects),
        started=start,
        finished=start + timedelta(seconds=3.2),
        app=app,
        **kw,
    )


def fleet(page: StatusPage) -> None:
    """Record the synthetic passes: what the screenshots show."""
    hpa = FieldConflict(
        ("f:spec", "f:replicas"), "kube-controller-manager", "Update", "scale", Resolution.YIELD, 3, 7
    )
    web = [
        ApplyResult(
            _key("Deployment", "web", "frontend", "apps"),
            Outcome.UNCHANGED,
            note=Note.YIELDED,
            yielded=(hpa,),
        ),
        ApplyResult(_key("Service", "web", "frontend"), Outcome.UNCHANGED),
        ApplyResult(_key("ConfigMap", "web", "frontend-config"), Outcome.CONFIGURED),
        ApplyResult(_key("Secret", "web", "frontend-tls"), Outcome.UNCHANGED),
    ]
    payments = [
        ApplyResult(_key("Deployment", "payments", "api", "apps"), Outcome.CONFIGURED),
        ApplyResult(
            _key("ConfigMap", "payments", "limits"),
            Outcome.FAILED,
            status=422,
            message='ConfigMap "limits" is invalid: data[pool.max]: Invalid value: "pool max": a valid '
            "config key must consist of alphanumeric characters, '-', '_' or '.'",
        ),
        ApplyResult(_key("Service", "payments", "api"), Outcome.UNCHANGED),
        ApplyResult(_key("ConfigMap", "payments", "old-flags"), Outcome.PRUNED),
    ]
    ok = [ApplyResult(_key("ConfigMap", "monitoring", f"rules-{i}"), Outcome.UNCHANGED) for i in range(6)]
    passes = [
        [
            _result(
                "prod-eu", "web", *[ApplyResult(r.key, Outcome.CREATED) for r in web], at=300, revision=OLD
            )
        ],
        [_result("prod-eu", "web", *web, at=42)],
        [_result("prod-eu", "payments", *payments[:1], at=200, revision=OLD)],
        [_result("prod-eu", "payments", *payments, at=18)],
        [_result("prod-eu", "monitoring", *ok, at=7)],
        [_result("prod-us", "web", *web, at=35)],
        [
            _result(
                "prod-us",
                "payments",
                *payments[:1],
                at=12,
                prune_refusal=PruneRefusal(PruneReason.SUSPENDED, "suspended by the operator"),
            )
        ],
        [_result("prod-us", "monitoring", *ok, at=7)],
        [
            _result(
                "staging",
                "staging",
                at=4,
                failure=Failure(
                    FailureReason.TIMEOUT, "timed out: pass did not finish within 300s", PassState.TIMED_OUT
                ),
            )
        ],
    ]
    for results in passes:
        page.record_passes(results, SUBJECTS, may_write=lambda _c: True)
    blocker = Blocker(
        "Pod", "web", "frontend-7d9f-x2kq", "ImagePullBackOff", 'Back-off pulling image "web:1.15"'
    )
    rolling = Health(
        HealthState.IN_PROGRESS, "1 of 3 replicas updated", blocker=blocker, reason="LessUpdated"
    )
    page.record_healths(
        "prod-us",
        [
            AppHealth(
                "web",
                HEAD,
                rolling,
                done=False,
                objects=4,
                current=3,
                by_object=((web[0].key, rolling),),
            )
        ],
        may_write=True,
    )


def statuses() -> dict[str, ClusterStatus]:
    out = {}
    for cluster, apps in (
        ("prod-eu", ("web", "payments", "monitoring")),
        ("prod-us", ("web", "payments", "monitoring")),
        ("staging", ("staging",)),
    ):
        st = ClusterStatus(cluster)
        for a in apps:
            st.app(a)
        out[cluster] = st
    return out


def shoot(out: Path) -> list[Path]:
    """Serve the synthetic fleet and save each view's screenshot under ``out``."""
    st = statuses()
    holders = {
        "prod-eu": "gitops-agent-6c9f-1",
        "prod-us": "gitops-agent-6c9f-1",
        "staging": "gitops-agent-6c9f-2",
    }
    snap = Snapshot(
        "gitops-agent",
        tuple(
            ClusterSnapshot(n, s, held=True, holder=holders[n], heads=dict.fromkeys(s.apps, HEAD))
            for n, s in st.items()
        ),
        replica="gitops-agent-6c9f-1",
        sources=(("default", HEAD, ""),),
    )
    with tempfile.TemporaryDirectory() as tmp:
        page = StatusPage(lambda: snap, FileStore(Path(tmp)), access=Access.OPEN, clock=lambda: NOW)
        fleet(page)
        for name, status in st.items():  # what Fleet.record does after each pass
            for app, app_status in status.apps.items():
                record = page.record(name, app)
                app_status.state = PassState(record.state) if record else PassState.PENDING
            status.settle_state()
        server = HealthServer(
            "127.0.0.1:0",
            metrics=Metrics(),
            last_tick=time.monotonic,
            ready=lambda: None,
            status=dict,
            page=page,
        )
        server.start()
        base = f"http://127.0.0.1:{server.port}"
        shots = {
            "fleet.png": ("/ui/", LAPTOP),
            "app.png": ("/ui/clusters/prod-us/apps/web", LAPTOP),
            "app-failed.png": ("/ui/clusters/prod-eu/apps/payments", LAPTOP),
            "cluster.png": ("/ui/clusters/prod-us", LAPTOP),
            "history.png": ("/ui/history", LAPTOP),
            "events.png": ("/ui/events", LAPTOP),
            "fleet-phone.png": ("/ui/", PHONE),
        }
        written = []
        try:
            browser = chromium()
            try:
                out.mkdir(parents=True, exist_ok=True)
                for name, (path, size) in shots.items():
                    browser.set_window_size(*size)
                    browser.get(base + path)
                    height = browser.execute_script("return document.documentElement.scrollHeight")
                    browser.set_window_size(size[0], min(max(int(height), size[1] // 2), 2400))
                    target = out / name
                    browser.save_screenshot(str(target))
                    written.append(target)
            finally:
                browser.quit()
        finally:
            server.stop()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.dev.screenshots", description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "docs" / "img"
    ap.add_argument("--out", type=Path, default=default, help="where the PNG files go (default: docs/img)")
    args = ap.parse_args(argv)
    try:
        written = shoot(args.out)
    except FileNotFoundError as e:
        print(f"screenshots: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
