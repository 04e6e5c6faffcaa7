"""Secrets encrypted in Git with SOPS and age, on real local clusters (docs/secrets.md).

- An encrypted Secret (and an encrypted ConfigMap: any kind) is applied decrypted, and its
  plaintext is nowhere else: not in any directory the agent process writes (cache, checkouts,
  TMPDIR where kustomize's and sops's homes go, HOME), nor in its logs, Events, ``/status``,
  ``render`` without ``--show-secrets``, or the live and offline diff reports.
- A file that does not decrypt (wrong key, tampered MAC, no key configured) fails its app
  alone, naming the file: nothing of that app is applied or pruned, another app converges.
- A key rotated (file re-encrypted to a new recipient, the agent holding both identities,
  from a Secret in the cluster) never fails a pass, and the Secret is never deleted or
  re-created: its value is right throughout.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pygit2
import pytest

from agent.config.load import load_config
from agent.config.types import Config
from agent.model import FailureReason, Outcome, PassState
from agent.render.binaries import cache_root, tool
from tests.agentkit import E2E, Repo, make_repo, unique
from tests.appkit import AppsAgent, toml_value
from tests.clusters import ClusterPool, kubectl
from tests.daemonkit import free_port, http
from tests.sopskit import AgeKey, age_key, encrypt
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent


def secret(ns: str, value: str, name: str = "db") -> str:
    return (
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {ns}\n"
        f"  labels:\n    tier: db\ntype: Opaque\nstringData:\n  password: {value}\n"
    )


def configmap(ns: str, name: str, **data: str) -> str:
    body = "".join(f"\n  {k}: {v!r}" for k, v in data.items())
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:{body}\n"


def namespace(ns: str) -> str:
    return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"


def apps_config(
    path: Path, tmp_path: Path, repo: Repo, kubeconfig: Path, agent: str, apps: dict[str, dict[str, Any]]
) -> Config:
    """One cluster `pool-a` serving ``apps`` (name → `[[apps]]` keys, a `decryption` dict as its table)."""
    lines = [
        "[agent]",
        f'name = "{agent}"',
        f'cache_dir = "{tmp_path / "cache"}"',
        'listen = ""',
        'leases = "off"',
        "",
        "[source]",
        f'url = "{repo.path}"',
        'poll_interval = "1s"',
        "",
        "[defaults]",
        'pass_deadline = "60s"',
        'request_timeout = "10s"',
        'reconcile_interval = "2s"',
        "",
        "[[clusters]]",
        'name = "pool-a"',
        f'kubeconfig = "{kubeconfig}"',
    ]
    for name, keys in apps.items():
        table = dict(keys)
        decryption = table.pop("decryption", None)
        lines += ["", "[[apps]]", f'name = "{name}"', 'cluster = "pool-a"']
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        if decryption is not None:
            lines += ["", "[apps.decryption]", *(f"{k} = {toml_value(v)}" for k, v in decryption.items())]
    path.write_text("\n".join(lines) + "\n")
    return load_config(path)


def secret_value(kubeconfig: Path, ns: str, name: str = "db") -> str:
    out = kubectl(kubeconfig, "get", "secret", name, "-n", ns, "-o", "jsonpath={.data.password}")
    return base64.b64decode(out).decode()


# -- plaintext only in memory ------------------------------------------------------------------


def forms(*values: str) -> list[bytes]:
    """Each value as it could be written: raw, and base64 (a Secret's data)."""
    return [f for v in values for f in (v.encode(), base64.b64encode(v.encode()))]


def leaks(roots: list[Path], needles: list[bytes]) -> list[str]:
    """Every file under ``roots`` holding any of ``needles``."""
    found = []
    for root in roots:
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                path = Path(dirpath) / name
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                found += [f"{path}: {n!r}" for n in needles if n in data]
    return found


def test_secret_stays_secret_an_encrypted_secret_is_applied_decrypted_and_its_plaintext_is_nowhere_else(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E
) -> None:
    a = cluster_pool["pool-a"]
    key = age_key()
    ns = e2e.namespace("sops")
    password, token, bad_label = unique("pw-SENTINEL"), unique("tok-SENTINEL"), unique("bad SENTINEL")
    later = unique("pw2-SENTINEL")
    files = {
        "secrets/ns.yaml": namespace(ns),
        "secrets/db.yaml": encrypt(secret(ns, password), key.recipient),
        # Any kind: a ConfigMap's data, encrypted and masked like a Secret's.
        "secrets/cm.yaml": encrypt(
            configmap(ns, "app", token=token, level="info"), key.recipient, encrypted_regex="^token$"
        ),
        # Through kustomize (its temporary home, its rewrites): a second Secret.
        "kust/db.yaml": encrypt(secret(ns, password, name="kdb"), key.recipient),
        "kust/kustomization.yaml": "namePrefix: k-\nresources: [db.yaml]\n",
        # Rejected by the server with a message quoting the (decrypted) value: never shown.
        "noisy/cm.yaml": encrypt(
            configmap(ns, "noisy").replace("\ndata:", f"\n  labels:\n    tier: {bad_label}\ndata:")
            + "  x: y\n",
            key.recipient,
            encrypted_regex="^tier$",
        ),
    }
    repo = make_repo(tmp_path, files)
    first_commit = str(pygit2.Repository(str(repo.path)).head.target)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "agekey").write_text(key.identity + "\n")
    decryption = {"age_key_file": str(tmp_path / "keys" / "agekey")}
    port = free_port()
    cfg_file = tmp_path / "agent.toml"
    apps_config(
        cfg_file,
        tmp_path,
        repo,
        a.kubeconfig,
        unique("sops"),
        {
            "secrets": {"paths": ["secrets", "kust"], "decryption": decryption},
            "noisy": {"path": "noisy", "depends_on": ["secrets"], "decryption": decryption},
        },
    )
    cfg_file.write_text(cfg_file.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    cfg = load_config(cfg_file)
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "GITOPS_AGENT_CACHE": str(cache_root()),  # the pinned tools (read only); HOME moved
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agent.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=180,
            check=False,
        )

    def apps() -> dict[str, dict[str, Any]]:
        try:
            code, body = http(f"http://127.0.0.1:{port}/status")
        except (OSError, urllib.error.URLError):
            return {}
        rows = json.loads(body)["clusters"] if code == 200 else []  # one row per (cluster, app)
        return {r["app"]: r for r in rows}

    errors = tmp_path / "daemon.err"
    with open(errors, "w") as err:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "--log-format", "json", "run", "--config", str(cfg_file)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=tmp_path,
        )
    e2e.at_end(lambda: daemon.poll() is None and daemon.kill())
    try:
        status = wait_for(
            "both apps' first pass",
            lambda: (
                (s := apps())
                and all(s.get(n, {}).get("result", "pending") != "pending" for n in ("secrets", "noisy"))
                and s
            ),
            90,
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\ndaemon's log:\n{errors.read_text()[-4000:]}") from None
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert status["secrets"]["state"] == PassState.OK, status["secrets"]
    assert status["noisy"]["failed_objects"] == 1, status["noisy"]  # the check below can fail
    # Applied decrypted, to a real cluster.
    assert secret_value(a.kubeconfig, ns) == password
    assert secret_value(a.kubeconfig, ns, "k-kdb") == password
    live_cm = json.loads(kubectl(a.kubeconfig, "get", "configmap", "app", "-n", ns, "-o", "json"))
    assert live_cm["data"] == {"token": token, "level": "info"}
    assert json.loads(live_cm["metadata"]["annotations"]["gitops-agent.io/decrypted-fields"]) == [
        "/data/token"
    ]

    # A new value in Git: what the reports would show, without a cluster write (the daemon is gone).
    files["secrets/db.yaml"] = encrypt(secret(ns, later), key.recipient)
    repo.commit(files, "rotate the password")
    live = cli("diff", "--config", str(cfg_file), "--cluster", "pool-a", "--format", "json")
    assert live.returncode in (1, 2), live.stderr  # the noisy app's object is rejected: 2
    report = json.loads(live.stdout)
    changed = {o["key"] for c in report["clusters"] for ap in c["apps"] for o in ap["objects"]}
    assert f"Secret/{ns}/db" in changed
    markdown = cli("diff", "--config", str(cfg_file), "--cluster", "pool-a", "--format", "markdown")
    rendered = cli("render", "--config", str(cfg_file), "--cluster", "pool-a", "--app", "secrets")
    assert rendered.returncode == 0 and "password: '***'" in rendered.stdout, rendered.stderr
    offline = cli(
        "diff",
        "--offline",
        "--config",
        str(cfg_file),
        "--repo",
        str(repo.path),
        "--base",
        first_commit,
        "--head",
        "main",
    )
    assert offline.returncode == 1, offline.stdout + offline.stderr  # the Secret's ciphertext changed
    assert f"Secret/{ns}/db" in offline.stdout

    events = kubectl(a.kubeconfig, "get", "events", "-n", cfg.agent.namespace, "-o", "json")
    assert f"ConfigMap/{ns}/noisy: HTTP 422" in events, "an Event of the rejected object: the check can fail"
    logs = errors.read_text()
    assert f"ConfigMap/{ns}/noisy" in logs and "object failed" in logs
    needles = forms(password, later, token, bad_label)
    shown = {
        "daemon logs": logs,
        "events": events,
        "/status": json.dumps(status),
        "live diff (json)": live.stdout + live.stderr,
        "live diff (markdown)": markdown.stdout + markdown.stderr,
        "render": rendered.stdout + rendered.stderr,
        "offline diff": offline.stdout + offline.stderr,
    }
    for what, text in shown.items():
        assert not [n for n in needles if n in text.encode()], f"{what} shows a decrypted value"
    # Every directory the processes wrote; the checkouts are there, and hold ciphertext.
    roots = [home, tmp, tmp_path / "cache"]
    checkouts = [p for p in (tmp_path / "cache").rglob("db.yaml") if "secrets" in p.parts]
    assert checkouts and all(b"ENC[AES256_GCM," in p.read_bytes() for p in checkouts)
    assert leaks(roots, needles) == []
    shown_secret = cli(
        "render", "--config", str(cfg_file), "--cluster", "pool-a", "--app", "secrets", "--show-secrets"
    )
    assert f"password: {later}" in shown_secret.stdout  # the scan above would find it if written


# -- fail closed -------------------------------------------------------------------------------


@pytest.mark.parametrize("breakage", ["wrong-key", "tampered-mac", "no-key-configured"])
def test_fail_closed_a_file_that_does_not_decrypt_fails_its_app_alone_naming_the_file(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, breakage: str
) -> None:
    a = cluster_pool["pool-a"]
    key = age_key()
    ns = e2e.namespace("sopsfail")
    keyfile = tmp_path / "agekey"
    keyfile.write_text(key.identity + "\n")
    sealed = encrypt(secret(ns, "pw-1"), key.recipient)
    files = {
        "good/ns.yaml": namespace(ns),
        "good/cm.yaml": configmap(ns, "good", v="1"),
        "broken/db.yaml": sealed,
        "broken/cfg.yaml": configmap(ns, "cfg", v="1"),
        "broken/gone.yaml": configmap(ns, "gone", v="1"),
    }
    repo = make_repo(tmp_path, files)
    agent_name = unique("sopsfail")

    def config(file: str, with_keys: bool) -> Config:
        broken: dict[str, Any] = {"path": "broken", "depends_on": ["good"]}
        if with_keys:
            broken["decryption"] = {"age_key_file": str(keyfile)}
        return apps_config(
            tmp_path / file,
            tmp_path,
            repo,
            a.kubeconfig,
            agent_name,
            {"good": {"path": "good"}, "broken": broken},
        )

    agent = AppsAgent(config("with-keys.toml", True))
    e2e.at_end(agent.close)
    first = agent.reconcile()
    assert first["good"].ok and first["broken"].ok, (first["good"].error, first["broken"].error)
    assert secret_value(a.kubeconfig, ns) == "pw-1"

    changed = dict(files)
    del changed["broken/gone.yaml"]
    changed["broken/cfg.yaml"] = configmap(ns, "cfg", v="2")
    changed["good/cm.yaml"] = configmap(ns, "good", v="2")
    if breakage == "wrong-key":
        changed["broken/db.yaml"] = encrypt(secret(ns, "pw-2"), age_key().recipient)
    elif breakage == "tampered-mac":
        changed["broken/db.yaml"] = sealed.replace("tier: db", "tier: cache")  # an unencrypted value
    repo.commit(changed, "break the encrypted file")
    if breakage == "no-key-configured":
        agent.close()
        agent = AppsAgent(config("without-keys.toml", False))
        e2e.at_end(agent.close)
    second = agent.reconcile()

    broken = second["broken"]
    assert broken.failure is not None and broken.failure.reason is FailureReason.RENDER
    assert "broken/db.yaml" in (broken.error or "")
    words = {
        "wrong-key": "none of the app's age identities",
        "tampered-mac": "MAC mismatch",
        "no-key-configured": "no decryption keys",
    }[breakage]
    assert words in (broken.error or ""), broken.error
    assert broken.results == [] and broken.count(Outcome.PRUNED) == 0
    # Nothing of the broken app was applied or pruned.
    cms = json.loads(kubectl(a.kubeconfig, "get", "configmaps", "-n", ns, "-o", "json"))["items"]
    data = {c["metadata"]["name"]: c["data"] for c in cms if c["metadata"]["name"] in ("cfg", "gone", "good")}
    assert data == {"cfg": {"v": "1"}, "gone": {"v": "1"}, "good": {"v": "2"}}
    assert secret_value(a.kubeconfig, ns) == "pw-1"
    # The other app on the cluster converged.
    assert second["good"].ok and second["good"].count(Outcome.CONFIGURED) == 1


# -- key rotation ----------------------------------------------------------------------------


class SecretWatch:
    """``kubectl get secrets --watch`` in a namespace for the ``with`` block: every event, with the
    object's UID and decoded password (kubectl lists first, then watches from that listing)."""

    SENTINEL = "zz-watch-sentinel"

    def __init__(self, kubeconfig: Path, ns: str) -> None:
        self.kubeconfig, self.ns = kubeconfig, ns
        self.events: list[tuple[str, str, str, str]] = []  # (type, name, uid, password)
        self._listed, self._caught_up = threading.Event(), threading.Event()
        self.proc = subprocess.Popen(
            [
                str(tool("kubectl")),
                f"--kubeconfig={kubeconfig}",
                "get",
                "secrets",
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

    def __enter__(self) -> SecretWatch:
        self._reader.start()
        assert self._listed.wait(30), "kubectl printed no listing within 30s"
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:  # every event before the sentinel's has been delivered once it is
                kubectl(self.kubeconfig, "create", "secret", "generic", self.SENTINEL, "-n", self.ns)
                assert self._caught_up.wait(30), "the watch did not deliver the sentinel within 30s"
        finally:
            self.proc.terminate()
            self.proc.wait(10)
            self._reader.join(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            obj = event["object"]
            value = base64.b64decode((obj.get("data") or {}).get("password", "")).decode()
            self.events.append((event["type"], obj["metadata"]["name"], obj["metadata"]["uid"], value))
            if obj["metadata"]["name"] == self.SENTINEL:
                self._caught_up.set()
            self._listed.set()


def key_secret(kubeconfig: Path, ns: str, name: str, keys: list[AgeKey]) -> None:
    """The agent's key Secret: one `<n>.agekey` entry per identity, replaced as a whole."""
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "stringData": {f"{i}.agekey": k.identity + "\n" for i, k in enumerate(keys)},
    }
    kubectl(kubeconfig, "delete", "secret", name, "-n", ns, "--ignore-not-found")
    localcluster_apply(kubeconfig, body)


def localcluster_apply(kubeconfig: Path, body: dict[str, Any]) -> None:
    from agent.dev import localcluster

    localcluster.kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(body))


@pytest.fixture
def keys_namespace(cluster_pool: ClusterPool, e2e: E2E) -> Iterator[str]:
    ns = e2e.namespace("sopskeys")
    kubectl(cluster_pool["pool-a"].kubeconfig, "create", "namespace", ns)
    yield ns


def test_secret_stays_secret_a_rotated_key_never_fails_a_pass_nor_recreates_the_secret(
    tmp_path: Path, cluster_pool: ClusterPool, e2e: E2E, keys_namespace: str
) -> None:
    a = cluster_pool["pool-a"]
    old, new = age_key(), age_key()
    ns = e2e.namespace("sopsrot")
    value = unique("pw")
    files = {"app/ns.yaml": namespace(ns), "app/db.yaml": encrypt(secret(ns, value), old.recipient)}
    repo = make_repo(tmp_path, files)
    key_secret(a.kubeconfig, keys_namespace, "sops-keys", [old])
    decryption = {"secret_name": "sops-keys", "secret_namespace": keys_namespace}
    cfg = apps_config(
        tmp_path / "agent.toml",
        tmp_path,
        repo,
        a.kubeconfig,
        unique("rot"),
        {"app": {"path": "app", "decryption": decryption}},
    )
    agent = AppsAgent(cfg)
    e2e.at_end(agent.close)
    first = agent.reconcile()["app"]
    assert first.ok and first.count(Outcome.CREATED) == 2, first.error
    uid = json.loads(kubectl(a.kubeconfig, "get", "secret", "db", "-n", ns, "-o", "json"))["metadata"]["uid"]

    passes = []
    with SecretWatch(a.kubeconfig, ns) as watch:
        key_secret(a.kubeconfig, keys_namespace, "sops-keys", [old, new])  # 1. the agent holds both
        passes.append(agent.reconcile()["app"])
        files["app/db.yaml"] = encrypt(secret(ns, value), new.recipient)  # 2. re-encrypted to the new
        repo.commit(files, "re-encrypt to the new key")
        passes.append(agent.reconcile()["app"])
        key_secret(a.kubeconfig, keys_namespace, "sops-keys", [new])  # 3. the old key retired
        passes.append(agent.reconcile()["app"])
        files["app/db.yaml"] = encrypt(secret(ns, value + "-next"), new.recipient)  # 4. a new value
        repo.commit(files, "new value")
        passes.append(agent.reconcile()["app"])

    assert [p.ok for p in passes] == [True] * 4, [p.error for p in passes]
    assert [p.count(Outcome.CONFIGURED) for p in passes] == [0, 0, 0, 1]  # no write until the value moved
    db = [e for e in watch.events if e[1] == "db"]
    assert {t for t, *_ in db} <= {"ADDED", "MODIFIED"} and [t for t, *_ in db].count("ADDED") == 1
    assert {u for _, _, u, _ in db} == {uid}  # never deleted, never re-created
    assert [v for *_, v in db] == [value] * (len(db) - 1) + [value + "-next"]  # right throughout
    assert secret_value(a.kubeconfig, ns) == value + "-next"
