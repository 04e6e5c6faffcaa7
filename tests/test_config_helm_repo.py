"""`[apps.helm] repository`, `version`, `values` and `[[helm_repositories]]` as the loader reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config.load import load_config
from agent.config.types import HelmRepository
from agent.errors import ConfigError

HEAD = """
[source]
url = "https://git.example.com/fleet.git"

[[clusters]]
name = "a"
kubeconfig = "kc"
"""


def load(tmp_path: Path, body: str) -> object:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    p = tmp_path / "agent.toml"
    p.write_text(HEAD + body)
    return load_config(p)


def test_an_app_from_a_chart_repository_needs_no_path_and_keeps_its_values_table(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
[[apps]]
name = "ingress"
cluster = "a"
[apps.helm]
repository = "https://charts.example.com/stable/"
chart = "ingress-nginx"
version = ">=4.1, <5"
values_files = ["ingress/values.yaml"]
[apps.helm.values]
controller = { replicaCount = 2 }

[[helm_repositories]]
url = "https://charts.example.com"
username = "agent"
password_env = "CHARTS_PASSWORD"
max_chart_bytes = "5Mi"
""",
    )
    (app,) = cfg.apps  # type: ignore[attr-defined]
    assert app.paths == ()
    assert app.helm.repository == "https://charts.example.com/stable"
    assert (app.helm.chart, app.helm.version, app.helm.release_name) == (
        "ingress-nginx",
        ">=4.1, <5",
        "ingress",
    )
    assert json.loads(app.helm.values) == {"controller": {"replicaCount": 2}}
    assert cfg.helm_repositories == (  # type: ignore[attr-defined]
        HelmRepository(
            url="https://charts.example.com",
            username="agent",
            password_env="CHARTS_PASSWORD",
            max_chart_bytes=5 << 20,
        ),
    )


def test_a_cluster_entry_with_a_repository_chart_is_an_app_of_its_own(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[clusters.helm]\nrepository = "http://charts.svc"\nchart = "web"\n')
    (app,) = cfg.apps  # type: ignore[attr-defined]
    assert (app.name, app.implicit, app.paths, app.helm.chart) == ("a", True, (), "web")


def test_an_oci_registry_takes_its_docker_config_and_cosign_key(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
[clusters.helm]
repository = "oci://registry.example.com:5000/charts/"
chart = "web"
version = "~1.2"

[[helm_repositories]]
url = "oci://registry.example.com:5000"
docker_config_file = "/etc/agent/docker/config.json"
verify = true
cosign_public_key_file = "/etc/agent/cosign.pub"

[[helm_repositories]]
url = "oci://127.0.0.1:5000"
plain_http = true
""",
    )
    (app,) = cfg.apps  # type: ignore[attr-defined]
    assert app.helm.repository == "oci://registry.example.com:5000/charts"
    signed, local = cfg.helm_repositories  # type: ignore[attr-defined]
    assert (signed.docker_config_file, signed.verify, signed.cosign_public_key_file) == (
        "/etc/agent/docker/config.json",
        True,
        "/etc/agent/cosign.pub",
    )
    assert (local.plain_http, local.verify) == (True, False)


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        (
            '[[helm_repositories]]\nurl = "https://x"\ndocker_config_file = "c.json"\n',
            "docker_config",
            "oci://",
        ),
        ('[[helm_repositories]]\nurl = "https://x"\nplain_http = true\n', "plain_http", "oci://"),
        ('[[helm_repositories]]\nurl = "oci://x"\nverify = true\n', "verify", "cosign_public_key_file"),
        ('[[helm_repositories]]\nurl = "https://x"\nverify = true\n', "verify", "keyring_file"),
        ('[[helm_repositories]]\nurl = "oci://x"\nkeyring_file = "k.gpg"\n', "keyring_file", "http(s)://"),
        (
            '[[helm_repositories]]\nurl = "https://x"\nname = "a"\n'
            '[[helm_repositories]]\nurl = "https://y"\nname = "a"\n',
            "helm_repositories[1].name",
            "already",
        ),
        ('[[helm_repositories]]\nurl = "https://x"\nname = "@a"\n', "name", "not a repository name"),
        (
            '[[helm_repositories]]\nurl = "oci://x"\nusername = "u"\ndocker_config_file = "c"\n',
            "docker_config_file",
            "not both",
        ),
        ('[clusters.helm]\nrepository = "oci:/x"\nchart = "web"\n', "repository", "oci://"),
    ],
)
def test_oci_only_keys_are_errors_elsewhere(tmp_path: Path, body: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, 'path = "p"\n' + body if body.startswith("[[") else body)
    assert key in str(e.value) and message in str(e.value)


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        ('[clusters.helm]\nrepository = "ftp://x"\nchart = "web"\n', "clusters[0].helm.repository", "http"),
        ('[clusters.helm]\nrepository = "https://x"\nchart = "a/b"\n', "clusters[0].helm.chart", "name"),
        (
            '[clusters.helm]\nrepository = "https://x"\nchart = "w"\nversion = "1.x ||"\n',
            "version",
            "constraint",
        ),
        (
            'path = "p"\n[clusters.helm]\nchart = "c"\nversion = "1.x"\n',
            "clusters[0].helm.version",
            "repository",
        ),
        (
            'path = "p"\n[[helm_repositories]]\nurl = "https://x"\npassword_env = "P"\n',
            "username",
            "password",
        ),
        (
            'path = "p"\n[[helm_repositories]]\nurl = "https://x"\n[[helm_repositories]]\nurl = "https://x/"\n',
            "helm_repositories[1].url",
            "already",
        ),
        (
            'path = "p"\n[[helm_repositories]]\nurl = "https://x"\nmax_chart_bytes = "1Ki"\n',
            "max_chart",
            "1Mi",
        ),
    ],
)
def test_bad_chart_settings_are_errors_naming_the_key(
    tmp_path: Path, body: str, key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, body)
    assert key in str(e.value) and message in str(e.value)
