"""``render_memory`` (docs/configuration.md): a byte size per render child, per cluster or app."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.types import DEFAULT_RENDER_MEMORY, Config, implicit_app
from agent.errors import ConfigError
from agent.reconcile.stages import app_render_spec, render_spec

BASE = """
[source]
url = "https://git.example.com/fleet.git"

[defaults]
{defaults}

[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"
{cluster}
"""


def load(tmp_path: Path, defaults: str = "", cluster: str = "") -> Config:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    p = tmp_path / "agent.toml"
    p.write_text(BASE.format(defaults=defaults, cluster=cluster))
    return load_config(p)


def test_render_memory_defaults_to_512_mebibytes_and_reaches_the_render(tmp_path: Path) -> None:
    cfg = load(tmp_path)
    (cluster,) = cfg.clusters
    assert cluster.settings.render_memory == DEFAULT_RENDER_MEMORY == 512 << 20
    assert render_spec(cluster).memory == 512 << 20


@pytest.mark.parametrize(
    ("value", "expected"), [('"1Gi"', 1 << 30), ('"300M"', 300_000_000), ("268435456", 256 << 20)]
)
def test_render_memory_takes_quantity_suffixes_or_bytes(tmp_path: Path, value: str, expected: int) -> None:
    cfg = load(tmp_path, cluster=f"render_memory = {value}")
    (cluster,) = cfg.clusters
    assert cluster.settings.render_memory == expected
    assert app_render_spec(implicit_app(cluster, ())).memory == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [('"lots"', "invalid size 'lots'"), ('"16Mi"', "must be at least 64Mi"), ("true", "expected")],
)
def test_a_bad_render_memory_is_a_config_error_naming_the_key(
    tmp_path: Path, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, defaults=f"render_memory = {value}")
    assert "defaults.render_memory" in str(caught.value) and message in str(caught.value)
