"""SOPS-encrypted manifests in the render stage: decrypted in memory, failing closed, marked for masking.

Files are encrypted with the pinned sops to age keys made in Python (``tests/sopskit.py``);
a missing sops fails these tests (``scripts/install-go-tools sops``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.errors import RenderError
from agent.model import DECRYPTED_FIELDS, DecryptFault, DesiredSet, EncryptedSource
from agent.render.process import RunResult, run_subprocess
from agent.render.renderer import RenderCache, RenderSpec, render
from agent.render.sops import AgeKeys, SopsMode
from tests.sopskit import AgeKey, age_key, encrypt

SECRET = """\
apiVersion: v1
kind: Secret
metadata:
  name: db
  labels:
    env: ${ENV}
stringData:
  password: hunter2-SENTINEL
"""
CONFIG = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
data:
  token: tok-SENTINEL
  plain: visible
"""


@pytest.fixture(scope="module")
def key() -> AgeKey:
    return age_key()


def keys_of(*keys: AgeKey) -> AgeKeys:
    return AgeKeys("".join(k.identity + "\n" for k in keys), ("test keys",))


def write(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def objects(ds: DesiredSet) -> dict[str, dict[str, Any]]:
    return {str(o.key): o.manifest for o in ds.objects}


def pointers(manifest: dict[str, Any]) -> list[str]:
    return json.loads(manifest["metadata"]["annotations"][DECRYPTED_FIELDS])  # type: ignore[no-any-return]


def problems(e: pytest.ExceptionInfo[RenderError]) -> list[tuple[str, DecryptFault | None]]:
    return [(p.file, p.fault) for p in e.value.problems]


def test_an_encrypted_secret_in_a_plain_directory_renders_decrypted_and_marked(
    tmp_path: Path, key: AgeKey
) -> None:
    write(
        tmp_path,
        {
            "app/secret.yaml": encrypt(SECRET, key.recipient),
            "app/config.yaml": encrypt(CONFIG, key.recipient, encrypted_regex="^token$"),
        },
    )
    ds = render(tmp_path, RenderSpec("c", ("app",), {"ENV": "prod"}, keys=keys_of(key)))
    got = objects(ds)
    secret, config = got["Secret/db"], got["ConfigMap/cfg"]
    assert "sops" not in secret and "sops" not in config
    assert secret["stringData"] == {"password": "hunter2-SENTINEL"}
    assert secret["metadata"]["labels"] == {"env": "prod"}  # unencrypted values are still substituted
    assert config["data"] == {"token": "tok-SENTINEL", "plain": "visible"}
    assert pointers(secret) == ["/stringData/password"]
    assert pointers(config) == ["/data/token"]  # any kind: what was encrypted is what is masked
    assert set(ds.encrypted) == {
        EncryptedSource("app/config.yaml", (key.recipient,)),
        EncryptedSource("app/secret.yaml", (key.recipient,)),
    }
    assert [str(o.provenance) for o in ds.objects] == ["app/config.yaml:1", "app/secret.yaml:1"]


def test_kustomize_output_is_decrypted_from_its_file_after_kustomize_rewrote_the_object(
    tmp_path: Path, key: AgeKey
) -> None:
    """sops's MAC covers the file as committed: a prefix and a label must not break it."""
    write(
        tmp_path,
        {
            "base/secret.yaml": encrypt(SECRET.replace("${ENV}", "base"), key.recipient),
            "base/kustomization.yaml": "resources: [secret.yaml]\n",
            "prod/kustomization.yaml": (
                "namePrefix: prod-\nlabels:\n- pairs: {tier: db}\nresources: [../base]\n"
            ),
        },
    )
    ds = render(tmp_path, RenderSpec("c", ("prod",), {}, keys=keys_of(key)))
    secret = objects(ds)["Secret/prod-db"]
    assert secret["stringData"] == {"password": "hunter2-SENTINEL"}
    assert secret["metadata"]["labels"] == {"env": "base", "tier": "db"}
    assert "sops" not in secret and pointers(secret) == ["/stringData/password"]
    assert ds.encrypted == (EncryptedSource("base/secret.yaml", (key.recipient,)),)


def test_a_helm_template_holding_an_encrypted_manifest_is_decrypted(tmp_path: Path, key: AgeKey) -> None:
    write(
        tmp_path,
        {
            "chart/Chart.yaml": "apiVersion: v2\nname: web\nversion: 0.1.0\n",
            "chart/templates/secret.yaml": encrypt(SECRET.replace("${ENV}", "helm"), key.recipient),
        },
    )
    ds = render(tmp_path, RenderSpec("c", ("chart",), {}, keys=keys_of(key)))
    assert objects(ds)["Secret/db"]["stringData"] == {"password": "hunter2-SENTINEL"}


def test_files_kustomize_generators_read_are_decrypted(tmp_path: Path, key: AgeKey) -> None:
    write(
        tmp_path,
        {
            "gen/app.env": encrypt("USER=admin\nPASS=pw-SENTINEL\n", key.recipient, kind="dotenv"),
            "gen/conf.json": encrypt('{"token": "json-SENTINEL"}', key.recipient, kind="json"),
            "gen/blob.bin": encrypt("raw SENTINEL\n", key.recipient, kind="binary"),
            "gen/kustomization.yaml": (
                "secretGenerator:\n- name: env\n  envs: [app.env]\n"
                "- name: files\n  files: [conf.json, blob.bin]\n"
                "configMapGenerator:\n- name: cm\n  envs: [app.env]\n"
            ),
        },
    )
    ds = render(tmp_path, RenderSpec("c", ("gen",), {}, keys=keys_of(key)))
    by_name = {o.key.name.rsplit("-", 1)[0]: o.manifest for o in ds.objects}
    env = {k: base64.b64decode(v).decode() for k, v in by_name["env"]["data"].items()}
    assert env == {"USER": "admin", "PASS": "pw-SENTINEL"}  # sops_* metadata keys dropped
    assert by_name["cm"]["data"] == {"USER": "admin", "PASS": "pw-SENTINEL"}
    files = {k: base64.b64decode(v).decode() for k, v in by_name["files"]["data"].items()}
    assert json.loads(files["conf.json"]) == {"token": "json-SENTINEL"}
    assert files["blob.bin"] == "raw SENTINEL\n"
    assert pointers(by_name["files"]) == ["/data/blob.bin", "/data/conf.json"]
    assert {s.file for s in ds.encrypted} == {"gen/app.env", "gen/conf.json", "gen/blob.bin"}


def test_a_generator_file_of_ciphertext_nested_thousands_deep_fails_the_render_not_the_pass(
    tmp_path: Path, key: AgeKey
) -> None:
    """Before: the whole-file check parsed it with json.loads, whose RecursionError escaped the
    render (the pass failed with "internal error", naming no file)."""
    deep = '{"a": ' * 5_000 + '"ENC[AES256_GCM,data:eA==,iv:eA==,tag:eA==,type:str]"' + "}" * 5_000
    write(
        tmp_path,
        {
            "gen/deep.json": deep,
            "gen/kustomization.yaml": "configMapGenerator:\n- name: cm\n  files: [deep.json]\n",
        },
    )
    with pytest.raises(RenderError) as e:
        render(tmp_path, RenderSpec("c", ("gen",), {}, keys=keys_of(key)))
    assert problems(e) == [("gen (kustomize build output)", DecryptFault.MALFORMED)]
    assert "holds ciphertext that is not a whole sops file" in str(e.value)


def _tamper_mac(text: str) -> str:
    return text.replace("name: db", "name: dc")


def _tamper_value(text: str) -> str:
    return re.sub(r"data:[A-Za-z0-9+/]{4}", "data:AAAA", text, count=1)


@pytest.mark.parametrize(
    ("change", "keys", "fault", "words"),
    [
        (lambda t: t, "other", DecryptFault.NO_MATCHING_KEY, "none of the app's age identities"),
        (lambda t: t, None, DecryptFault.NO_KEYS, "the app has no decryption keys"),
        (_tamper_mac, "right", DecryptFault.MAC_MISMATCH, "changed after it was encrypted"),
        (_tamper_value, "right", DecryptFault.TAMPERED, "does not authenticate"),
        (lambda t: t.replace("mac: ENC[", "mac: XNC["), "right", DecryptFault.MAC_MISMATCH, "MAC"),
        (lambda t: t.replace("version:", "nope:").replace("age:", "agex:"), "right", None, "sops"),
        (lambda t: t + "---\n" + CONFIG, "right", DecryptFault.MALFORMED, "mixes encrypted and plain"),
    ],
    ids=["wrong-key", "no-keys", "tampered-mac", "tampered-value", "broken-mac", "no-key-group", "mixed"],
)
def test_a_file_that_does_not_decrypt_fails_the_render_naming_the_file_and_the_cause(
    tmp_path: Path,
    key: AgeKey,
    change: Any,
    keys: str | None,
    fault: DecryptFault | None,
    words: str,
) -> None:
    text = change(encrypt(SECRET.replace("${ENV}", "x"), key.recipient))
    write(tmp_path, {"app/secret.yaml": text, "app/ok.yaml": CONFIG})
    given = {"other": keys_of(age_key()), "right": keys_of(key), None: None}[keys]
    with pytest.raises(RenderError) as e:
        render(tmp_path, RenderSpec("c", ("app",), {}, keys=given))
    ((file, got),) = problems(e)
    assert file == "app/secret.yaml"
    assert got is not None and (fault is None or got is fault)
    assert words in str(e.value)
    assert "SENTINEL" not in str(e.value)


def test_the_wrong_key_message_names_the_recipients_and_the_keys_sources(tmp_path: Path, key: AgeKey) -> None:
    write(tmp_path, {"app/secret.yaml": encrypt(SECRET, key.recipient)})
    other = age_key()
    with pytest.raises(RenderError) as e:
        render(tmp_path, RenderSpec("c", ("app",), {"ENV": "x"}, keys=AgeKeys(other.identity, ("file /k",))))
    assert key.recipient in str(e.value) and "file /k" in str(e.value)
    assert other.identity not in str(e.value)


def test_a_file_encrypted_to_two_keys_decrypts_with_either(tmp_path: Path, key: AgeKey) -> None:
    new = age_key()
    write(tmp_path, {"app/secret.yaml": encrypt(SECRET, key.recipient, new.recipient)})
    for keys in (keys_of(key), keys_of(new), keys_of(age_key(), new)):
        ds = render(tmp_path, RenderSpec("c", ("app",), {"ENV": "x"}, keys=keys))
        assert objects(ds)["Secret/db"]["stringData"] == {"password": "hunter2-SENTINEL"}


def test_ciphertext_in_kustomize_output_that_no_file_explains_fails_the_render(
    tmp_path: Path, key: AgeKey
) -> None:
    # Two encrypted documents merged by a patch: the result carries the patch's metadata and
    # the base's ciphertext, which no single file decrypts to.
    base = encrypt(SECRET.replace("${ENV}", "x"), key.recipient)
    patch = encrypt(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  user: u\n", key.recipient
    )
    write(
        tmp_path,
        {
            "k/secret.yaml": base,
            "k/patch.yaml": patch,
            "k/kustomization.yaml": "resources: [secret.yaml]\npatches:\n- path: patch.yaml\n",
        },
    )
    with pytest.raises(RenderError) as e:
        render(tmp_path, RenderSpec("c", ("k",), {}, keys=keys_of(key)))
    assert [f for _, f in problems(e)] == [DecryptFault.UNRESOLVED]
    assert "SENTINEL" not in str(e.value)


def test_a_sealed_render_keeps_the_ciphertext_needs_no_key_and_records_the_recipients(
    tmp_path: Path, key: AgeKey
) -> None:
    write(tmp_path, {"app/secret.yaml": encrypt(SECRET, key.recipient)})
    ds = render(tmp_path, RenderSpec("c", ("app",), {"ENV": "x"}, sops=SopsMode.SEAL))
    secret = objects(ds)["Secret/db"]
    assert ds.sealed and "sops" not in secret
    assert secret["stringData"]["password"].startswith("ENC[AES256_GCM,")
    assert pointers(secret) == ["/stringData/password"]
    assert ds.encrypted == (EncryptedSource("app/secret.yaml", (key.recipient,)),)


def test_sops_gets_the_identities_in_its_environment_never_on_its_command_line(
    tmp_path: Path, key: AgeKey
) -> None:
    seen: list[tuple[list[str], dict[str, str], Path, bytes | None]] = []

    def spy(
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
        max_output: int,
        stdin: bytes | None = None,
    ) -> RunResult:
        seen.append((list(argv), dict(env), cwd, stdin))
        return run_subprocess(argv, cwd=cwd, env=env, timeout=timeout, max_output=max_output, stdin=stdin)

    ciphertext = encrypt(SECRET, key.recipient)
    write(tmp_path, {"app/secret.yaml": ciphertext})
    render(tmp_path, RenderSpec("c", ("app",), {"ENV": "x"}, keys=keys_of(key)), runner=spy)
    ((argv, env, cwd, stdin),) = seen
    assert key.identity not in " ".join(argv) and str(tmp_path) not in " ".join(argv)
    assert env["SOPS_AGE_KEY"] == key.identity + "\n"
    assert env["PATH"] == "" and env["HOME"] == str(cwd) and not cwd.exists()  # a throw-away home
    assert stdin == ciphertext.encode()  # the file itself, as committed, from stdin
    assert key.identity not in repr(keys_of(key))


def test_a_cached_render_is_never_shared_with_a_cluster_without_the_keys(tmp_path: Path, key: AgeKey) -> None:
    write(tmp_path, {"app/secret.yaml": encrypt(SECRET, key.recipient)})
    cache = RenderCache()
    with_keys = RenderSpec("a", ("app",), {"ENV": "x"}, keys=keys_of(key))
    cache.render(tmp_path, with_keys, revision="r1")
    with pytest.raises(RenderError):
        cache.render(tmp_path, RenderSpec("b", ("app",), {"ENV": "x"}), revision="r1")
    with pytest.raises(RenderError):
        other = RenderSpec("b", ("app",), {"ENV": "x"}, keys=keys_of(age_key()))
        cache.render(tmp_path, other, revision="r1")
    assert "SENTINEL" in str(cache.render(tmp_path, with_keys, revision="r1").objects[0].manifest)
