"""Custom health checks: CEL in Flux's healthCheckExprs shape, compiled with the config; invalid: exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.config.health_checks import Expression, HealthCheck
from agent.config.load import load_config, parse_config
from agent.errors import ConfigError
from agent.model import HealthState
from agent.plan.health import assess

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "health"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())  # type: ignore[no-any-return]


def config(**top: Any) -> dict[str, Any]:
    return {
        "source": {"url": "https://git.example.com/fleet.git"},
        "clusters": [{"name": "c", "in_cluster": True, "path": "p"}],
        **top,
    }


def widget_check(**exprs: str) -> dict[str, str]:
    return {"api_version": "example.com/v1", "kind": "Widget", **exprs}


PHASES = widget_check(
    in_progress="status.phase == 'Provisioning'",
    failed="self.status.phase == 'Error'",
    current="status.phase == 'Running'",
)


def checks_of(data: dict[str, Any], app: int = 0) -> tuple[HealthCheck, ...]:
    return parse_config(data).apps[app].health_checks


def test_a_cel_check_decides_the_health_of_its_kind_instead_of_the_conditions() -> None:
    checks = checks_of(config(health_checks=[PHASES]))
    # The conditions say Ready=False / Stalled=True / Ready=True; the phases decide here.
    assert assess(fixture("widget-not-ready"), checks=checks).state is HealthState.IN_PROGRESS
    assert assess(fixture("widget-stalled"), checks=checks).state is HealthState.FAILED
    ready = assess(fixture("widget-ready"), checks=checks)
    assert ready.state is HealthState.CURRENT
    assert ready.message == "health check current: status.phase == 'Running'"
    # Without the check, the generic rules: Stalled=True is Failed, Ready=False InProgress.
    assert assess(fixture("widget-stalled")).reason == "InvalidSpec"


def test_checks_go_in_progress_then_failed_then_current_else_in_progress() -> None:
    everything = widget_check(in_progress="true", failed="true", current="true")
    assert assess(fixture("widget-ready"), checks=checks_of(config(health_checks=[everything]))).state is (
        HealthState.IN_PROGRESS
    )
    failed_first = widget_check(failed="true", current="true")
    assert assess(fixture("widget-ready"), checks=checks_of(config(health_checks=[failed_first]))).state is (
        HealthState.FAILED
    )
    nothing = widget_check(current="false")
    health = assess(fixture("widget-ready"), checks=checks_of(config(health_checks=[nothing])))
    assert (health.state, health.reason) == (HealthState.IN_PROGRESS, "CheckPending")


def test_a_generation_not_observed_is_in_progress_before_any_expression() -> None:
    checks = checks_of(config(health_checks=[widget_check(current="true")]))
    assert assess(fixture("widget-generation-not-observed"), checks=checks).state is HealthState.IN_PROGRESS


def test_an_expression_that_fails_on_an_object_makes_it_unknown_naming_the_expression() -> None:
    checks = checks_of(config(health_checks=[widget_check(current="status.replicas > 2")]))
    health = assess(fixture("widget-ready"), checks=checks)
    assert health.state is HealthState.UNKNOWN
    assert (
        health.message == "health check current 'status.replicas > 2': no such member in mapping: 'replicas'"
    )
    not_bool = checks_of(config(health_checks=[widget_check(current="status.phase")]))
    assert assess(fixture("widget-ready"), checks=not_bool).message.endswith("gave string, not a boolean")


def test_a_missing_status_reads_as_empty_so_has_guards_work() -> None:
    checks = checks_of(
        config(health_checks=[widget_check(current="has(status.phase) && status.phase == 'Running'")])
    )
    assert assess(fixture("widget-no-status"), checks=checks).state is HealthState.IN_PROGRESS


def test_checks_match_group_and_kind_in_any_version_and_nothing_else() -> None:
    check = checks_of(config(health_checks=[PHASES]))[0]
    other_version = fixture("widget-ready") | {"apiVersion": "example.com/v2"}
    assert check.matches(other_version)
    assert not check.matches(fixture("widget-ready") | {"apiVersion": "other.example.com/v1"})
    assert not check.matches(fixture("deployment-available"))


def test_an_apps_checks_replace_the_global_ones_and_implicit_apps_take_the_global() -> None:
    data = config(
        health_checks=[PHASES],
        apps=[
            {"name": "own", "cluster": "c", "path": "q", "health_checks": [widget_check(current="true")]},
            {"name": "plain", "cluster": "c", "path": "r"},
        ],
    )
    cfg = parse_config(data)
    by_name = {a.name: a.health_checks for a in cfg.apps}
    assert (
        by_name["c"]
        == by_name["plain"]
        == cfg.health_checks
        == (
            HealthCheck(
                "example.com/v1",
                "Widget",
                Expression("status.phase == 'Running'"),
                Expression("status.phase == 'Provisioning'"),
                Expression("self.status.phase == 'Error'"),
            ),
        )
    )
    assert by_name["own"] == (HealthCheck("example.com/v1", "Widget", Expression("true")),)


@pytest.mark.parametrize(
    ("entry", "where", "says"),
    [
        (
            widget_check(current="status.phase =="),
            "health_checks[0].current",
            "syntax error at line 1, column",
        ),
        (widget_check(current="ok", failed="a && (b"), "health_checks[0].failed", "'a && (b'"),
        (widget_check(in_progress=""), "health_checks[0].current", "required key is missing"),
        (widget_check(current=" "), "health_checks[0].current", "empty expression"),
        ({"kind": "Widget", "current": "true"}, "health_checks[0].api_version", "required key is missing"),
        (widget_check(current="true") | {"kind": "widget"}, "health_checks[0].kind", "must be a kind"),
        (
            widget_check(current="true") | {"api_version": "Example/v1"},
            "health_checks[0].api_version",
            "group",
        ),
        (widget_check(current="true", ready="x"), "health_checks[0].ready", "unknown key"),
    ],
)
def test_a_bad_check_is_a_config_error_naming_its_key(entry: dict[str, str], where: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(config(health_checks=[entry]))
    assert e.value.path == where and says in e.value.message, str(e.value)


def test_one_kind_checked_twice_is_an_error_naming_both_entries() -> None:
    with pytest.raises(
        ConfigError, match=r"health_checks\[1\].kind: Widget of example.com/v2 is checked twice"
    ):
        parse_config(config(health_checks=[PHASES, PHASES | {"api_version": "example.com/v2"}]))


def test_an_invalid_expression_exits_2_naming_the_app_and_the_expression(tmp_path: Path) -> None:
    """Issue 18: the config error names the app and the expression; nothing touches a cluster."""
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        """
[source]
url = "https://git.example.com/fleet.git"

[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"

[[apps]]
name = "infra"
cluster = "a"
path = "infra"

[[apps]]
name = "shop"
cluster = "a"
path = "shop"

[[apps.health_checks]]
api_version = "example.com/v1"
kind = "Widget"
current = "status.conditions.exists(c, c.type == 'Ready' &&"
"""
    )
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert (
        "apps[1].health_checks[0].current: invalid CEL expression of app 'shop': "
        "\"status.conditions.exists(c, c.type == 'Ready' &&\": syntax error at line 1, column"
    ) in out.stderr, out.stderr


def test_a_config_with_valid_checks_loads_from_toml(tmp_path: Path) -> None:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        '[source]\nurl = "https://git.example.com/fleet.git"\n\n'
        '[[clusters]]\nname = "a"\nkubeconfig = "kc"\npath = "a"\n\n'
        '[[health_checks]]\napi_version = "example.com/v1"\nkind = "Widget"\n'
        "current = \"status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')\"\n"
    )
    checks = load_config(cfg).apps[0].health_checks
    assert assess(fixture("widget-ready"), checks=checks).state is HealthState.CURRENT
    assert assess(fixture("widget-not-ready"), checks=checks).state is HealthState.IN_PROGRESS
