"""Secrets stay secret on real API servers (docs/safety.md rule 11 and the threat model): a
server error that quotes a value decrypted from Git is printed masked by ``run --once`` and
``sync --local``; a loopback service a kustomization names reaches no report and no cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.agentkit import E2E, make_repo
from tests.appkit import toml_value, write_apps_config
from tests.clusters import ClusterPool, kubectl
from tests.leakkit import SECRET, SecretServer
from tests.sopskit import age_key, encrypt

pytestmark = pytest.mark.cluster

#: Not a DNS name: the server refuses it and quotes it (``spec.externalName: Invalid value: "..."``).
VALUE = "Hunter2 Secret!"


def service(ns: str) -> str:
    return (
        f"apiVersion: v1\nkind: Service\nmetadata:\n  name: db\n  namespace: {ns}\n"
        f"spec:\n  type: ExternalName\n  externalName: {VALUE}\n"
    )


@pytest.mark.parametrize("command", [("run", "--once"), ("sync", "--local", "--cluster", "pool-a")])
def test_secret_stays_secret_a_server_error_quoting_a_decrypted_value_is_printed_masked(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, command: tuple[str, ...]
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("sopsmsg")
    key = age_key()
    keyfile = tmp_path / "agekey"
    keyfile.write_text(key.identity + "\n")
    sealed = encrypt(service(ns), key.recipient, encrypted_regex="^externalName$")
    assert VALUE not in sealed
    repo = make_repo(
        tmp_path,
        {
            "app/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n",
            "app/db.yaml": sealed,
        },
    )
    cfg = write_apps_config(tmp_path, repo, a, [{"name": "db", "path": "app"}])
    decryption = f"\n[apps.decryption]\nage_key_file = {toml_value(str(keyfile))}\n"
    file = Path(cfg.file)
    file.write_text(file.read_text() + decryption)
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", *command, "--config", str(file)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    failed = [line for line in out.stdout.splitlines() if "Service/" in line]
    assert failed and "HTTP 422" in failed[0] and 'Invalid value: "***"' in failed[0], out.stdout
    assert VALUE not in out.stdout and VALUE not in out.stderr


def test_secret_stays_secret_a_loopback_service_named_in_a_kustomization_reaches_no_report_nor_cluster(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    """A configMapGenerator reading the agent's own ``/status`` (or any loopback service)."""
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("loopback")
    server = SecretServer()
    e2e.at_end(server.close)
    base = {"app/ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"}
    repo = make_repo(tmp_path, {**base, "app/kustomization.yaml": "resources:\n  - ns.yaml\n"})
    base_sha = repo.commit({**base, "app/kustomization.yaml": "resources:\n  - ns.yaml\n"}, "base")
    leak = (
        f"namespace: {ns}\nresources:\n  - ns.yaml\n"
        f"configMapGenerator:\n  - name: leak\n    files:\n      - status={server.url}/status\n"
    )
    head = repo.commit({**base, "app/kustomization.yaml": leak}, "read a loopback service")
    cfg = write_apps_config(tmp_path, repo, a, [{"name": "web", "path": "app"}])
    cli = [sys.executable, "-m", "agent.cli"]
    diff = subprocess.run(
        [*cli, "diff", "--offline", "--repo", str(repo.path), "--base", base_sha, "--head", head],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    run = subprocess.run(
        [*cli, "run", "--once", "--config", str(cfg.file)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 1 and "remote reference" in run.stdout + run.stderr, run.stdout + run.stderr
    for out in (diff, run):
        assert SECRET not in out.stdout + out.stderr
    assert server.requests == []
    live = kubectl(a.kubeconfig, "get", "configmaps", "-n", ns, "-o", "name", check=False)
    assert "leak" not in live


def test_secret_stays_secret_a_takeover_that_fails_on_a_decrypted_value_prints_it_masked(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("sopstake")
    key = age_key()
    keyfile = tmp_path / "agekey"
    keyfile.write_text(key.identity + "\n")
    # Before the agent: the Service made with client-side kubectl apply, a valid name.
    (tmp_path / "old.yaml").write_text(service(ns).replace(VALUE, "db.example.com"))
    kubectl(a.kubeconfig, "create", "namespace", ns, check=False)
    kubectl(a.kubeconfig, "apply", "-f", str(tmp_path / "old.yaml"))
    sealed = encrypt(service(ns), key.recipient, encrypted_regex="^externalName$")
    repo = make_repo(tmp_path, {"app/db.yaml": sealed})
    cfg = write_apps_config(tmp_path, repo, a, [{"name": "db", "path": "app"}])
    file = Path(cfg.file)
    file.write_text(file.read_text() + f"\n[apps.decryption]\nage_key_file = {toml_value(str(keyfile))}\n")
    args = ["--config", str(file), "--cluster", "pool-a", "--manager", "kubectl-client-side-apply", "--apply"]
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "takeover", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    failed = [line for line in out.stdout.splitlines() if line.startswith("failed")]
    assert failed and 'Invalid value: "***"' in failed[0], out.stdout + out.stderr
    assert VALUE not in out.stdout and VALUE not in out.stderr
