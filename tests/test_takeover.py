"""``gitops-agent takeover`` on a real cluster: leftover managers hand Git's fields over to ours.

Objects made with client-side ``kubectl apply`` (manager
``kubectl-client-side-apply``) and by an old tool keep co-owning the fields the
agent later declares: the server then keeps a field Git drops. The takeover
shows, per object, which Git-declared paths move from which manager (dry run:
nothing written), and with ``--apply`` moves exactly those — never a path Git
does not declare, never one an HPA holds through ``/scale``. Afterwards a
field dropped from Git really goes, and later passes are no-ops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from agent.cli.takeover import takeover
from agent.kube.client import KubeClient
from agent.model import Outcome
from agent.plan.fields import managed_entries, render_path
from tests.agentkit import E2E, make_repo, outcomes, unique, write_config
from tests.clusters import TestNamespace, kubectl

DATA = {"greeting": "hello", "legacy": "old"}


def _objects(ns: str, data: dict[str, str]) -> list[dict[str, Any]]:
    def cm(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns,
                "labels": {"app": name}}, "data": dict(data)}  # fmt: skip

    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}},
    }  # fmt: skip
    return [cm("settings"), cm("control"), deployment]


def _files(ns: str, data: dict[str, str]) -> dict[str, str]:
    return {"clusters/pool-a/app.yaml": yaml.safe_dump_all(_objects(ns, data))}


def _owners(client: KubeClient, kind: str, ns: str, name: str) -> dict[str, set[str]]:
    info = client.resource("apps/v1" if kind == "Deployment" else "v1", kind)
    live = client.get(info, ns, name) or {}
    out: dict[str, set[str]] = {}
    for e in managed_entries(live):
        out.setdefault(e.manager + (f"/{e.subresource}" if e.subresource else ""), set()).update(
            render_path(p) for p in e.paths
        )
    return out


def test_readopt_takeover_moves_only_git_declared_paths_from_leftover_managers(
    tmp_path: Path, namespace: TestNamespace, e2e: E2E
) -> None:
    ns, kc = namespace.name, namespace.cluster.kubeconfig
    client = KubeClient.connect("takeover", kubeconfig=str(kc))
    e2e.at_end(client.close)
    settings, control, deployment = _objects(ns, DATA)
    # Before the agent: client-side kubectl apply, an old tool, and an HPA scaling through /scale.
    (tmp_path / "old.yaml").write_text(yaml.safe_dump_all([settings, deployment]))
    kubectl(kc, "apply", "-f", str(tmp_path / "old.yaml"))
    cm_info, dep_info = client.resource("v1", "ConfigMap"), client.resource("apps/v1", "Deployment")
    client.create(cm_info, control, field_manager="legacy-tool")
    team = {"metadata": {"labels": {"team": "ops"}}}
    client.patch(cm_info, ns, "settings", team, field_manager="kubectl-client-side-apply")
    hpa = {"fieldManager": "kube-controller-manager"}
    client.request("PATCH", dep_info.path(ns, "web") + "/scale", query=hpa, body={"spec": {"replicas": 3}},
                   content_type="application/merge-patch+json")  # fmt: skip

    repo = make_repo(tmp_path, _files(ns, DATA))
    config = write_config(tmp_path, repo, {"pool-a": namespace.cluster}, agent=unique("takeover-agent"))
    ours = config.agent.name
    agent = e2e.agent(config)
    first = agent.reconcile()["pool-a"]
    assert first.ok, (first.error, outcomes(first))
    assert "data.greeting" in _owners(client, "ConfigMap", ns, "settings")["kubectl-client-side-apply"]

    runner = CliRunner()
    args = ["--config", config.file, "--cluster", "pool-a", "--manager", "kubectl-client-side-apply"]
    rv_before = (client.get(client.resource("v1", "ConfigMap"), ns, "settings") or {})["metadata"]
    shown = runner.invoke(takeover, args)
    assert shown.exit_code == 0, shown.output
    assert "dry run" in shown.output and f"ConfigMap/{ns}/settings" in shown.output
    assert f"kubectl-client-side-apply (Update) → {ours}" in shown.output and "data.legacy" in shown.output
    assert "left to kube-controller-manager (scale): spec.replicas" in shown.output
    assert f"ConfigMap/{ns}/control" not in shown.output  # legacy-tool was not named
    rv_after = (client.get(client.resource("v1", "ConfigMap"), ns, "settings") or {})["metadata"]
    assert rv_after["resourceVersion"] == rv_before["resourceVersion"], "a dry run must write nothing"

    done = runner.invoke(takeover, [*args, "--apply"])
    assert done.exit_code == 0, done.output
    assert f"configured ConfigMap/{ns}/settings" in " ".join(done.output.split())
    owners = _owners(client, "ConfigMap", ns, "settings")
    declared = {
        "data.greeting",
        "data.legacy",
        "metadata.labels.app",
        "metadata.labels.applyset.kubernetes.io/part-of",
    }
    assert not (owners.get("kubectl-client-side-apply", set()) & declared), owners
    # Only Git-declared paths moved: the label Git never declared stays with its manager.
    assert "metadata.labels.team" in owners["kubectl-client-side-apply"]
    assert {"data.greeting", "data.legacy", "metadata.labels.app"} <= owners[ours]
    dep_owners = _owners(client, "Deployment", ns, "web")
    assert "spec.replicas" in dep_owners["kube-controller-manager/scale"]
    assert "spec.replicas" not in dep_owners.get(ours, set())
    assert (client.get(dep_info, ns, "web") or {})["spec"]["replicas"] == 3

    calm = {str(r.key): r for r in agent.reconcile()["pool-a"].results}
    assert {calm[f"ConfigMap/{ns}/{n}"].outcome for n in ("settings", "control")} == {Outcome.UNCHANGED}
    # The Deployment differs only in the HPA's replicas, yielded: nothing is sent (apply.py reports a
    # CONFLICT with no body as skipped).
    web = calm[f"Deployment.apps/{ns}/web"]
    assert web.outcome in (Outcome.UNCHANGED, Outcome.SKIPPED) and "yielded" in web.message, web

    # Why it matters: a key dropped from Git now really goes; where the old owner stayed, it stays.
    repo.commit(_files(ns, {"greeting": "hello"}), "drop legacy")
    dropped = agent.reconcile()["pool-a"]
    assert dropped.ok and dropped.count(Outcome.CONFIGURED) == 2, outcomes(dropped)
    assert (client.get(cm_info, ns, "settings") or {})["data"] == {"greeting": "hello"}
    assert (client.get(cm_info, ns, "control") or {})["data"] == DATA  # legacy-tool co-owns it
    again = runner.invoke(takeover, ["--config", config.file, "--cluster", "pool-a"])
    # Without --manager only known leftovers count: legacy-tool is no known name and not the only
    # owner (the agent co-owns), so it is taken over only when named.
    assert again.exit_code == 0, again.output
    assert f"ConfigMap/{ns}/control" not in again.output
    named = runner.invoke(takeover, ["--config", config.file, "--cluster", "pool-a", "--manager", "legacy-*"])
    assert f"legacy-tool (Update) → {ours}" in named.output and "data.greeting" in named.output
    assert "data.legacy" not in named.output, "Git no longer declares it: never taken over"


def test_takeover_detects_leftovers_by_name_and_by_sole_ownership() -> None:
    from agent.plan.fields import ManagedEntry
    from agent.reconcile.takeover import leftover_reason

    def entry(manager: str, op: str = "Update", sub: str = "", paths: Any = frozenset()) -> ManagedEntry:
        return ManagedEntry(manager, op, "v1", sub, paths)

    bfa, csa, velero = entry("before-first-apply"), entry("kubectl-client-side-apply"), entry("velero-server")
    hpa, ours = entry("kube-controller-manager", sub="scale"), entry("agent", "Apply")
    prev = entry(
        "old-agent",
        "Apply",
        paths=frozenset({("f:metadata", "f:labels", "f:applyset.kubernetes.io/part-of")}),
    )
    user = entry("kubectl-label")
    every = [bfa, csa, velero, hpa, ours, prev, user]
    assert all(leftover_reason(e, every, "agent", ()) for e in (bfa, csa, velero, prev))
    assert not any(leftover_reason(e, every, "agent", ()) for e in (hpa, ours, user))
    assert (
        leftover_reason(user, [user, hpa], "agent", ())
        == "the single owner of every field (as a restore leaves it)"
    )
    assert leftover_reason(user, every, "agent", ("kubectl-*",)) == "named with --manager"
    assert leftover_reason(hpa, every, "agent", ("*",)) is None, "a /scale writer is never taken over"
