"""Re-adopt, don't recreate (docs/safety.md rule 8), after the two shapes a restore takes.

In place: managedFields stripped (``[{}]`` through a plain patch) and
ownerReferences removed on 50 applied objects, a foreign label added — the
next pass takes back only Git's paths: same UIDs, no delete event, the label
kept, our Apply entry back. Re-created: 10 objects deleted and created again
from their saved manifests by ``velero`` — re-adopted without deletion, and a
later Git change to them is applied.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.dev import localcluster
from agent.model import Outcome
from agent.render.binaries import tool
from tests.agentkit import E2E, make_repo, write_config
from tests.clusters import ClusterPool, kubectl

pytestmark = pytest.mark.cluster


def objects(ns: str, n: int, value: str = "v1") -> dict[str, str]:
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"]
    docs += [
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        f"  name: cm{i:02d}\n  namespace: {ns}\ndata:\n  k: {value}\n"
        for i in range(n)
    ]
    return {"clusters/pool-a/objects.yaml": "---\n".join(docs)}


def list_cms(kubeconfig: Path, ns: str) -> dict[str, dict[str, Any]]:
    out = json.loads(
        kubectl(kubeconfig, "get", "configmaps", "-n", ns, "-o", "json", "--show-managed-fields")
    )
    return {i["metadata"]["name"]: i for i in out["items"] if i["metadata"]["name"].startswith("cm")}


class DeleteWatch:
    """``kubectl get --watch`` on a namespace's ConfigMaps for the ``with`` block: ``deleted`` names
    every ConfigMap deleted meanwhile.

    kubectl lists first and then watches from that listing's resourceVersion, so once the listing
    is printed no later event can be missed, however late the watch connects. At the end a
    sentinel ConfigMap is created and awaited: every event before it has been delivered too.
    """

    SENTINEL = "watch-sentinel"  # not a name ``list_cms`` returns

    def __init__(self, kubeconfig: Path, ns: str) -> None:
        self.kubeconfig, self.ns = kubeconfig, ns
        self.deleted: list[str] = []
        self._listed, self._caught_up = threading.Event(), threading.Event()
        self.proc = subprocess.Popen(
            [
                str(tool("kubectl")),
                "--kubeconfig",
                str(kubeconfig),
                "get",
                "configmaps",
                "-n",
                ns,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> DeleteWatch:
        self._reader.start()
        if not self._listed.wait(30):
            self._stop()
            raise AssertionError(f"kubectl printed no listing of {self.ns} within 30s")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                kubectl(self.kubeconfig, "create", "configmap", self.SENTINEL, "-n", self.ns)
                assert self._caught_up.wait(30), "the watch did not deliver the sentinel within 30s"
        finally:
            self._stop()

    def _stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # one event a line: {"type": ..., "object": ...}
            event = json.loads(line)
            name = event["object"]["metadata"]["name"]
            if event["type"] == "DELETED":
                self.deleted.append(name)
            if name == self.SENTINEL:
                self._caught_up.set()
            self._listed.set()


def test_readopt_in_place_after_managed_fields_and_owner_references_were_stripped(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("restore")
    repo = make_repo(tmp_path, objects(ns, 50))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    manager = agent.config.agent.name
    assert agent.reconcile()["pool-a"].count(Outcome.CREATED) == 51
    before = list_cms(a.kubeconfig, ns)
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "cm00",
        "uid": before["cm00"]["metadata"]["uid"],
    }
    for name in before:
        # What a restore leaves: no managedFields, no ownerReferences, plus someone's label.
        kubectl(
            a.kubeconfig,
            "patch",
            "configmap",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"ownerReferences": [owner]}}),
        )
        kubectl(
            a.kubeconfig,
            "patch",
            "configmap",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps(
                {
                    "metadata": {
                        "managedFields": [{}],
                        "ownerReferences": None,
                        "labels": {"restored-by": "velero"},
                    }
                }
            ),
        )
    stripped = list_cms(a.kubeconfig, ns)
    assert all(
        manager not in {e["manager"] for e in o["metadata"].get("managedFields", [])}
        for o in stripped.values()
    )

    with DeleteWatch(a.kubeconfig, ns) as watch:
        r = agent.reconcile()["pool-a"]
    assert r.ok and r.count(Outcome.CREATED) == 0 and r.count(Outcome.PRUNED) == 0
    assert watch.deleted == []
    after = list_cms(a.kubeconfig, ns)
    for name, obj in after.items():
        meta = obj["metadata"]
        assert meta["uid"] == before[name]["metadata"]["uid"]
        assert meta["labels"]["restored-by"] == "velero"
        assert any(e["manager"] == manager and e["operation"] == "Apply" for e in meta["managedFields"])
    # And converged: the pass after is a no-op.
    assert agent.reconcile()["pool-a"].count(Outcome.UNCHANGED) == 51


def test_readopt_objects_a_restore_tool_recreated_under_its_own_manager(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("restore")
    repo = make_repo(tmp_path, objects(ns, 10))
    agent = e2e.agent(write_config(tmp_path, repo, {"pool-a": a}))
    manager = agent.config.agent.name
    assert agent.reconcile()["pool-a"].ok
    saved = list_cms(a.kubeconfig, ns)
    kubectl(a.kubeconfig, "delete", "configmaps", "-n", ns, *saved)
    for obj in saved.values():
        meta = obj["metadata"]
        clean = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "data": obj["data"],
            "metadata": {"name": meta["name"], "namespace": ns, "labels": meta["labels"]},
        }
        localcluster.kubectl(
            a.kubeconfig, "create", "--field-manager=velero", "-f", "-", stdin=json.dumps(clean)
        )
    recreated = list_cms(a.kubeconfig, ns)
    assert all(recreated[n]["metadata"]["uid"] != saved[n]["metadata"]["uid"] for n in saved)

    with DeleteWatch(a.kubeconfig, ns) as watch:
        r = agent.reconcile()["pool-a"]
    assert watch.deleted == []
    assert r.ok and r.count(Outcome.CREATED) == 0 and r.count(Outcome.PRUNED) == 0
    after = list_cms(a.kubeconfig, ns)
    for name, obj in after.items():
        assert obj["metadata"]["uid"] == recreated[name]["metadata"]["uid"]
        assert any(
            e["manager"] == manager and e["operation"] == "Apply" for e in obj["metadata"]["managedFields"]
        )

    repo.commit(objects(ns, 10, value="v2"))
    changed = agent.reconcile()["pool-a"]
    assert changed.ok and changed.count(Outcome.CONFIGURED) == 10
    assert {o["data"]["k"] for o in list_cms(a.kubeconfig, ns).values()} == {"v2"}
