"""``manifests/``: rendered with the pinned kustomize, checked, applied to real API servers.

- Every variant (default, ``namespaced``, ``ha``) renders a complete, hardened install;
  Secrets are referenced, never inlined; a PodDisruptionBudget exists only with replicas >= 2.
- A real apiserver accepts them with server-side apply.
- The probes and port are what ``gitops-agent run`` serves (a running agent is polled).
- The cluster-wide RBAC is enough to apply and prune the sample repository as the agent's
  ServiceAccount; the namespaced RBAC is refused cluster-scoped objects and other namespaces.
- Self-management: bootstrapped once with an admin kubeconfig, the agent then manages its
  own manifests from Git with its own ServiceAccount (pods never start: no kubelet here).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from textwrap import dedent
from typing import Any

import pytest
import yaml

from agent.config.load import load_config
from agent.dev import localcluster
from agent.dev.demo import SAMPLE, commit_directory
from agent.dev.demo import write_config as write_demo_config
from agent.dev.process import LocalCluster
from agent.model import ClusterResult, Outcome
from agent.render.binaries import tool
from tests.agentkit import E2E, Agent, make_repo, unique, write_config
from tests.clusters import ClusterControl, ClusterPool, kubectl
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
CONFIG = MANIFESTS / "base" / "config.toml"
VARIANTS = {
    "default": MANIFESTS,
    "namespaced": MANIFESTS / "namespaced",
    "ha": MANIFESTS / "ha",
    "multi-tenant": MANIFESTS / "multi-tenant",
}
AGENT_NS = "gitops-agent"
SERVICE_ACCOUNT = f"{AGENT_NS}/gitops-agent"
SA_USER = f"system:serviceaccount:{AGENT_NS}:gitops-agent"
#: Verbs the agent never uses: granting them would be privilege for nothing.
NEVER_GRANTED = {"*", "update", "escalate", "bind", "impersonate", "deletecollection"}

Doc = dict[str, Any]


def build(directory: Path) -> list[Doc]:
    out = subprocess.run(
        [str(tool("kustomize")), "build", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def build_text(directory: Path) -> str:
    return yaml.safe_dump_all(build(directory), sort_keys=False)


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def under(path: str, mount: str) -> bool:
    return PurePosixPath(mount) in (PurePosixPath(path), *PurePosixPath(path).parents)


def bound_rules(docs: list[Doc], namespace: str) -> list[Doc]:
    """Rules of the Roles bound to the agent's ServiceAccount in ``namespace``."""
    roles = {
        r["metadata"]["name"]: r for r in of_kind(docs, "Role") if r["metadata"]["namespace"] == namespace
    }
    rules: list[Doc] = []
    for b in of_kind(docs, "RoleBinding"):
        if b["metadata"]["namespace"] != namespace:
            continue
        if {"kind": "ServiceAccount", "name": "gitops-agent", "namespace": AGENT_NS} in b["subjects"]:
            rules += roles[b["roleRef"]["name"]]["rules"]
    return rules


# -- rendered, no cluster -----------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_is_a_complete_hardened_install(variant: str) -> None:
    docs = build(VARIANTS[variant])
    assert AGENT_NS in {n["metadata"]["name"] for n in of_kind(docs, "Namespace")}
    agent_sa = [s for s in of_kind(docs, "ServiceAccount") if s["metadata"]["name"] == "gitops-agent"]
    assert [s["metadata"]["namespace"] for s in agent_sa] == [AGENT_NS]
    assert not of_kind(docs, "Secret"), "credentials are referenced, never inlined"
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gitops-agent"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}

    # The config: a ConfigMap generated from base/config.toml, mounted where `run` reads it.
    (cm,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].startswith("gitops-agent-config-")
    ]
    assert cm["data"] == {"config.toml": CONFIG.read_text()}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    config_file = c["args"][c["args"].index("--config") + 1]
    assert mounts[str(PurePosixPath(config_file).parent)] == "config"

    # What the config reads and writes lives on volumes: cache on an emptyDir, credentials
    # in Secrets that the pod references (optional, so a public repo needs none).
    cfg = load_config(CONFIG)
    (cache_mount,) = [m for m, v in mounts.items() if under(cfg.agent.cache_dir, m)]
    assert "emptyDir" in volumes[mounts[cache_mount]]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    (token_mount,) = [m for m, v in mounts.items() if under(cfg.source.auth.token_file, m)]
    secret = volumes[mounts[token_mount]]["secret"]
    assert secret["optional"] is True and secret["secretName"] == "git-credentials"
    kubeconfigs = [m for m, v in mounts.items() if "secret" in volumes[v] and "cluster" in v]
    assert kubeconfigs, "remote clusters' kubeconfigs come from a Secret"
    assert all(volumes[mounts[m]]["secret"]["optional"] is True for m in kubeconfigs)

    # Probes and the metrics Service use the port `[agent] listen` binds; the webhook receiver,
    # which faces the Git host, has a port and a Service of its own, and the metrics Service
    # never exposes it (nor the receiver's Service the metrics).
    port = int(cfg.agent.listen.rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": port, "webhooks": int(cfg.receiver.listen.rpartition(":")[2])}
    assert c["livenessProbe"]["httpGet"]["port"] == c["readinessProbe"]["httpGet"]["port"] == "http"
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    assert set(services) == {"gitops-agent-metrics", "gitops-agent-webhooks"}
    for name, target in (("gitops-agent-metrics", "http"), ("gitops-agent-webhooks", "webhooks")):
        svc = services[name]
        assert [p["targetPort"] for p in svc["spec"]["ports"]] == [target]
        assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()

    # A PodDisruptionBudget only when there is more than one replica to keep.
    replicas = dep["spec"]["replicas"]
    assert replicas == (2 if variant == "ha" else 1)
    pdbs = of_kind(docs, "PodDisruptionBudget")
    assert len(pdbs) == (1 if replicas >= 2 else 0)
    for pdb in pdbs:
        assert pdb["spec"]["minAvailable"] < replicas
        assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]

    # Leases (always on in a cluster) and the ApplySet parent, in the agent's namespace.
    rules = bound_rules(docs, AGENT_NS)
    lease = [r for r in rules if "leases" in r["resources"]]
    assert lease and {"get", "create", "update"} <= set(lease[0]["verbs"])
    assert lease[0]["apiGroups"] == ["coordination.k8s.io"]
    assert any(
        "configmaps" in r["resources"] and {"get", "create", "patch"} <= set(r["verbs"]) for r in rules
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_admits_the_listeners_only_as_its_network_policy_says(variant: str) -> None:
    """The agent's port only from its own namespace and labelled ones; the receiver's from
    anywhere (the Git host, through an Ingress; every request must be signed); nothing else."""
    docs = build(VARIANTS[variant])
    dep = one(docs, "Deployment")
    (policy,) = [p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["namespace"] == AGENT_NS]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]
    rules = {tuple(p["port"] for p in r["ports"]): r for r in spec["ingress"]}
    assert set(rules) == {("http",), ("webhooks",)}
    assert {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]} == {
        "http",
        "webhooks",
    }
    assert "from" not in rules[("webhooks",)]
    assert rules[("http",)]["from"] == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"gitops-agent.io/listener-access": "true"}}},
    ]


def test_the_cluster_wide_install_says_it_is_effectively_cluster_admin_and_names_multi_tenant() -> None:
    rbac = (MANIFESTS / "cluster-rbac" / "rbac-cluster.yaml").read_text()
    assert "cannot make it more powerful" not in rbac
    for needle in ("EFFECTIVELY CLUSTER-ADMIN", "serviceaccounts/token", "kube-system", "admission webhooks"):
        assert needle in rbac, needle
    assert "manifests/multi-tenant" in rbac
    top = (MANIFESTS / "kustomization.yaml").read_text()
    assert "cluster-admin" in top and "manifests/multi-tenant" in top
    assert (
        "recommended install on a cluster shared by teams"
        in (MANIFESTS / "multi-tenant" / "kustomization.yaml").read_text()
    )


def test_cluster_rbac_grants_only_the_verbs_the_agent_uses() -> None:
    docs = build(MANIFESTS)
    role = one(docs, "ClusterRole")
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gitops-agent", "namespace": AGENT_NS}]
    for d in docs:
        for rule in d.get("rules", []):
            # Lease renewal is an update; nothing else is ever replaced.
            allowed = {"update"} if rule.get("resources") == ["leases"] else set()
            assert not (NEVER_GRANTED - allowed) & set(rule["verbs"]), (d["kind"], rule)
    assert {"get", "list", "create", "patch", "delete"} == set(role["rules"][0]["verbs"])


def test_namespaced_variant_has_no_cluster_wide_rights() -> None:
    docs = build(VARIANTS["namespaced"])
    assert not of_kind(docs, "ClusterRole") and not of_kind(docs, "ClusterRoleBinding")
    managed = {b["metadata"]["namespace"] for b in of_kind(docs, "RoleBinding")} - {AGENT_NS}
    assert managed == {"team-apps"}
    assert any(
        {"get", "list", "create", "patch", "delete"} <= set(r["verbs"])
        for r in bound_rules(docs, "team-apps")
    )


def test_multi_tenant_variant_gives_the_agent_no_write_outside_its_namespace() -> None:
    docs = build(VARIANTS["multi-tenant"])
    agent = {"kind": "ServiceAccount", "name": "gitops-agent", "namespace": AGENT_NS}
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
    for b in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        if agent not in b["subjects"]:
            continue
        where = b["metadata"].get("namespace", "")
        ref = b["roleRef"]
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else "", ref["name"])]
        for rule in role["rules"]:
            verbs = set(rule["verbs"])
            if where == AGENT_NS:
                continue  # its inventories, Leases, Events
            assert verbs <= {"get", "impersonate"}, (b["metadata"], rule)
            if "impersonate" in verbs:
                # Only a tenant's named account, and only through a binding in that namespace.
                assert where and rule["resources"] == ["serviceaccounts"] and rule.get("resourceNames"), rule
            if b["kind"] == "ClusterRoleBinding":
                assert rule.get("resourceNames") or rule.get("nonResourceURLs"), rule


# -- on a real API server -------------------------------------------------------


def apply_file(kubeconfig: Path, tmp_path: Path, text: str, *extra: str) -> str:
    f = tmp_path / f"manifests-{unique('m')}.yaml"
    f.write_text(text)
    return kubectl(kubeconfig, "apply", "--server-side", "--field-manager=installer", "-f", str(f), *extra)


def get(kubeconfig: Path, *args: str) -> Doc:
    return json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))  # type: ignore[no-any-return]


def exists(kubeconfig: Path, *args: str) -> bool:
    out = kubectl(kubeconfig, "get", *args, "--ignore-not-found", "-o", "name")
    return bool(out.strip())


@pytest.mark.cluster
def test_manifests_are_accepted_by_server_side_apply(tmp_path: Path, fresh_cluster: Any) -> None:
    c: LocalCluster = fresh_cluster()
    docs = build(MANIFESTS)
    out = apply_file(c.kubeconfig, tmp_path, build_text(MANIFESTS))
    assert out.count("serverside-applied") == len(docs), out
    for d in docs:
        ns = ["-n", d["metadata"]["namespace"]] if d["metadata"].get("namespace") else []
        assert exists(c.kubeconfig, d["kind"], d["metadata"]["name"], *ns), d["kind"]
    dep = get(c.kubeconfig, "deployment", "gitops-agent", "-n", AGENT_NS)
    assert dep["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The variants too: ha as a server-side dry run (the checks run, nothing is stored);
    # namespaced and multi-tenant for real, since their Roles live in namespaces they create.
    out = apply_file(c.kubeconfig, tmp_path, build_text(VARIANTS["ha"]), "--dry-run=server")
    assert out.count("serverside-applied") == len(build(VARIANTS["ha"])), out
    out = apply_file(c.kubeconfig, tmp_path, build_text(VARIANTS["namespaced"]))
    assert out.count("serverside-applied") == len(build(VARIANTS["namespaced"])), out
    assert exists(c.kubeconfig, "rolebinding", "gitops-agent", "-n", "team-apps")
    out = apply_file(c.kubeconfig, tmp_path, build_text(VARIANTS["multi-tenant"]))
    assert out.count("serverside-applied") == len(build(VARIANTS["multi-tenant"])), out
    # Applying again changes nothing and is accepted.
    apply_file(c.kubeconfig, tmp_path, build_text(MANIFESTS))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # loopback only
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def adapted_config(tmp_path: Path, repo: Path, kubeconfig: Path, *, listen: str, name: str) -> Path:
    """manifests/base/config.toml with what only exists in a pod swapped for local things."""
    text = CONFIG.read_text()
    swaps = {
        'name = "gitops-agent"': f'name = "{name}"',
        'cache_dir = "/var/cache/gitops-agent/work"': f'cache_dir = "{tmp_path / "cache"}"',
        'listen = "0.0.0.0:8080"': f'listen = "{listen}"',
        'listen = "0.0.0.0:9090"': f'listen = "127.0.0.1:{free_port()}"',
        'url = "https://git.example.com/platform/fleet.git"': f'url = "{repo}"',
        'token_file = "/var/run/secrets/gitops-agent/git/token"': 'token_file = ""',
        "in_cluster = true": f'kubeconfig = "{kubeconfig}"',
    }
    for old, new in swaps.items():
        assert text.count(old) == 1, f"manifests/base/config.toml no longer has {old!r}"
        text = text.replace(old, new)
    path = tmp_path / "in-cluster.toml"
    path.write_text(text)
    return path


@pytest.fixture
def agent_process(e2e: E2E) -> Iterator[list[subprocess.Popen[str]]]:
    """Agent processes the test starts, killed after it if still running (before ``e2e`` deletes
    their namespaces, which a running agent would create again)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.mark.cluster
def test_probe_paths_and_port_are_the_ones_the_running_agent_serves(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, agent_process: list[subprocess.Popen[str]]
) -> None:
    a = cluster_pool["pool-a"]
    ns = e2e.namespace("probe")
    repo = make_repo(
        tmp_path,
        {
            "clusters/in-cluster/app.yaml": f"""
                apiVersion: v1
                kind: Namespace
                metadata:
                  name: {ns}
                ---
                apiVersion: v1
                kind: ConfigMap
                metadata:
                  name: settings
                  namespace: {ns}
                data:
                  greeting: hello
                """
        },
    )
    port = free_port()
    cfg = adapted_config(tmp_path, repo.path, a.kubeconfig, listen=f"127.0.0.1:{port}", name=unique("probe"))
    log = tmp_path / "agent.log"
    with log.open("w") as out:  # a file, not a pipe: nobody reads it while the agent runs
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    agent_process.append(proc)
    base = f"http://127.0.0.1:{port}"

    def first_pass_done() -> Doc | None:
        assert proc.poll() is None, log.read_text()
        try:
            code, body = http_get(base + "/status")
            status: Doc = json.loads(body)
        except (OSError, ValueError):
            return None
        return status if code == 200 and status["clusters"][0]["result"] != "pending" else None

    status = wait_for("the agent's first pass", first_pass_done, 90, interval=0.3)
    assert status["clusters"][0]["result"] == "ok", (status, log.read_text()[-3000:])

    dep = one(build(MANIFESTS), "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get_ = c[probe]["httpGet"]
        assert ports[get_["port"]] == int(load_config(CONFIG).agent.listen.rpartition(":")[2])
        code, body = http_get(base + get_["path"])
        assert code == 200, (probe, get_["path"], code, body)
    code, body = http_get(base + "/metrics")
    assert code == 200 and "gitops_agent_reconcile_total" in body
    assert http_get(base + "/no-such-path")[0] == 404  # a wrong probe path would be caught
    assert get(a.kubeconfig, "configmap", "settings", "-n", ns)["data"] == {"greeting": "hello"}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()[-3000:]


def install(c: LocalCluster, tmp_path: Path, variant: str) -> None:
    apply_file(c.kubeconfig, tmp_path, build_text(VARIANTS[variant]))


def sa_kubeconfig(cluster_ctl: ClusterControl, c: LocalCluster) -> Path:
    """The agent's ServiceAccount from the manifests, with no binding beyond theirs."""
    kc = cluster_ctl.token(c, SERVICE_ACCOUNT, cluster_role=None)
    out = kubectl(kc, "auth", "whoami", "-o", "json")
    assert json.loads(out)["status"]["userInfo"]["username"] == SA_USER
    return kc


def by_name(result: ClusterResult) -> dict[str, str]:
    return {f"{r.key.kind}/{r.key.name}": r.outcome.value for r in result.results}


def every_app(agent: Agent, cluster: str) -> list[ClusterResult]:
    """One pass; the results of every app of ``cluster`` (the sample serves two apps on demo-a)."""
    return [r for r in agent.fleet.reconcile_all(agent.revision()) if r.cluster == cluster]


@pytest.mark.cluster
def test_cluster_rbac_is_enough_to_apply_and_prune_the_sample_repository(
    tmp_path: Path, fresh_cluster: Any, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    c: LocalCluster = fresh_cluster()
    install(c, tmp_path, "default")
    kc = sa_kubeconfig(cluster_ctl, c)
    repo = tmp_path / "fleet.git"
    commit_directory(repo, SAMPLE / "v1", "v1")
    state = tmp_path / "state"
    state.mkdir()
    agent = e2e.agent(load_config(write_demo_config(state, repo, {"demo-a": kc})))
    first = every_app(agent, "demo-a")
    assert [r.app for r in first] == ["infra", "web"]
    assert all(r.ok for r in first), [(r.app, r.error, by_name(r)) for r in first]
    created = [x for r in first for x in r.results]
    assert all(x.outcome is Outcome.CREATED for x in created) and len(created) >= 5, created
    assert exists(c.kubeconfig, "configmap", "legacy-settings", "-n", "demo")

    commit_directory(repo, SAMPLE / "v2", "v2: drop legacy-settings, add feature-flags")
    second = every_app(agent, "demo-a")
    assert all(r.ok and not r.prune_refused for r in second), [(r.app, r.error, by_name(r)) for r in second]
    outcomes = {name: outcome for r in second for name, outcome in by_name(r).items()}
    assert outcomes["ConfigMap/legacy-settings"] == Outcome.PRUNED
    assert outcomes["ConfigMap/feature-flags"] == Outcome.CREATED
    assert not exists(c.kubeconfig, "configmap", "legacy-settings", "-n", "demo")
    for app in ("infra", "web"):  # each app's own ApplySet parent, readable with the cluster RBAC
        parent = get(c.kubeconfig, "configmap", f"gitops-agent.{app}", "-n", AGENT_NS)
        assert parent["metadata"]["labels"]["applyset.kubernetes.io/id"].startswith("applyset-")


ALLOWED = """
    apiVersion: v1
    kind: ServiceAccount
    metadata:
      name: web
      namespace: team-apps
    ---
    apiVersion: v1
    kind: Service
    metadata:
      name: web
      namespace: team-apps
    spec:
      ports:
        - port: 80
    """
#: Outside the namespaced variant's reach: cluster-scoped kinds, and any other namespace.
REFUSED = {
    ("Namespace", "", "elsewhere"): """
        apiVersion: v1
        kind: Namespace
        metadata:
          name: elsewhere
        """,
    ("ClusterRole", "", "sneaky"): """
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRole
        metadata:
          name: sneaky
        rules: []
        """,
    ("ConfigMap", "default", "settings"): """
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: settings
          namespace: default
        data:
          greeting: hello
        """,
}


@pytest.mark.cluster
def test_namespaced_rbac_is_refused_cluster_scoped_objects_and_other_namespaces(
    tmp_path: Path, fresh_cluster: Any, cluster_ctl: ClusterControl, e2e: E2E
) -> None:
    c: LocalCluster = fresh_cluster()
    install(c, tmp_path, "namespaced")
    kc = sa_kubeconfig(cluster_ctl, c)

    # The API server refuses the ServiceAccount each of these writes, and cluster-wide reads.
    for (kind, _, name), text in REFUSED.items():
        f = tmp_path / f"{kind}-{name}.yaml"
        f.write_text(dedent(text))
        answer = localcluster.kubectl(
            kc, "apply", "--server-side", "--field-manager=probe", "-f", str(f), check=False
        )
        assert answer.returncode != 0 and "forbidden" in answer.stderr.lower(), (kind, answer.stderr)
    for args in (["configmaps", "-A"], ["namespaces"], ["clusterroles"], ["secrets", "-n", "default"]):
        answer = localcluster.kubectl(kc, "get", *args, check=False)
        assert answer.returncode != 0 and "forbidden" in answer.stderr.lower(), (args, answer.stderr)
    assert kubectl(kc, "auth", "can-i", "patch", "deployments", "-n", "team-apps").strip() == "yes"

    # The agent under that identity: what is out of reach is never written; the rest is applied.
    files = {
        "clusters/c/allowed.yaml": ALLOWED,
        "clusters/c/refused.yaml": "---\n".join(REFUSED.values()),
        "clusters/c/team-settings.yaml": REFUSED[("ConfigMap", "default", "settings")].replace(
            "namespace: default", "namespace: team-apps"
        ),
    }
    repo = make_repo(tmp_path, files)
    agent = e2e.agent(write_config(tmp_path, repo, {"c": kc}, agent=unique("ns")))
    result = agent.reconcile()["c"]
    outcomes = {(r.key.kind, r.key.namespace, r.key.name): r for r in result.results}
    for key in REFUSED:
        assert outcomes[key].outcome in (Outcome.FAILED, Outcome.SKIPPED), outcomes[key]
    for key in (
        ("ServiceAccount", "team-apps", "web"),
        ("Service", "team-apps", "web"),
        ("ConfigMap", "team-apps", "settings"),  # a refused namespace leaves only its own unknown
    ):
        assert outcomes[key].outcome is Outcome.CREATED, outcomes[key]
    refused = outcomes[("ConfigMap", "default", "settings")]
    assert refused.outcome is Outcome.SKIPPED, refused
    assert "namespace default" in refused.message and "forbidden" in refused.message.lower(), refused
    assert not exists(c.kubeconfig, "namespace", "elsewhere")
    assert not exists(c.kubeconfig, "clusterrole", "sneaky")
    assert not exists(c.kubeconfig, "configmap", "settings", "-n", "default")
    assert exists(c.kubeconfig, "service", "web", "-n", "team-apps")

    # Within its namespaces it prunes too (one LIST per namespace when a cluster-wide one is refused).
    second = tmp_path / "second"
    own = ALLOWED.replace("web", "api")  # objects of its own: the first agent's are not adopted
    repo2 = make_repo(second, {"clusters/c/allowed.yaml": own})
    agent2 = e2e.agent(write_config(second, repo2, {"c": kc}, agent=unique("ns")))
    first = agent2.reconcile()["c"]
    assert first.ok and first.count(Outcome.CREATED) == 2, (first.error, by_name(first))
    repo2.commit({"clusters/c/allowed.yaml": own.split("---")[1]}, "drop the ServiceAccount")
    after = agent2.reconcile()["c"]
    assert after.ok, (after.error, by_name(after))
    assert by_name(after)["ServiceAccount/api"] == Outcome.PRUNED
    assert not exists(c.kubeconfig, "serviceaccount", "api", "-n", "team-apps")


def run_once(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "run", "--once", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def self_config(tmp_path: Path, repo: Path, kubeconfig: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        "\n".join(
            [
                "[agent]",
                f'cache_dir = "{tmp_path / name}"',
                'listen = ""',
                "[source]",
                f'url = "{repo}"',
                "[[clusters]]",
                'name = "in-cluster"',
                f'kubeconfig = "{kubeconfig}"',
                'path = "deploy/gitops-agent"',
            ]
        )
    )
    return path


@pytest.mark.cluster
def test_self_management_the_agent_reconciles_its_own_manifests_from_git(
    tmp_path: Path, fresh_cluster: Any, cluster_ctl: ClusterControl
) -> None:
    """The bootstrap of docs/self-management.md, then the agent's own identity takes over."""
    c: LocalCluster = fresh_cluster()
    work = tmp_path / "work"
    shutil.copytree(MANIFESTS, work / "deploy" / "gitops-agent")
    repo = tmp_path / "fleet.git"
    commit_directory(repo, work, "gitops-agent manages itself")

    # 1. Bootstrap from a workstation: same agent name, an admin kubeconfig, one pass.
    boot = run_once(self_config(tmp_path, repo, c.kubeconfig, "bootstrap"))
    assert boot.returncode == 0, boot.stdout + boot.stderr
    docs = build(MANIFESTS)
    for d in docs:
        ns = ["-n", d["metadata"]["namespace"]] if d["metadata"].get("namespace") else []
        live = get(c.kubeconfig, d["kind"], d["metadata"]["name"], *ns)
        assert live["metadata"]["labels"]["applyset.kubernetes.io/part-of"].startswith("applyset-"), d["kind"]

    # 2. From then on, as the Deployment would: its ServiceAccount, its RBAC from Git.
    kc = sa_kubeconfig(cluster_ctl, c)
    in_cluster = self_config(tmp_path, repo, kc, "in-cluster")
    steady = run_once(in_cluster)
    assert steady.returncode == 0, steady.stdout + steady.stderr
    row = next(line for line in steady.stdout.splitlines() if line.startswith("in-cluster")).split()
    # applied, unchanged, yielded, pruned, failed
    assert row[2:7] == ["0", str(len(docs)), "0", "0", "0"], steady.stdout

    # 3. A config change in Git: new generated ConfigMap, Deployment rolled, old one pruned.
    old_cm = one(docs, "ConfigMap")["metadata"]["name"]
    config = work / "deploy" / "gitops-agent" / "base" / "config.toml"
    config.write_text(
        config.read_text().replace('log_format = "json"', 'log_format = "json"\nlog_level = "debug"')
    )
    commit_directory(repo, work, "debug logs")
    change = run_once(in_cluster)
    assert change.returncode == 0, change.stdout + change.stderr
    row = next(line for line in change.stdout.splitlines() if line.startswith("in-cluster")).split()
    # APPLIED 2 (ConfigMap created + Deployment configured), PRUNED 1 (after UNCHANGED, YIELDED).
    assert row[2] == "2" and row[5] == "1", change.stdout
    assert not exists(c.kubeconfig, "configmap", old_cm, "-n", AGENT_NS)
    dep = get(c.kubeconfig, "deployment", "gitops-agent", "-n", AGENT_NS)
    new_cm = next(
        v["configMap"]["name"] for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"
    )
    assert new_cm != old_cm
    assert "debug" in get(c.kubeconfig, "configmap", new_cm, "-n", AGENT_NS)["data"]["config.toml"]
