"""An app whose chart comes from an OCI registry (the CNCF distribution registry on loopback,
charts pushed with `helm push`), on a real API server: installed at the newest tag its
constraint allows, upgraded when a matching version is pushed and not when another one is; a
registry that refuses the credentials, is down, or (``verify = true``) serves an unsigned or
tampered chart fails the app with reason `chart`, and nothing is applied or pruned."""

from __future__ import annotations

from pathlib import Path

from agent.model import FailureReason
from agent.reconcile.charts import of_app
from agent.run.due import DueReason
from tests.agentkit import E2E, make_repo
from tests.clusters import ClusterPool, kubectl
from tests.ociregistry import Registry, cosign_key_pair
from tests.test_charts_repository import TIMING, Pass, config, configmap


def entry(registry: Registry, *lines: str) -> str:
    return "\n".join(["[[helm_repositories]]", f'url = "oci://{registry.host}"', "plain_http = true", *lines])


def test_an_oci_chart_installs_at_its_constraint_and_follows_matching_tags_only(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("oci")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: from-git\n"})
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        for v in ("1.0.0", "1.1.0", "2.0.0"):
            registry.push("web", v)
        cfg = config(tmp_path, git, cluster.kubeconfig, ns, registry.url, "1.x", entry(registry))
        agent = Pass(cfg, e2e)
        first = agent.poll()
        result = agent.run(first)
        assert result.ok, result.error  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) == {
            "version": "1.1.0",
            "greeting": "from-git",
            "replicas": "3",
        }
        pin = first.charts[0]
        assert result.chart == str(pin) == f"web@1.1.0 (sha256:{pin.digest[:12]})"  # type: ignore[attr-defined]
        assert agent.due(first) == ()

        # A version the constraint does not allow: the same revision of the app, nothing due.
        registry.push("web", "2.1.0")
        unchanged = agent.poll()
        assert of_app(unchanged, agent.app) == of_app(first, agent.app)
        assert agent.due(unchanged) == ()

        # A matching version: a new revision of the app at the same commit, due, rolled out.
        registry.push("web", "1.2.0")
        upgraded = agent.poll()
        assert upgraded.sha == first.sha and of_app(upgraded, agent.app) != of_app(first, agent.app)
        decision = agent.fleet.schedule("pool-a", {"default": upgraded}, TIMING)
        assert decision.due == ("web",) and decision.apps[0].reason is DueReason.NEW_REVISION
        assert agent.run(upgraded).ok  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns)["version"] == "1.2.0"  # type: ignore[index]
        requests = agent.charts.fetcher.requests
        requests.clear()
        agent.poll()  # unchanged: one request for the tag list, no manifest, no download
        assert list(requests) == [f"GET http://{registry.host}/v2/charts/web/tags/list"]

    # The registry is down: the app fails with reason `chart` naming it; nothing is pruned.
    result = agent.run(agent.poll())
    assert result.reason is FailureReason.CHART  # type: ignore[attr-defined]
    assert registry.url in result.error and "'1.x'" in result.error  # type: ignore[attr-defined]
    assert "unreachable" in result.error and "web@1.2.0" in result.error  # type: ignore[attr-defined]
    assert configmap(cluster.kubeconfig, ns)["version"] == "1.2.0"  # type: ignore[index]


def test_a_registry_refusing_the_credentials_fails_the_app_before_anything_is_applied(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("oci")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: private\n"})
    registry = Registry(tmp_path / "registry")
    secret = tmp_path / "password"
    secret.write_text("wrong\n")
    with registry.serve(username="agent", password="s3cret"):
        registry.push("web", "0.3.0")
        creds = entry(registry, 'username = "agent"', f'password_file = "{secret}"')
        agent = Pass(config(tmp_path, git, cluster.kubeconfig, ns, registry.url, "", creds), e2e)
        refused = agent.run(agent.poll())
        assert refused.reason is FailureReason.CHART  # type: ignore[attr-defined]
        assert "unauthorized" in refused.error and "wrong" not in refused.error  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) is None
        secret.write_text("s3cret\n")  # read at every fetch: no restart
        assert agent.run(agent.poll()).ok  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns) == {
            "version": "0.3.0",
            "greeting": "private",
            "replicas": "3",
        }


def test_with_verify_a_signed_chart_is_installed_and_an_unsigned_or_tampered_one_refused(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    cluster = cluster_pool["pool-a"]
    ns = e2e.namespace("oci")
    kubectl(cluster.kubeconfig, "create", "namespace", ns)
    git = make_repo(tmp_path, {"values/web.yaml": "greeting: signed\n"})
    key, public = cosign_key_pair(tmp_path / "keys", "key-password")
    other, _ = cosign_key_pair(tmp_path / "other-keys", "other")
    registry = Registry(tmp_path / "registry")
    with registry.serve():
        registry.sign("web", registry.push("web", "1.0.0"), key, "key-password")
        trust = entry(registry, "verify = true", f'cosign_public_key_file = "{public}"')
        agent = Pass(config(tmp_path, git, cluster.kubeconfig, ns, registry.url, "1.x", trust), e2e)
        signed = agent.run(agent.poll())
        assert signed.ok, signed.error  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns)["version"] == "1.0.0"  # type: ignore[index]
        requests = agent.charts.fetcher.requests
        requests.clear()
        agent.poll()  # verified once: the unchanged poll is the tag list alone
        assert list(requests) == [f"GET http://{registry.host}/v2/charts/web/tags/list"]

        def refused(why: str) -> None:
            result = agent.run(agent.poll())
            assert result.reason is FailureReason.CHART, result  # type: ignore[attr-defined]
            assert "signature" in result.error and why in result.error  # type: ignore[attr-defined]
            assert "web@1.0.0" in result.error  # type: ignore[attr-defined]
            assert configmap(cluster.kubeconfig, ns)["version"] == "1.0.0"  # type: ignore[index]

        registry.push("web", "1.1.0")  # unsigned
        refused("is not signed")
        registry.sign("web", registry.push("web", "1.2.0"), other, "other")  # another key's signature
        refused("does not verify")
        # Signed, then the tag re-pushed with other content before the agent reads it.
        registry.sign("web", registry.push("web", "1.3.0"), key, "key-password")
        registry.push("web", "1.3.0", data="tampered")
        refused("is not signed")
        registry.sign("web", registry.push("web", "1.4.0"), key, "key-password")
        assert agent.run(agent.poll()).ok  # type: ignore[attr-defined]
        assert configmap(cluster.kubeconfig, ns)["version"] == "1.4.0"  # type: ignore[index]
