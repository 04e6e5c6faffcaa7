"""Health settings: `wait`, `health_timeout`, `health_debounce` in [defaults], [[clusters]] and [[apps]]."""

from __future__ import annotations

from typing import Any

import pytest

from agent.config.health_checks import Wait, WaitRef
from agent.config.load import parse_config
from agent.config.types import APP_SETTING_KEYS, CLUSTER_DEFAULTS
from agent.errors import ConfigError
from agent.model import ObjectKey


def config(cluster: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {
        "source": {"url": "https://git.example.com/fleet.git"},
        "clusters": [{"name": "c", "in_cluster": True, "path": "p", **(cluster or {})}],
        **top,
    }


def test_by_default_nothing_is_waited_for_five_minutes_at_most_with_a_thirty_second_debounce() -> None:
    s = parse_config(config()).apps[0].settings
    assert s.wait == Wait() and not s.wait
    assert (
        (s.health_timeout, s.health_debounce)
        == (300.0, 30.0)
        == (
            CLUSTER_DEFAULTS.health_timeout,
            CLUSTER_DEFAULTS.health_debounce,
        )
    )
    assert {"wait", "health_timeout", "health_debounce"} <= APP_SETTING_KEYS


def test_settings_merge_defaults_then_cluster_then_app_down_to_seconds() -> None:
    data = config(
        {"health_timeout": "20s"},
        defaults={"wait": True, "health_debounce": "2s"},
        apps=[
            {"name": "web", "cluster": "c", "path": "q", "wait": ["Deployment/web"], "health_debounce": "0s"}
        ],
    )
    own, web = parse_config(data).apps
    assert (own.settings.wait, own.settings.health_timeout, own.settings.health_debounce) == (
        Wait(every=True),
        20.0,
        2.0,
    )
    assert (web.settings.wait, web.settings.health_timeout, web.settings.health_debounce) == (
        Wait(refs=(WaitRef("Deployment", "web"),)),
        20.0,
        0.0,
    )


def test_wait_entries_name_a_kind_its_group_a_namespace_and_a_name() -> None:
    data = config(
        {"wait": ["Deployment/web", "Deployment.apps/shop/web", "Certificate.cert-manager.io/shop/tls"]}
    )
    wait = parse_config(data).apps[0].settings.wait
    assert wait.refs == (
        WaitRef("Deployment", "web"),
        WaitRef("Deployment", "web", "apps", "shop"),
        WaitRef("Certificate", "tls", "cert-manager.io", "shop"),
    )
    assert [str(r) for r in wait.refs] == [
        "Deployment/web",
        "Deployment.apps/shop/web",
        "Certificate.cert-manager.io/shop/tls",
    ]
    assert wait.includes(ObjectKey("apps", "Deployment", "other", "web"))  # no namespace: any
    assert wait.includes(ObjectKey("extensions", "Deployment", "shop", "web"))  # no group: any
    assert not wait.includes(ObjectKey("apps", "StatefulSet", "shop", "web"))
    assert wait.includes(ObjectKey("cert-manager.io", "Certificate", "shop", "tls"))
    assert not wait.includes(ObjectKey("cert-manager.io", "Certificate", "other", "tls"))
    assert not wait.includes(ObjectKey("example.com", "Certificate", "shop", "tls"))
    assert Wait(every=True).includes(ObjectKey("", "ConfigMap", "x", "y"))
    assert not Wait().includes(ObjectKey("", "ConfigMap", "x", "y"))


def test_wait_entries_that_name_nothing_the_app_applies_are_found() -> None:
    wait = parse_config(config({"wait": ["Deployment/web", "Job.batch/shop/migrat"]})).apps[0].settings.wait
    applied = [ObjectKey("apps", "Deployment", "shop", "web"), ObjectKey("batch", "Job", "shop", "migrate")]
    assert wait.unmatched(applied) == (WaitRef("Job", "migrat", "batch", "shop"),)
    assert Wait(every=True).unmatched([]) == ()


@pytest.mark.parametrize(
    ("value", "where", "says"),
    [
        ("yes", "clusters[0].wait", "expected boolean or array, got string"),
        (["web"], "clusters[0].wait[0]", "must be Kind/name or Kind/namespace/name, got 'web'"),
        (["Deployment/web", 3], "clusters[0].wait[1]", "expected string"),
        (["deployment/web"], "clusters[0].wait[0]", "'deployment' is not a kind"),
        (["Deployment.Apps/web"], "clusters[0].wait[0]", "'Apps' is not an API group"),
        (["Deployment/Shop/web"], "clusters[0].wait[0]", "'Shop' is not a namespace name"),
        (["Deployment/a/b/c"], "clusters[0].wait[0]", "must be Kind/name"),
        (["Deployment//web"], "clusters[0].wait[0]", "must be Kind/name"),
        (["Deployment/web", "Deployment/web"], "clusters[0].wait[1]", "listed twice"),
        ([], "clusters[0].wait", "an empty list waits for nothing"),
    ],
)
def test_a_bad_wait_entry_is_an_error_naming_its_key_path(value: Any, where: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(config({"wait": value}))
    assert (e.value.path, says in e.value.message) == (where, True), str(e.value)


def test_a_bad_wait_entry_in_an_app_names_the_apps_key_path() -> None:
    data = config(apps=[{"name": "web", "cluster": "c", "path": "q", "wait": ["Deployment/ok", "nope"]}])
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert e.value.path == "apps[0].wait[1]"


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("health_timeout", "0s", "must be at least 0.001s"),
        ("health_timeout", 30, "expected string, got integer"),
        ("health_debounce", "soon", "invalid duration"),
    ],
)
def test_bad_health_durations_are_errors_naming_the_key(key: str, value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(config(defaults={key: value}))
    assert e.value.path == f"defaults.{key}" and says in e.value.message, str(e.value)
