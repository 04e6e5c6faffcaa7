"""Messages users read: where an object comes from, what the brake wants, what an immutable
field needs, and whose set an object belongs to.

``file#N`` read as a line but was a document index: now ``file:line``, or ``file (document N)``
where a tool's output has no lines. The brake's hint is a command to copy (the real config file
and cluster), and a held prune makes ``run --once`` exit 1. An immutable-field failure is one
line naming the field and the fix, not the server's kilobytes of Go struct. An adoption refusal
names the app whose ApplySet holds the object.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.apply.inventory import applyset_id, parent_name
from agent.cli.main import main
from agent.config.load import load_config
from agent.model import PART_OF, DesiredObject, Outcome, Provenance, SkipReason
from agent.plan.planner import plan_object
from agent.reconcile.stages import ClusterStages
from tests.agentkit import E2E, config_head, make_repo, unique, write_config
from tests.clusters import ClusterPool, kubectl


def test_a_source_reads_file_and_line_or_file_and_document_never_file_hash_index() -> None:
    assert str(Provenance("apps/web.yaml", 2, 26)) == "apps/web.yaml:26"
    assert str(Provenance("chart/templates/svc.yaml", 2)) == "chart/templates/svc.yaml (document 3)"
    assert "#" not in str(Provenance("a.yaml", 0, 1)) + str(Provenance("a.yaml", 0))


def test_an_adoption_refusal_names_the_app_whose_applyset_holds_the_object(tmp_path: Path) -> None:
    agent = unique("msg-agent")
    (tmp_path / "kubeconfig").write_text("unused: nothing here is asked of a cluster\n")
    lines = [*config_head(tmp_path, make_repo(tmp_path, {"a/x.yaml": ""}), agent)]
    lines += ["[[clusters]]", 'name = "prod"', f'kubeconfig = "{tmp_path / "kubeconfig"}"']
    for app in ("web", "shop"):
        lines += ["", "[[apps]]", f'name = "{app}"', 'cluster = "prod"', f'paths = ["{app}"]']
    (tmp_path / "c.toml").write_text("\n".join(lines) + "\n")
    cfg = load_config(tmp_path / "c.toml")
    stages = ClusterStages(cfg, cfg.cluster("prod"))
    ids = {
        a: applyset_id(parent_name(agent, a, implicit=False), cfg.agent.namespace) for a in ("web", "shop")
    }
    options = stages.plan_options(ids["shop"], app=cfg.app("prod", "shop"))
    meta = {"name": "c", "namespace": "shop"}
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    live = {**cm, "metadata": {**meta, "labels": {PART_OF: ids["web"]}, "uid": "u1"}}
    change = plan_object(DesiredObject(cm, Provenance("shop/c.yaml", 0, 1)), live, options)
    assert change.skip is SkipReason.OTHER_SET
    assert f"a member of app 'web' (its ApplySet {ids['web']})" in change.reason, change.reason


def _job(ns: str, image: str) -> str:
    return (
        f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
        f"apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: once\n  namespace: {ns}\nspec:\n"
        "  template:\n    spec:\n      restartPolicy: Never\n"
        f"      containers:\n        - name: c\n          image: {image}\n"
    )


@pytest.mark.cluster
def test_an_immutable_field_change_names_the_field_and_the_fix_in_one_short_line(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("immut-msg")
    repo = make_repo(tmp_path, {"clusters/pool-a/j.yaml": _job(ns, "busybox:1")})
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    assert agent.reconcile()["pool-a"].ok
    repo.commit({"clusters/pool-a/j.yaml": _job(ns, "busybox:2")})
    (res,) = [r for r in agent.reconcile()["pool-a"].results if r.key.kind == "Job"]
    assert res.outcome is Outcome.FAILED
    assert res.message == (
        "immutable field changed: spec.template (field is immutable); annotate the object in Git with "
        "gitops-agent.io/recreate: on-immutable-change to delete and re-create it"
    ), res.message


@pytest.mark.cluster
def test_a_held_prune_exits_1_naming_the_exact_approve_command_which_lifts_it(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("brake-msg")
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\n  namespace: {ns}\ndata: {{k: v}}\n"
    nsdoc = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
    many = {f"clusters/pool-a/c{i}.yaml": doc.format(i=i, ns=ns) for i in range(12)}
    repo = make_repo(tmp_path, {"clusters/pool-a/ns.yaml": nsdoc, **many})
    cfg = write_config(tmp_path, repo, {"pool-a": a})
    runner = CliRunner()
    first = runner.invoke(main, ["run", "--once", "--config", cfg.file])
    assert first.exit_code == 0, first.output
    repo.commit(
        {"clusters/pool-a/ns.yaml": nsdoc, "clusters/pool-a/c0.yaml": many["clusters/pool-a/c0.yaml"]}
    )
    held = runner.invoke(main, ["run", "--once", "--config", cfg.file])
    assert held.exit_code == 1, held.output
    found = re.search(r"`(gitops-agent prune approve [^`]+)`", held.stderr)
    assert found, held.stderr
    command = shlex.split(found.group(1))
    assert command[3:7] == ["--config", cfg.file, "--cluster", "pool-a"], command
    left = json.loads(kubectl(a.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))["items"]
    assert len([c for c in left if c["metadata"]["name"].startswith("c")]) == 12, "nothing deleted"
    approved = runner.invoke(main, command[1:])
    assert approved.exit_code == 0, approved.output
    done = runner.invoke(main, ["run", "--once", "--config", cfg.file])
    assert done.exit_code == 0, done.output
    left = json.loads(kubectl(a.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))["items"]
    assert sorted(c["metadata"]["name"] for c in left if c["metadata"]["name"].startswith("c")) == ["c0"]
