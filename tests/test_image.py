"""The image, built without a registry and run as a kubelet runs the Deployment (marker ``image``).

``scripts/build-image`` builds it (cached by its inputs; minutes on a fresh machine, so these
tests are outside the default ``pytest`` run: ``scripts/test`` and ``.ci/run`` include them,
``pytest -m image`` runs them alone). ``tests/podkit.py`` runs it with runc as the kubelet
would run ``manifests/``' Deployment against a real local API server: ServiceAccount token
and CA at the in-cluster paths, the config from the rendered ConfigMap, the Git-credential
and cluster-kubeconfig Secret volumes, ``POD_NAME``, uid 65532, a read-only root filesystem,
emptyDirs, host networking, the probes polled, SIGTERM then the grace period.

A missing runc, root or build step fails these tests; they never skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.dev.demo import SAMPLE, commit_directory
from agent.dev.demo import write_config as write_demo_config
from agent.dev.process import LocalCluster
from tests import podkit
from tests.clusters import ClusterControl, kubectl
from tests.gitserver import GitHttpServer, free_port
from tests.test_install_manifests import VARIANTS, build, build_text, exists, get, one
from tests.test_packaging import DOCKERFILE, env_of, parse_dockerfile
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
RECIPE = tomllib.loads((ROOT / "tools" / "image" / "recipe.toml").read_text())
LOCK = ROOT / "tools" / "image" / "requirements.txt"
AGENT_NS = "gitops-agent"
SERVICE_ACCOUNT = f"{AGENT_NS}/gitops-agent"
GIT_TOKEN = "s3cr3t-git-token"
#: What a compiler or a build would need; none of it may be in the image.
BUILD_TOOLS = ("gcc", "cc", "g++", "make", "go", "ld", "as")

pytestmark = [pytest.mark.image, pytest.mark.cluster, pytest.mark.timeout(1800)]

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def archive() -> Path:
    """The image archive: ``scripts/build-image`` (cached; a cold build takes minutes)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "build-image")], capture_output=True, text=True, timeout=1700, check=False
    )
    if out.returncode != 0:
        pytest.fail(f"scripts/build-image failed ({out.returncode}):\n{out.stderr[-4000:]}", pytrace=False)
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def image(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[podkit.Image]:
    """The image unpacked once for the module's pods (read-only to them), removed afterwards."""
    podkit.runc()  # scripts/build-image installed it
    where = tmp_path_factory.mktemp("image")
    try:
        yield podkit.unpack(archive, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)  # ~460 MiB: not kept with the test's other files


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Callable[..., podkit.Pod]]:
    """``pods(image, deployment, **kw)``: pods deleted after the test, whatever happened."""
    made: list[podkit.Pod] = []

    def make(image: podkit.Image, deployment: Doc, **kw: Any) -> podkit.Pod:
        pod = podkit.Pod(image, deployment, tmp_path / f"pod-{len(made)}", **kw)
        made.append(pod)
        return pod

    yield make
    for pod in made:
        pod.delete()


# -- what is in it ----------------------------------------------------------------------------


def installed_packages(rootfs: Path) -> set[str]:
    status = (rootfs / "var" / "lib" / "dpkg" / "status").read_text()
    return {
        m.group(1)
        for m in re.finditer(r"^Package: (\S+)\n(?:[^\n]+\n)*?Status: install ok installed$", status, re.M)
    }


def installed_wheels(rootfs: Path) -> dict[str, str]:
    site = next((rootfs / RECIPE["venv"].lstrip("/")).glob("lib/python3*/site-packages"))
    out = {}
    for meta in site.glob("*.dist-info/METADATA"):
        headers = dict(
            line.split(": ", 1) for line in meta.read_text().split("\n\n")[0].splitlines() if ": " in line
        )
        out[headers["Name"].lower().replace("_", "-")] = headers["Version"]
    return out


def test_the_built_image_holds_what_both_recipes_declare(image: podkit.Image) -> None:
    """Config as the Dockerfile's final stage, Debian's packages, the pinned wheels, the tools."""
    final = parse_dockerfile(DOCKERFILE.read_text()).final
    run = image.run
    assert dict(e.split("=", 1) for e in run["Env"]) == env_of(final)
    assert [run["User"]] == final.all("USER")
    assert [json.dumps(run["Entrypoint"])] == final.all("ENTRYPOINT")
    assert [json.dumps(run["Cmd"])] == final.all("CMD")
    assert [p.split("/")[0] for p in run["ExposedPorts"]] == final.all("EXPOSE")

    rootfs = image.rootfs
    packages = installed_packages(rootfs)
    assert set(RECIPE["apt_packages"]) <= packages
    assert not {"gcc", "g++", "make", "build-essential", "golang", "python3-dev"} & packages
    for d in ("usr/bin", "usr/local/bin", "bin"):
        assert not {t for t in BUILD_TOOLS if (rootfs / d / t).exists()}, d
    assert (rootfs / "usr" / "bin" / "python3").exists() and (rootfs / "usr" / "bin" / "ssh-keygen").exists()

    pins = dict(
        line.split("==") for line in LOCK.read_text().splitlines() if line and not line.startswith("#")
    )
    pins = {k.lower().replace("_", "-"): v for k, v in pins.items()}
    wheels = installed_wheels(rootfs)
    assert {k: wheels.get(k) for k in pins} == pins
    # Beside the pins only the agent, and what `python3 -m venv` puts in every virtualenv.
    assert set(wheels) - set(pins) <= {"gitops-agent", "pip", "setuptools"}, set(wheels) - set(pins)
    site = next((rootfs / RECIPE["venv"].lstrip("/")).glob("lib/python3*/site-packages"))
    assert (site / "agent" / "cli").is_dir() and not (site / "agent" / "dev").exists()

    passwd = (rootfs / "etc" / "passwd").read_text()
    user = RECIPE["user"]
    assert (
        f"{user['name']}:x:{user['uid']}:{user['gid']}::{user['home']}:{user['shell']}" in passwd.splitlines()
    )
    assert f"{user['name']}:x:{user['gid']}:" in (rootfs / "etc" / "group").read_text().splitlines()

    # The tools: every binary scripts/install-control-plane and scripts/install-go-tools give.
    cp = subprocess.run(
        [str(ROOT / "scripts" / "install-control-plane")], capture_output=True, text=True, check=True
    )
    go = subprocess.run(
        [str(ROOT / "scripts" / "install-go-tools")], capture_output=True, text=True, check=True
    )
    bin_dir = Path(cp.stdout.strip().splitlines()[-1])
    wanted = [bin_dir / "kustomize", bin_dir / "helm", *(Path(p) for p in go.stdout.split())]
    tools_dir = rootfs / RECIPE["tools_dir"].lstrip("/")
    for tool in wanted:
        assert (tools_dir / tool.name).read_bytes() == tool.read_bytes(), tool.name
    assert sorted(p.name for p in tools_dir.iterdir()) == sorted(t.name for t in wanted)


# -- run as the Deployment --------------------------------------------------------------------


def install(cluster: LocalCluster, tmp_path: Path, variant: str) -> list[Doc]:
    """``kustomize build <variant> | kubectl apply --server-side``, as the README says; the docs."""
    f = tmp_path / f"install-{variant}.yaml"
    f.write_text(build_text(VARIANTS[variant]))
    kubectl(cluster.kubeconfig, "apply", "--server-side", "--field-manager=installer", "-f", str(f))
    return build(VARIANTS[variant])


def token_of(kubeconfig: Path) -> str:
    return str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])


def on_free_port(docs: list[Doc]) -> tuple[Doc, dict[str, str]]:
    """The Deployment and its ConfigMap's data, moved off ports 8080 and 9090.

    With host networking a pod's port is the machine's; tests running side by side would
    collide there, so each listener of the config (`[agent] listen`, `[receiver] listen`) and
    the containerPort of the same name (`http`, `webhooks`: the probes use `http`) move together.
    """
    deployment = one(docs, "Deployment")
    (cm,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gitops-agent-config")
    ]
    data = dict(cm["data"])
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p for p in c["ports"]}
    assert sorted(ports) == ["http", "webhooks"], ports
    for name, shipped in (("http", 8080), ("webhooks", 9090)):
        port = free_port()
        listen = f'listen = "0.0.0.0:{shipped}"'
        assert data["config.toml"].count(listen) == 1, listen
        data["config.toml"] = data["config.toml"].replace(listen, f'listen = "0.0.0.0:{port}"')
        assert ports[name]["containerPort"] == shipped
        ports[name]["containerPort"] = port
    return deployment, {cm["metadata"]["name"]: data}


def swap(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"manifests/base/config.toml no longer has {old!r}"
    return text.replace(old, new)


def pod_for(
    pods: Callable[..., podkit.Pod],
    image: podkit.Image,
    docs: list[Doc],
    cluster: LocalCluster,
    cluster_ctl: ClusterControl,
    git: GitHttpServer,
    *,
    clusters_toml: str | None = None,
    secrets: dict[str, dict[str, str]] | None = None,
) -> podkit.Pod:
    """The Deployment's pod, with the shipped config pointed at ``git`` (and, if given, clusters)."""
    deployment, config_maps = on_free_port(docs)
    ((cm_name, data),) = config_maps.items()
    text = swap(
        data["config.toml"],
        'url = "https://git.example.com/platform/fleet.git"',
        f'url = "{git.url("fleet.git")}"',
    )
    if clusters_toml is not None:
        head, marker, _ = text.partition("# The cluster the agent runs in")
        assert marker, "manifests/base/config.toml no longer introduces its [[clusters]]"
        text = head + clusters_toml
    config_maps[cm_name] = {"config.toml": text}
    kc = cluster_ctl.token(cluster, SERVICE_ACCOUNT, cluster_role=None)
    sa = podkit.ServiceAccount(token_of(kc), cluster.ca_file.read_bytes(), AGENT_NS)
    return pods(
        image,
        deployment,
        api_server=("127.0.0.1", cluster.ports.apiserver),
        service_account=sa,
        config_maps=config_maps,
        secrets_={"git-credentials": {"token": GIT_TOKEN}, **(secrets or {})},
    )


@pytest.fixture
def git(tmp_path: Path) -> Iterator[GitHttpServer]:
    """A Git server on loopback that wants the token of the git-credentials Secret."""
    root = tmp_path / "git"
    root.mkdir()
    server = GitHttpServer(root, {"x-access-token": GIT_TOKEN}).start()
    yield server
    server.stop()


def first_pass(pod: podkit.Pod, rows: int, timeout: float = 180) -> list[Doc]:
    """The /status rows once every app finished a pass (the pod must keep running)."""

    def done() -> list[Doc] | None:
        assert pod.running(), pod.log()[-4000:]
        code, body = pod.get("/status")
        if code != 200:
            return None
        found: list[Doc] = json.loads(body)["clusters"]
        return found if len(found) == rows and all(r["result"] != "pending" for r in found) else None

    return wait_for("the agent's first pass in the container", done, timeout, interval=0.5)


def log_records(pod: podkit.Pod) -> list[Doc]:
    """The container's output: JSON log lines only (`log_format = "json"` in the shipped config)."""
    records = []
    for line in pod.log().splitlines():
        assert line.startswith("{"), f"not a JSON log line: {line!r}\n{pod.log()[-3000:]}"
        records.append(json.loads(line))
    return records


def assert_isolated_as_the_deployment_says(pod: podkit.Pod) -> None:
    """What the kernel says of the container's first process: user, groups, capabilities, root."""
    pid = pod.init_pid()
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    assert status["Uid"].split() == ["65532"] * 4 and status["Gid"].split() == ["65532"] * 4
    assert status["Groups"].split() == ["65532"]
    assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    mounts = [line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
    root = next(m for m in mounts if m[4] == "/")
    assert "ro" in root[5].split(","), root
    writable = {m[4] for m in mounts if "rw" in m[5].split(",") and m[4].startswith(("/tmp", "/var/cache"))}
    assert writable == {"/tmp", "/var/cache/gitops-agent"}, writable


def stop(pod: podkit.Pod) -> None:
    """SIGTERM as the kubelet sends it: a clean exit well within the grace period."""
    code, took = pod.terminate()
    grace = pod.spec["terminationGracePeriodSeconds"]
    assert code == 0 and took < grace, (code, took, pod.log()[-3000:])


def test_the_image_run_as_the_deployment_reconciles_the_sample_with_the_cluster_rbac_and_stops_on_sigterm(
    image: podkit.Image,
    tmp_path: Path,
    fresh_cluster: Callable[[], LocalCluster],
    cluster_ctl: ClusterControl,
    git: GitHttpServer,
    pods: Callable[..., podkit.Pod],
) -> None:
    here, remote = fresh_cluster(), fresh_cluster()
    docs = install(here, tmp_path, "default")
    commit_directory(git.root / "fleet.git", SAMPLE / "v1", "v1")
    # The sample's two clusters: demo-a is the one the pod runs in (its ServiceAccount and the
    # shipped cluster RBAC), demo-b a remote one through the cluster-kubeconfigs Secret.
    remote_kc = cluster_ctl.token(remote, "gitops-agent/remote")
    secret_path = "/var/run/secrets/gitops-agent/clusters/demo-b.kubeconfig"
    demo = write_demo_config(
        tmp_path, Path("/unused"), {"demo-a": Path("/unused-a"), "demo-b": Path(secret_path)}
    )
    clusters = swap(demo.read_text(), 'kubeconfig = "/unused-a"', "in_cluster = true")
    clusters = clusters[clusters.index("[[clusters]]") :]
    pod = pod_for(
        pods,
        image,
        docs,
        here,
        cluster_ctl,
        git,
        clusters_toml=clusters,
        secrets={"cluster-kubeconfigs": {"demo-b.kubeconfig": remote_kc.read_text()}},
    )
    with podkit.running(pod):
        rows = first_pass(pod, rows=3)
        assert {(r["cluster"], r["app"]) for r in rows} == {
            ("demo-a", "infra"),
            ("demo-a", "web"),
            ("demo-b", "demo-b"),
        }
        assert all(r["result"] == "ok" and r["applied"] > 0 for r in rows), (rows, pod.log()[-4000:])
        for cluster in (here, remote):
            info = get(cluster.kubeconfig, "configmap", "cluster-info", "-n", "demo")
            assert info["metadata"]["labels"]["applyset.kubernetes.io/part-of"].startswith("applyset-")
            assert exists(cluster.kubeconfig, "deployment", "web", "-n", "demo")
        assert get(here.kubeconfig, "configmap", "cluster-info", "-n", "demo")["data"]["cluster"] == "demo-a"
        # Leases, in the namespace of the ServiceAccount mount, held by this pod (POD_NAME).
        leases = get(here.kubeconfig, "leases", "-n", AGENT_NS)["items"]
        holders = {i["spec"].get("holderIdentity", "") for i in leases}
        assert any(h.startswith(pod.name) for h in holders), holders
        assert_isolated_as_the_deployment_says(pod)

        # The probes, at the Deployment's periods: ready once the first poll happened, and alive
        # (a probe before the server listened fails, as on a real node; failureThreshold allows it).
        for probe in ("readinessProbe", "livenessProbe"):
            wait_for(f"a {probe} that succeeds", lambda p=probe: any(pod.probes.ok(p)), 30, interval=0.5)
        threshold = pod.container["livenessProbe"].get("failureThreshold", 3)
        assert not pod.probes.failed("livenessProbe", threshold), pod.probes.answers
        stop(pod)
    records = log_records(pod)
    assert any(r.get("event") == "pass finished" and r.get("cluster") == "demo-b" for r in records)
    assert GIT_TOKEN not in pod.log()
    assert not [r for r in records if r.get("level") in ("error", "critical")], records


REFUSED = """
apiVersion: v1
kind: Namespace
metadata:
  name: elsewhere
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: sneaky
rules: []
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: team-apps
data:
  greeting: hello
"""


def test_the_image_with_the_namespaced_rbac_is_refused_cluster_scoped_objects_with_a_clear_error(
    image: podkit.Image,
    tmp_path: Path,
    fresh_cluster: Callable[[], LocalCluster],
    cluster_ctl: ClusterControl,
    git: GitHttpServer,
    pods: Callable[..., podkit.Pod],
) -> None:
    cluster = fresh_cluster()
    docs = install(cluster, tmp_path, "namespaced")
    work = tmp_path / "fleet"
    (work / "clusters" / "in-cluster").mkdir(parents=True)
    (work / "clusters" / "in-cluster" / "objects.yaml").write_text(REFUSED)
    commit_directory(git.root / "fleet.git", work, "a namespace, a cluster role and a config map")
    pod = pod_for(pods, image, docs, cluster, cluster_ctl, git)  # the shipped config's clusters
    with podkit.running(pod):
        (row,) = first_pass(pod, rows=1)
        assert row["cluster"] == "in-cluster" and row["applied"] == 1, (row, pod.log()[-4000:])
        assert get(cluster.kubeconfig, "configmap", "settings", "-n", "team-apps")["data"] == {
            "greeting": "hello"
        }
        assert not exists(cluster.kubeconfig, "namespace", "elsewhere")
        assert not exists(cluster.kubeconfig, "clusterrole", "sneaky")
        # Said where an operator looks: Warning Events on the app's ApplySet parent.
        events = get(cluster.kubeconfig, "events", "-n", AGENT_NS)["items"]
        unread = [e["message"] for e in events if e["reason"] == "LiveUnknown" and e["type"] == "Warning"]
        assert len(unread) == 2 and all("cluster scope" in m for m in unread), events
        stop(pod)
    # ... and in the log: one warning per object, naming it and the refusal.
    refused = {
        (r["object"].split(".")[0].split("/")[0], r["object"].rsplit("/", 1)[-1]): r["detail"]
        for r in log_records(pod)
        if r.get("event") == "object skipped" and r.get("level") == "warning"
    }
    assert set(refused) == {("Namespace", "elsewhere"), ("ClusterRole", "sneaky")}, refused
    for detail in refused.values():
        assert "forbidden" in detail.lower() and "cluster scope" in detail, detail
