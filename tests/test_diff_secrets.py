"""docs/safety.md rule 11 for diff reports: no Secret value in any format, live or offline.

Values are checked raw, base64-encoded and decoded, and the live Secret was
created by client-side ``kubectl apply`` so its
``kubectl.kubernetes.io/last-applied-configuration`` annotation holds them too.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from agent.cli.diff import diff
from agent.dev.process import LocalCluster
from agent.render.binaries import tool
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl

FORMATS = ("text", "markdown", "json")
OLD = {"password": "old-Pa55word-x1", "user": "olduser-x1"}
NEW = {"password": "new-Pa55word-y2", "user": "newuser-y2"}
TOKEN = "tok-3n-value-z3"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def forbidden() -> list[str]:
    values = [*OLD.values(), *NEW.values(), TOKEN]
    return values + [b64(v) for v in values]


def secret_yaml(ns: str, name: str, string_data: dict[str, str]) -> str:
    body = "".join(f"\n  {k}: {v}" for k, v in string_data.items())
    return f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {ns}\nstringData:{body}\n"


def data_secret_yaml(ns: str) -> str:
    return (
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: api-key\n  namespace: {ns}\n"
        f"data:\n  token: {b64(TOKEN)}\n"
    )


def assert_clean(outputs: dict[str, str]) -> None:
    for fmt, text in outputs.items():
        assert text, fmt
        for value in forbidden():
            assert value not in text, f"{value!r} leaked in the {fmt} report"


def kubectl_apply(cluster: LocalCluster, manifest: str) -> None:
    """Client-side ``kubectl apply`` (the pinned binary): writes the last-applied annotation."""
    subprocess.run(
        [str(tool("kubectl")), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", "-"],
        input=manifest,
        text=True,
        check=True,
        capture_output=True,
    )


@pytest.mark.cluster
def test_secret_values_never_appear_in_a_live_report_in_any_format(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    ns = e2e.namespace("diff-secret")
    a = cluster_pool["pool-a"]
    kubectl(a.kubeconfig, "create", "namespace", ns)
    kubectl_apply(a, secret_yaml(ns, "db", OLD))
    last = kubectl(
        a.kubeconfig,
        "get",
        "secret",
        "db",
        "-n",
        ns,
        "-o",
        "jsonpath={.metadata.annotations.kubectl\\.kubernetes\\.io/last-applied-configuration}",
    )
    assert OLD["password"] in last  # the annotation really holds the value
    files = {
        "clusters/pool-a/secrets.yaml": "---\n".join(
            [
                f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
                secret_yaml(ns, "db", NEW),
                data_secret_yaml(ns),
            ]
        )
    }
    repo = make_repo(tmp_path, files)
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    outputs: dict[str, str] = {}
    for fmt in FORMATS:
        result = CliRunner().invoke(diff, ["--config", cfg.file, "--format", fmt], catch_exceptions=False)
        assert result.exit_code == 1, result.output
        outputs[fmt] = result.stdout + result.stderr
    assert_clean(outputs)
    # The report still says what happens: the Secret is adopted and its keys change.
    assert "*** (before)" in outputs["text"] and "*** (after)" in outputs["text"]
    assert "Secret/" + ns + "/api-key" in outputs["markdown"]


def test_secret_values_never_appear_in_an_offline_report_in_any_format(tmp_path: Path) -> None:
    last_applied = (
        '{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db"},"stringData":'
        f'{{"password":"{OLD["password"]}","user":"{OLD["user"]}"}}}}'
    )
    base_secret = secret_yaml("shop", "db", OLD).replace(
        "metadata:\n",
        "metadata:\n  annotations:\n"
        f"    kubectl.kubernetes.io/last-applied-configuration: '{last_applied}'\n",
    )
    repo = make_repo(tmp_path, {"clusters/one/s.yaml": base_secret})
    base = str(pygit2.Repository(str(repo.path)).head.target)
    repo.commit({"clusters/one/s.yaml": secret_yaml("shop", "db", NEW) + "---\n" + data_secret_yaml("shop")})
    outputs: dict[str, str] = {}
    for fmt in FORMATS:
        result = CliRunner().invoke(
            diff, ["--offline", "--repo", str(repo.path), "--base", base, "--head", "main", "--format", fmt]
        )
        assert result.exit_code == 1, result.output
        outputs[fmt] = result.stdout + result.stderr
    assert_clean(outputs)
    assert "password: '*** (before)'" in outputs["text"] and "password: '*** (after)'" in outputs["text"]
