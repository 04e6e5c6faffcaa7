"""Change windows decided without a cluster: cron as cron reads it, overlaps, time zones, edges,
the config errors that name the key (``config.cron``, ``config.windows``, ``plan.windows``), and
``POST /sync``'s ``force_window`` on a loopback server."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from agent.config.cron import parse_cron
from agent.config.load import parse_config
from agent.config.tomlreader import parse_duration
from agent.config.windows import ChangeWindow, WindowKind
from agent.errors import ConfigError
from agent.model import ClusterResult, WindowHold, WindowReason
from agent.plan.windows import is_open, window_state
from agent.report.summary import format_summary
from agent.run.server import HealthServer, Metrics

ALLOW, DENY = WindowKind.ALLOW, WindowKind.DENY
# 2026-12-07 is a Monday.
MON_9 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def w(
    schedule: str,
    duration: str | float,
    kind: WindowKind,
    *,
    name: str = "",
    apps: tuple[str, ...] = ("*",),
    clusters: tuple[str, ...] = ("*",),
    tz: str = "UTC",
) -> ChangeWindow:
    seconds = duration if isinstance(duration, float) else _seconds(duration)
    return ChangeWindow(schedule, seconds, kind, name=name, apps=apps, clusters=clusters, time_zone=tz)


def _seconds(text: str) -> float:
    return parse_duration(text)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- cron as cron reads it ------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "day", "starts"),
    [
        # weekday 0 and 7 are Sunday (apscheduler 3 reads 0 as Monday): 2026-12-06 is a Sunday
        ("0 9 * * 0", "2026-12-06", True),
        ("0 9 * * 7", "2026-12-06", True),
        ("0 9 * * sun", "2026-12-06", True),
        ("0 9 * * 0", "2026-12-07", False),
        ("0 9 * * 1-5", "2026-12-05", False),  # a Saturday
        ("0 9 * * mon-fri", "2026-12-07", True),
        # both day fields restricted: either matches (cron's OR) - the 1st, or any Friday
        ("0 9 1 * fri", "2026-12-04", True),
        ("0 9 1 * fri", "2026-12-01", True),
        ("0 9 1 * fri", "2026-12-02", False),
        # one of them a star: both must match
        ("0 9 */2 * fri", "2026-12-04", False),
        ("0 9 * dec *", "2026-12-04", True),
        ("0 9 * jan *", "2026-12-04", False),
        ("@daily", "2026-12-04", False),  # midnight, not 9:00
    ],
)
def test_cron_reads_days_and_weekdays_as_cron_does(schedule: str, day: str, starts: bool) -> None:
    nine = at(f"{day}T09:00:00+00:00")
    found = parse_cron(schedule).latest_start(nine, UTC, after=nine - timedelta(minutes=1))
    assert (found is not None) is starts


@pytest.mark.parametrize(
    ("schedule", "error"),
    [
        ("0 9 * *", "5 fields"),
        ("60 9 * * *", "minute: 60 is outside 0-59"),
        ("0 24 * * *", "hour: 24 is outside 0-23"),
        ("0 9 0 * *", "day of month: 0 is outside 1-31"),
        ("0 9 * 13 *", "month: 13 is outside 1-12"),
        ("0 9 * * 8", "day of week: 8 is outside 0-7"),
        ("0 9 * * fry", "day of week: 'fry' is not a value"),
        ("*/0 9 * * *", "minute: bad step"),
        ("0 17-9 * * *", "hour: range '17-9' runs backwards"),
        ("@reboot", "5 fields"),
    ],
)
def test_cron_refuses_what_it_cannot_read_naming_the_field(schedule: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_cron(schedule)


def test_latest_and_next_start_step_over_days_hours_and_minutes() -> None:
    cron = parse_cron("15,45 9,17 * * 1-5")
    now = at("2026-12-07T08:00:00+00:00")  # Monday before the first start: Friday 17:45
    assert cron.latest_start(now, UTC, after=now - timedelta(days=7)) == at("2026-12-04T17:45:00+00:00")
    assert cron.next_start(now, UTC, before=now + timedelta(days=7)) == at("2026-12-07T09:15:00+00:00")
    sat = at("2026-12-05T12:00:00+00:00")
    assert cron.next_start(sat, UTC, before=sat + timedelta(days=7)) == at("2026-12-07T09:15:00+00:00")


# -- windows: edges, overlaps, time zones -----------------------------------------------


@pytest.mark.parametrize(
    ("now", "open_"),
    [
        ("2026-12-07T08:59:59+00:00", False),  # a second before the start
        ("2026-12-07T09:00:00+00:00", True),  # the start is inside
        ("2026-12-07T09:59:59+00:00", True),
        ("2026-12-07T10:00:00+00:00", False),  # the end is outside
    ],
)
def test_a_window_is_open_from_its_start_included_to_its_end_excluded(now: str, open_: bool) -> None:
    state = window_state(w("0 9 * * *", "1h", DENY), at(now))
    assert state.open is open_
    if open_:
        assert state.until == at("2026-12-07T10:00:00+00:00")
    else:
        assert state.next_start is not None


def test_a_window_longer_than_a_day_stays_open_across_midnight_and_weekdays() -> None:
    weekend = w("0 18 * * fri", "2d14h", DENY)  # Friday 18:00 to Monday 08:00
    assert window_state(weekend, at("2026-12-06T12:00:00+00:00")).open  # Sunday
    assert window_state(weekend, at("2026-12-07T07:59:00+00:00")).open  # Monday early
    assert not window_state(weekend, at("2026-12-07T08:00:00+00:00")).open


@pytest.mark.parametrize(
    ("windows", "now", "writes", "reason", "window"),
    [
        # no window: always open
        ((), MON_9, True, None, ""),
        # a deny window open: closed, named
        ((w("0 8 * * *", "2h", DENY, name="freeze"),), MON_9, False, WindowReason.DENY, "freeze"),
        # an allow window open: open
        ((w("0 8 * * *", "2h", ALLOW, name="day"),), MON_9, True, None, ""),
        # an allow window closed: closed, naming the allow window that opens next
        (
            (w("0 22 * * *", "2h", ALLOW, name="night"), w("0 12 * * *", "1h", ALLOW, name="noon")),
            MON_9,
            False,
            WindowReason.OUTSIDE_ALLOW,
            "noon",
        ),
        # two allow windows, one open: open
        ((w("0 22 * * *", "2h", ALLOW), w("0 8 * * *", "2h", ALLOW)), MON_9, True, None, ""),
        # allow and deny both open: deny wins
        (
            (w("0 8 * * *", "2h", ALLOW, name="day"), w("30 8 * * *", "1h", DENY, name="release")),
            MON_9,
            False,
            WindowReason.DENY,
            "release",
        ),
        # deny closed, allow open: open
        ((w("0 8 * * *", "2h", ALLOW), w("0 20 * * *", "1h", DENY)), MON_9, True, None, ""),
        # a deny window closed and no allow window: open
        ((w("0 20 * * *", "1h", DENY),), MON_9, True, None, ""),
        # a window for other apps or clusters does not apply
        ((w("0 8 * * *", "2h", DENY, apps=("db-*",)),), MON_9, True, None, ""),
        ((w("0 8 * * *", "2h", DENY, clusters=("prod-*",)),), MON_9, True, None, ""),
        ((w("0 8 * * *", "2h", ALLOW, apps=("db-*",)),), at("2026-12-07T11:00:00+00:00"), True, None, ""),
        # globs that match
        (
            (w("0 8 * * *", "2h", DENY, apps=("we*",), clusters=("stag*", "dev")),),
            MON_9,
            False,
            WindowReason.DENY,
            "windows[0]",
        ),
    ],
)
def test_overlapping_windows_deny_wins_and_allow_closes_the_rest(
    windows: tuple[ChangeWindow, ...], now: datetime, writes: bool, reason: WindowReason | None, window: str
) -> None:
    verdict = is_open(windows, "staging", "web", now)
    assert verdict.writes is writes
    if reason is None:
        assert verdict.hold is None
    else:
        assert verdict.hold is not None
        assert (verdict.hold.reason, verdict.hold.window) == (reason, window)
        assert repr(window) in verdict.hold.message
        assert "nothing applied or pruned" in verdict.hold.message


@pytest.mark.parametrize(
    ("tz", "now", "open_"),
    [
        # 09:00 in Berlin is 08:00 UTC in winter
        ("Europe/Berlin", "2026-12-07T08:00:00+00:00", True),
        ("Europe/Berlin", "2026-12-07T09:00:00+00:00", False),  # 10:00 Berlin: closed
        ("America/New_York", "2026-12-07T14:00:00+00:00", True),  # 09:00 EST
        ("America/New_York", "2026-12-07T09:00:00+00:00", False),
        # 09:00 Berlin in summer is 07:00 UTC
        ("Europe/Berlin", "2026-07-06T07:30:00+00:00", True),
        ("Europe/Berlin", "2026-07-06T08:00:00+00:00", False),
    ],
)
def test_a_schedule_is_read_in_its_time_zone(tz: str, now: str, open_: bool) -> None:
    assert window_state(w("0 9 * * *", "1h", DENY, tz=tz), at(now)).open is open_


def test_a_window_across_a_dst_change_is_measured_in_real_time() -> None:
    # Berlin falls back on 2026-10-25 03:00 → 02:00: a 01:00 start with 3h ends at 03:00 local
    # (the second time), 02:00 UTC.
    night = w("0 1 * * *", "3h", DENY, tz="Europe/Berlin")
    start = window_state(night, at("2026-10-24T23:30:00+00:00"))  # 01:30 CEST
    assert start.since == datetime(2026, 10, 25, 1, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert start.until == at("2026-10-25T02:00:00+00:00")
    assert not window_state(night, at("2026-10-25T02:00:00+00:00")).open
    # Spring forward (2026-03-29 02:00 → 03:00): a start at 02:30 never happens that day.
    gap = w("30 2 * * *", "30m", DENY, tz="Europe/Berlin")
    assert not window_state(gap, at("2026-03-29T00:45:00+00:00")).open  # 02:45 does not exist: 01:45 CET


def test_a_closed_window_says_when_it_opens_next_in_its_zone() -> None:
    verdict = is_open([w("0 22 * * 1-5", "2h", ALLOW, name="night", tz="Europe/Berlin")], "c", "a", MON_9)
    assert verdict.hold is not None
    assert "'night' opens at 2026-12-07T22:00:00+01:00" in verdict.hold.message
    (state,) = verdict.states
    assert state.to_json()["next_start"] == "2026-12-07T22:00:00+01:00"


# -- config ------------------------------------------------------------------------------


def config_with(kubeconfig: Path, *windows: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": {"url": "https://git.example.com/fleet.git"},
        "clusters": [{"name": "c", "kubeconfig": str(kubeconfig), "path": "p"}],
        "windows": list(windows),
    }


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\n")
    return kc


def test_windows_load_with_their_defaults(kubeconfig: Path) -> None:
    data = config_with(
        kubeconfig,
        {"schedule": "0 22 * * *", "duration": "2h", "kind": "allow"},
        {
            "name": "freeze",
            "schedule": "0 0 20 12 *",
            "duration": "14d",
            "kind": "deny",
            "apps": ["web*"],
            "clusters": ["prod-*"],
            "time_zone": "Europe/Berlin",
        },
    )
    cfg = parse_config(data, base_dir=kubeconfig.parent)
    first, freeze = cfg.windows
    assert (first.label, first.kind, first.duration, first.apps, first.clusters, first.time_zone) == (
        "windows[0]",
        ALLOW,
        7200.0,
        ("*",),
        ("*",),
        "UTC",
    )
    assert (freeze.label, freeze.kind, freeze.duration, freeze.apps) == (
        "freeze",
        DENY,
        14 * 86400.0,
        ("web*",),
    )


@pytest.mark.parametrize(
    ("entry", "key", "error"),
    [
        ({"duration": "1h", "kind": "deny"}, "windows[0].schedule", "required key is missing"),
        ({"schedule": "0 9 * *", "duration": "1h", "kind": "deny"}, "windows[0].schedule", "5 fields"),
        ({"schedule": "", "duration": "1h", "kind": "deny"}, "windows[0].schedule", "must not be empty"),
        ({"schedule": "0 9 * * *", "kind": "deny"}, "windows[0].duration", "required key is missing"),
        ({"schedule": "0 9 * * *", "duration": "30s", "kind": "deny"}, "windows[0].duration", "at least 60s"),
        (
            {"schedule": "0 9 * * *", "duration": "soon", "kind": "deny"},
            "windows[0].duration",
            "invalid duration",
        ),
        ({"schedule": "0 9 * * *", "duration": "1h"}, "windows[0].kind", "required key is missing"),
        ({"schedule": "0 9 * * *", "duration": "1h", "kind": "block"}, "windows[0].kind", "allow, deny"),
        (
            {"schedule": "0 9 * * *", "duration": "1h", "kind": "deny", "time_zone": "Mars/Olympus"},
            "windows[0].time_zone",
            "unknown time zone 'Mars/Olympus'",
        ),
        (
            {"schedule": "0 9 * * *", "duration": "1h", "kind": "deny", "time_zone": "../etc/passwd"},
            "windows[0].time_zone",
            "unknown time zone",
        ),
        (
            {"schedule": "0 9 * * *", "duration": "1h", "kind": "deny", "apps": [""]},
            "windows[0].apps[0]",
            "empty",
        ),
        (
            {"schedule": "0 9 * * *", "duration": "1h", "kind": "deny", "cluster": ["x"]},
            "windows[0].cluster",
            "unknown key",
        ),
        (
            {"schedule": "0 9 * * *", "duration": "1h", "kind": "deny", "name": "No"},
            "windows[0].name",
            "DNS label",
        ),
    ],
)
def test_a_bad_window_is_a_config_error_naming_the_key(
    kubeconfig: Path, entry: dict[str, Any], key: str, error: str
) -> None:
    with pytest.raises(ConfigError, match=error) as e:
        parse_config(config_with(kubeconfig, entry), base_dir=kubeconfig.parent)
    assert e.value.path == key


def test_two_windows_of_one_name_are_a_config_error(kubeconfig: Path) -> None:
    entry = {"name": "freeze", "schedule": "0 9 * * *", "duration": "1h", "kind": "deny"}
    with pytest.raises(ConfigError, match="names windows\\[0\\] already") as e:
        parse_config(config_with(kubeconfig, entry, entry), base_dir=kubeconfig.parent)
    assert e.value.path == "windows[1].name"


# -- POST /sync?force_window ----------------------------------------------------------------


def test_post_sync_passes_force_window_only_when_asked_and_only_with_the_token() -> None:
    asked: list[tuple[str, str | None, bool]] = []

    def sync(name: str, app: str | None = None, *, force_window: bool = False) -> tuple[int, dict[str, Any]]:
        asked.append((name, app, force_window))
        return 202, {"cluster": name}

    server = HealthServer(
        "127.0.0.1:0",
        metrics=Metrics(),
        last_tick=time.monotonic,
        ready=lambda: None,
        status=dict,
        sync=sync,
        token="t0ken",
    )
    server.start()
    try:

        def post(query: str, token: str = "t0ken") -> int:
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.port}/sync?{query}",
                method="POST",
                data=b"",
                headers={"Authorization": f"Bearer {token}"} if token else {},
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)

        assert post("cluster=c&force_window=true", token="") == 401
        assert post("cluster=c&force_window=yes") == 400
        assert asked == []
        assert post("cluster=c") == 202
        assert post("cluster=c&app=web&force_window=true") == 202
        assert post("cluster=c&force_window=1") == 202
        assert asked == [("c", None, False), ("c", "web", True), ("c", None, True)]
    finally:
        server.stop()


def test_run_once_table_says_a_pass_was_held_by_a_change_window_and_not_once_it_was_forced() -> None:
    hold = WindowHold(WindowReason.DENY, "freeze", "deny window 'freeze' is open until 08:00")
    held = ClusterResult("dev", "75edf62d4a85", app="web", window=hold)
    (_, row) = format_summary([held]).splitlines()
    assert row.endswith("held by change window freeze: deny window 'freeze' is open until 08:00"), row
    forced = ClusterResult(
        "dev", "75edf62d4a85", app="web", window=WindowHold(**{**vars(hold), "forced": True})
    )
    (_, row) = format_summary([forced]).splitlines()
    assert row.endswith("  ok"), row
