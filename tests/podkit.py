"""Run the image as a kubelet runs the Deployment's pod, with runc; for ``tests/test_image.py``.

What a kubelet and its container runtime do for a pod, done here by hand from the objects
rendered from ``manifests/``:

- the image: unpacked from the OCI archive ``scripts/build-image`` writes (index, manifest,
  layers, each digest checked); its entrypoint, environment and working directory;
- the container: its args, its env (``fieldRef`` values, ``KUBERNETES_SERVICE_HOST/PORT``);
  its volumes as the kubelet lays them out (ConfigMap and Secret files with their modes and
  the pod's ``fsGroup``, optional Secrets that do not exist as empty directories, emptyDirs,
  the ServiceAccount token, CA and namespace at the standard in-cluster path); its
  securityContext (user, group, fsGroup, read-only root filesystem, no capabilities, no
  privilege escalation) and memory limit;
- host networking, since the local API server listens on loopback (the pod's ports are then
  the machine's: ``containerPort`` is where the probes go);
- the probes, polled at the Deployment's periods; stopping: SIGTERM, then SIGKILL once
  ``terminationGracePeriodSeconds`` have passed.

Not done: seccomp ``RuntimeDefault`` (runc has no default profile), CPU requests, pulls.
runc (Debian's) is the runtime: podman's default crun has been seen refusing setrlimit and
hybrid cgroups on CI machines. ``Pod.delete`` stops and removes everything a pod started;
the container's mounts live in its own mount namespace and end with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

Doc = dict[str, Any]

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: runc's defaults (``runc spec``): what a container sees of /proc, /dev and /sys.
BASE_MOUNTS: list[Doc] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {
        "destination": "/dev",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
    },
    {
        "destination": "/dev/shm",
        "type": "tmpfs",
        "source": "shm",
        "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
    },
    {
        "destination": "/dev/mqueue",
        "type": "mqueue",
        "source": "mqueue",
        "options": ["nosuid", "noexec", "nodev"],
    },
    {
        "destination": "/sys",
        "type": "sysfs",
        "source": "sysfs",
        "options": ["nosuid", "noexec", "nodev", "ro"],
    },
]
MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def runc() -> str:
    """The runtime, or a failed test saying how to get it (never a skip)."""
    if os.geteuid() != 0:
        pytest.fail("running the image needs root (runc)", pytrace=False)
    found = shutil.which("runc")
    if found is None:
        pytest.fail("runc not found: scripts/build-image installs it (apt-get install runc)", pytrace=False)
    return found


# -- the image -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    """An unpacked image: its OCI config and its root filesystem (shared, read-only, by pods)."""

    config: Doc
    rootfs: Path
    manifest: Doc

    @property
    def run(self) -> Doc:
        return self.config["config"]  # type: ignore[no-any-return]


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    algo, _, hexdigest = digest.partition(":")
    f = archive.extractfile(f"blobs/{algo}/{hexdigest}")
    assert f is not None, digest
    data = f.read()
    assert hashlib.sha256(data).hexdigest() == hexdigest, f"blob {digest} does not match its digest"
    return data


def unpack(archive_path: Path, dest: Path) -> Image:
    """Unpack the single image of an OCI archive into ``dest/rootfs``, checking every digest."""
    with tarfile.open(archive_path) as archive:
        index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        manifest = json.loads(_blob(archive, entry["digest"]))
        config = json.loads(_blob(archive, manifest["config"]["digest"]))
        rootfs = dest / "rootfs"
        rootfs.mkdir(parents=True)
        for layer in manifest["layers"]:
            assert layer["mediaType"].endswith("tar+gzip"), layer
            blob = dest / "layer.tar.gz"
            blob.write_bytes(_blob(archive, layer["digest"]))
            subprocess.run(
                ["tar", "--numeric-owner", "-xpzf", str(blob), "-C", str(rootfs)], check=True, timeout=300
            )
            blob.unlink()
    return Image(config, rootfs, manifest)


# -- the pod ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceAccount:
    """What the kubelet mounts at ``SERVICE_ACCOUNT_DIR``: a token, the cluster CA, the namespace."""

    token: str
    ca_crt: bytes
    namespace: str


@dataclass
class ProbeLog:
    """Every probe answer: (probe, HTTP status or 0 when there was none, seconds since start)."""

    answers: list[tuple[str, int, float]] = field(default_factory=list)

    def ok(self, probe: str) -> list[bool]:
        return [200 <= code < 400 for p, code, _ in self.answers if p == probe]

    def failed(self, probe: str, threshold: int) -> bool:
        """The kubelet's verdict: ``threshold`` failures in a row (a liveness probe: restart)."""
        run = 0
        for ok in self.ok(probe):
            run = 0 if ok else run + 1
            if run >= threshold:
                return True
        return False


def _quantity(q: str) -> int:
    for suffix, factor in UNITS.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * factor
    return int(q)


def _write(path: Path, data: bytes, mode: int, gid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chown(path, 0, gid)
    path.chmod(mode)


class Pod:
    """The Deployment's pod on this machine: ``start``, ``probes``, ``terminate``, ``delete``.

    ``config_maps`` and ``secrets`` hold the objects' data by name (what the API server would
    serve the kubelet); a volume of a missing ConfigMap or non-optional Secret is an error, as
    the kubelet would never start the container.
    """

    def __init__(
        self,
        image: Image,
        deployment: Doc,
        workdir: Path,
        *,
        api_server: tuple[str, int],
        service_account: ServiceAccount,
        config_maps: dict[str, dict[str, str]],
        secrets_: dict[str, dict[str, str]],
    ) -> None:
        self.image = image
        self.template: Doc = deployment["spec"]["template"]
        self.spec: Doc = self.template["spec"]
        (self.container,) = self.spec["containers"]
        self.name = f"{deployment['metadata']['name']}-{secrets.token_hex(4)}-{secrets.token_hex(2)}"
        self.namespace: str = deployment["metadata"]["namespace"]
        self.workdir = workdir
        self.api_server = api_server
        self.service_account = service_account
        self.config_maps = config_maps
        self.secrets = secrets_
        self.id = f"gitops-agent-test-{secrets.token_hex(4)}"
        self.state_dir = workdir / "runc"
        self.log_path = workdir / "container.log"
        self.probes = ProbeLog()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop_probing = threading.Event()
        self._prober: threading.Thread | None = None
        self._started = 0.0

    # -- what the kubelet prepares

    @property
    def fs_group(self) -> int:
        return int(self.spec.get("securityContext", {}).get("fsGroup", 0))

    def _security(self, key: str) -> Any:
        return self.container.get("securityContext", {}).get(
            key, self.spec.get("securityContext", {}).get(key)
        )

    def _volumes(self) -> list[Doc]:
        """Bind mounts for the container's volumeMounts, laid out on disk as the kubelet does."""
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        root = self.workdir / "volumes"
        mounts: list[Doc] = []
        for m in self.container.get("volumeMounts", []):
            v = volumes[m["name"]]
            where = root / m["name"]
            if "emptyDir" in v:
                where.mkdir(parents=True)
                os.chown(where, 0, self.fs_group)
                where.chmod(0o2777)  # kubelet: world-writable, setgid to the fsGroup
            elif "configMap" in v or "secret" in v:
                source = v.get("configMap") or v["secret"]
                name = source.get("name") or source["secretName"]
                store = self.config_maps if "configMap" in v else self.secrets
                if name not in store and not source.get("optional", False):
                    raise AssertionError(
                        f"volume {m['name']}: {name} does not exist; the pod would not start"
                    )
                where.mkdir(parents=True)
                mode = source.get("defaultMode", 0o644)
                for key, value in store.get(name, {}).items():
                    _write(where / key, value.encode(), mode, self.fs_group)
            else:
                raise AssertionError(f"volume {m['name']}: kind not emulated: {sorted(v)}")
            mode = "ro" if m.get("readOnly") else "rw"
            mounts.append(
                {
                    "destination": m["mountPath"],
                    "type": "bind",
                    "source": str(where),
                    "options": ["rbind", mode],
                }
            )
        # automountServiceAccountToken: the projected token, the cluster CA, the namespace.
        sa = root / "kube-api-access"
        _write(sa / "token", self.service_account.token.encode(), 0o640, self.fs_group)
        _write(sa / "ca.crt", self.service_account.ca_crt, 0o644, self.fs_group)
        _write(sa / "namespace", self.service_account.namespace.encode(), 0o644, self.fs_group)
        mounts.append(
            {
                "destination": SERVICE_ACCOUNT_DIR,
                "type": "bind",
                "source": str(sa),
                "options": ["rbind", "ro"],
            }
        )
        # hostNetwork: the node's resolver and hosts file.
        for f in ("/etc/hosts", "/etc/resolv.conf"):
            mounts.append({"destination": f, "type": "bind", "source": f, "options": ["rbind", "ro"]})
        return mounts

    def _env(self) -> list[str]:
        env = dict(e.split("=", 1) for e in self.image.run.get("Env", []))
        host, port = self.api_server
        # The `kubernetes` Service's variables, set in every container even without service links.
        env |= {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": str(port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }
        fields = {"metadata.name": self.name, "metadata.namespace": self.namespace}
        for e in self.container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            else:
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        return [f"{k}={v}" for k, v in env.items()]

    def runtime_spec(self) -> Doc:
        """The OCI runtime spec of the container (what containerd hands runc for this pod)."""
        uid = self._security("runAsUser")
        gid = self._security("runAsGroup")
        if uid is None:  # the image's USER
            user, _, group = self.image.run["User"].partition(":")
            uid, gid = int(user), int(group or 0)
        args = self.container.get("command") or self.image.run.get("Entrypoint", [])
        args = [*args, *(self.container.get("args") or self.image.run.get("Cmd", []))]
        caps = [] if "ALL" in self._security("capabilities").get("drop", []) else ["CAP_KILL"]
        limits = self.container.get("resources", {}).get("limits", {})
        resources: Doc = {"devices": [{"allow": False, "access": "rwm"}]}
        if "memory" in limits:
            resources["memory"] = {"limit": _quantity(limits["memory"])}
        return {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False,
                "user": {"uid": uid, "gid": gid, "additionalGids": [self.fs_group]},
                "args": args,
                "env": self._env(),
                "cwd": self.image.run.get("WorkingDir") or "/",
                "capabilities": {
                    k: caps for k in ("bounding", "effective", "permitted", "inheritable", "ambient")
                },
                "noNewPrivileges": self._security("allowPrivilegeEscalation") is False,
            },
            "root": {
                "path": str(self.image.rootfs),
                "readonly": bool(self._security("readOnlyRootFilesystem")),
            },
            "hostname": self.name,
            "mounts": [*BASE_MOUNTS, *self._volumes()],
            "linux": {
                "resources": resources,
                # hostNetwork: no network namespace (nor UTS: the node's host name).
                "namespaces": [{"type": t} for t in ("pid", "ipc", "mount")],
                "maskedPaths": MASKED_PATHS,
                "readonlyPaths": READONLY_PATHS,
            },
        }

    # -- running it

    def start(self) -> None:
        bundle = self.workdir / "bundle"
        bundle.mkdir(parents=True)
        spec = self.runtime_spec()
        del spec["hostname"]  # a UTS namespace of its own would be needed to set it
        (bundle / "config.json").write_text(json.dumps(spec, indent=2))
        self.state_dir.mkdir()
        with self.log_path.open("wb") as log:  # a file, not a pipe: nobody reads it while it runs
            self._proc = subprocess.Popen(
                [runc(), "--root", str(self.state_dir), "run", "--bundle", str(bundle), self.id],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._started = time.monotonic()
        self._prober = threading.Thread(target=self._probe_loop, name=f"probes-{self.id}", daemon=True)
        self._prober.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def init_pid(self) -> int:
        """The container's first process, as the host sees it."""
        out = self._runc("state", self.id)
        return int(json.loads(out.stdout)["pid"])

    def port(self, name_or_number: str | int) -> int:
        if isinstance(name_or_number, int):
            return name_or_number
        return next(
            int(p["containerPort"]) for p in self.container["ports"] if p.get("name") == name_or_number
        )

    def get(self, path: str, port: str | int = "http", timeout: float = 5.0) -> tuple[int, str]:
        """GET on the pod's port (host networking: the machine's loopback); (0, error) without answer."""
        url = f"http://127.0.0.1:{self.port(port)}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def _probe_loop(self) -> None:
        """Each probe at its own period (initialDelaySeconds 0), until the pod is told to stop."""
        probes = [(p, self.container[p]) for p in ("livenessProbe", "readinessProbe") if p in self.container]
        due = {p: 0.0 for p, _ in probes}
        while not self._stop_probing.is_set():
            now = time.monotonic() - self._started
            for name, probe in probes:
                if now >= due[name]:
                    http = probe["httpGet"]
                    code, _ = self.get(
                        http["path"], http["port"], timeout=float(probe.get("timeoutSeconds", 1))
                    )
                    self.probes.answers.append((name, code, now))
                    due[name] = now + float(probe.get("periodSeconds", 10))
            self._stop_probing.wait(0.2)

    def terminate(self) -> tuple[int | None, float]:
        """SIGTERM, then SIGKILL after the grace period: (exit code, seconds it took to exit)."""
        assert self._proc is not None
        self._stop_probing.set()  # the kubelet stops probing a terminating container
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        start = time.monotonic()
        self._runc("kill", self.id, "TERM")
        try:
            code: int | None = self._proc.wait(grace)
        except subprocess.TimeoutExpired:
            self._runc("kill", self.id, "KILL", check=False)
            self._proc.wait(30)
            code = None
        return code, time.monotonic() - start

    def delete(self) -> None:
        """Stop whatever still runs and remove the container (idempotent)."""
        self._stop_probing.set()
        if self._proc is not None and self._proc.poll() is None:
            self._runc("kill", self.id, "KILL", check=False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(30)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(10)
        if self.state_dir.exists():
            self._runc("delete", "--force", self.id, check=False)
        if self._prober is not None:
            self._prober.join(10)

    def _runc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [runc(), "--root", str(self.state_dir), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"runc {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out


@contextlib.contextmanager
def running(pod: Pod) -> Iterator[Pod]:
    """``pod`` started, and deleted afterwards whatever happened."""
    try:
        pod.start()
        yield pod
    finally:
        pod.delete()
