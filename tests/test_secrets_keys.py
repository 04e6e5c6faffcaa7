"""Decryption keys: the `decryption` tables of the config, and loading an app's age identities.

The Secret source is exercised against a real API server in tests/test_secrets.py; here,
the config and the file and environment sources.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent.cli.main import main
from agent.config.load import load_config
from agent.config.types import Decryption
from agent.errors import ConfigError, RenderError
from agent.model import DesiredObject, DesiredSet, Provenance
from agent.reconcile.keys import load_keys
from agent.reconcile.stages import ClusterStages
from tests.sopskit import age_key, encrypt

RECIPIENT = age_key().recipient

CONFIG = f"""
[source]
url = "https://git.example.com/fleet.git"

[defaults.decryption]
age_key_file = "keys/all.txt"
age_recipients = ["{RECIPIENT}"]

[[clusters]]
name = "a"
kubeconfig = "kc"
path = "clusters/a"

[[clusters]]
name = "b"
kubeconfig = "kc"
path = "clusters/b"

[clusters.decryption]
age_key_env = "B_AGE_KEY"

[[apps]]
name = "tenant"
clusters = ["a", "b"]
path = "tenant"

[apps.decryption]
secret_name = "tenant-sops"
secret_namespace = "tenant"
"""


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    p = tmp_path / "agent.toml"
    p.write_text(body)
    return p


def test_a_decryption_table_replaces_the_one_it_inherits_as_a_whole(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, CONFIG))
    by_app = {(a.cluster, a.name): a.settings.decryption for a in cfg.apps}
    assert by_app[("a", "a")] == Decryption(
        age_key_file=str(tmp_path / "keys" / "all.txt"), age_recipients=(RECIPIENT,)
    )
    # The cluster's own table: the default's file and recipients are not inherited.
    assert by_app[("b", "b")] == Decryption(age_key_env="B_AGE_KEY")
    # A tenant's app holds its own key only, on every cluster it goes to.
    tenant = Decryption(secret_name="tenant-sops", secret_namespace="tenant")
    assert by_app[("a", "tenant")] == by_app[("b", "tenant")] == tenant


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ('age_recipients = ["age1nope"]', "defaults.decryption.age_recipients[0]", "not an age public key"),
        ('age_key_env = "NOT-A-NAME"', "defaults.decryption.age_key_env", "environment variable name"),
        ('secret_namespace = "x"', "defaults.decryption.secret_namespace", "needs secret_name"),
        ('secret_name = "Bad_Name"', "defaults.decryption.secret_name", "not a valid Secret name"),
        ('age_key = "AGE-SECRET-KEY-1..."', "defaults.decryption.age_key", "unknown key"),
    ],
)
def test_each_decryption_mistake_is_an_error_naming_its_key(
    tmp_path: Path, table: str, key: str, words: str
) -> None:
    body = f"[source]\nurl = 'u'\n\n[defaults.decryption]\n{table}\n\n"
    body += '[[clusters]]\nname = "a"\nkubeconfig = "kc"\npath = "p"\n'
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, body))
    assert e.value.path == key and words in e.value.message


def test_identities_come_from_a_file_and_an_environment_variable_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = age_key(), age_key()
    (tmp_path / "keys.txt").write_text(f"# created: today\n# public key: {old.recipient}\n{old.identity}\n")
    monkeypatch.setenv("AGE_NEW", new.identity)
    keys = load_keys(
        Decryption(age_key_file=str(tmp_path / "keys.txt"), age_key_env="AGE_NEW"),
        read_secret=None,
        namespace="",
    )
    assert keys is not None
    assert keys.identities.split() == [old.identity, new.identity]
    assert keys.sources == (f"file {tmp_path / 'keys.txt'}", "environment variable AGE_NEW")
    assert load_keys(Decryption(age_recipients=(RECIPIENT,)), read_secret=None, namespace="") is None


@pytest.mark.parametrize(
    ("decryption", "where", "words"),
    [
        (Decryption(age_key_env="UNSET_AGE_KEY"), "decryption.age_key_env", "is not set"),
        (Decryption(age_key_file="/nonexistent/keys.txt"), "decryption.age_key_file", "cannot read"),
        (Decryption(age_key_env="NOT_A_KEY"), "decryption.age_key_env", "holds no age identity"),
        (Decryption(secret_name="s"), "decryption.secret_name", "no cluster to read it from"),
    ],
    ids=["env-unset", "file-missing", "not-a-key", "no-cluster"],
)
def test_a_configured_key_that_cannot_be_loaded_fails_the_render_naming_where_it_should_come_from(
    monkeypatch: pytest.MonkeyPatch, decryption: Decryption, where: str, words: str
) -> None:
    monkeypatch.delenv("UNSET_AGE_KEY", raising=False)
    monkeypatch.setenv("NOT_A_KEY", "hunter2-SENTINEL")
    with pytest.raises(RenderError) as e:
        load_keys(decryption, read_secret=None, namespace="gitops-agent", cluster="a")
    ((problem,),) = [e.value.problems]
    assert problem.file == where and words in problem.message
    assert "SENTINEL" not in str(e.value)  # what a source holds is never repeated


def test_render_masks_decrypted_values_unless_asked_to_show_them(tmp_path: Path) -> None:
    key = age_key()
    tree = tmp_path / "tree"
    (tree / "app").mkdir(parents=True)
    secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: db}\nstringData: {password: pw-SENTINEL}\n"
    (tree / "app" / "db.yaml").write_text(encrypt(secret, key.recipient))
    (tmp_path / "keys.txt").write_text(key.identity + "\n")
    body = CONFIG.split("[defaults.decryption]")[0] + (
        '[[clusters]]\nname = "a"\nkubeconfig = "kc"\npath = "app"\n\n'
        '[clusters.decryption]\nage_key_file = "keys.txt"\n'
    )
    cfg = write(tmp_path, body)
    args = ["render", "--config", str(cfg), "--cluster", "a", "--path", str(tree)]
    masked = CliRunner().invoke(main, args)
    assert masked.exit_code == 0, masked.output
    assert "password: '***'" in masked.stdout and "SENTINEL" not in masked.stdout + masked.stderr
    shown = CliRunner().invoke(main, [*args, "--show-secrets"])
    assert shown.exit_code == 0 and "password: pw-SENTINEL" in shown.stdout


def test_an_object_still_carrying_sops_metadata_or_a_sealed_render_is_never_prepared_for_a_cluster(
    tmp_path: Path,
) -> None:
    """Whatever rendered it, ciphertext is refused before the cluster is even asked anything."""
    cfg = load_config(write(tmp_path, CONFIG))

    def no_cluster(_: object) -> Any:
        raise AssertionError("the cluster was contacted")

    stages = ClusterStages(cfg, cfg.cluster("a"), client_factory=no_cluster)
    encrypted = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "sops": {"mac": "x"}}
    carrying = DesiredSet("a", "r", (DesiredObject(encrypted, Provenance("db.yaml", 0, 1)),))
    with pytest.raises(RenderError) as e:
        stages.prepare(carrying, "id")
    assert "db.yaml:1: Secret/db still carries sops metadata" in str(e.value)
    plain = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    sealed = DesiredSet("a", "r", (DesiredObject(plain, Provenance("c.yaml")),), sealed=True)
    with pytest.raises(RenderError, match="rendered without decrypting"):
        stages.prepare(sealed, "id")
