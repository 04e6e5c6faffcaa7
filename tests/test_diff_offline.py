"""``gitops-agent diff --offline``: two commits of a real Git repository, no cluster at all.

The kubeconfigs in these configs point nowhere: offline mode must never
touch a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent
from typing import Any

import jsonschema
import pygit2
from click.testing import CliRunner, Result

from agent.cli.diff import diff
from agent.dev.demo import commit_directory
from tests.agentkit import make_repo, write_config
from tests.sopskit import age_key, encrypt

BASE_FILES = {
    "clusters/alpha/app.yaml": """
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: web, namespace: shop, labels: {app: web}}
        spec:
          replicas: 2
          selector: {matchLabels: {app: web}}
          template:
            metadata: {labels: {app: web}}
            spec:
              containers:
                - {name: web, image: "nginx:1.27"}
                - {name: log, image: "busybox:1"}
        ---
        apiVersion: v1
        kind: Service
        metadata: {name: web, namespace: shop}
        spec:
          selector: {app: web}
          ports: [{port: 80}]
        """,
    "clusters/beta/app.yaml": """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: settings, namespace: shop}
        data: {greeting: hello}
        """,
}

HEAD_FILES = {
    "clusters/alpha/app.yaml": """
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: web, namespace: shop, labels: {app: web}}
        spec:
          replicas: 2
          selector: {matchLabels: {app: web}}
          template:
            metadata: {labels: {app: web}}
            spec:
              containers:
                - {name: web, image: "nginx:1.28"}
                - {name: log, image: "busybox:1"}
        """,
    "clusters/alpha/flags.yaml": """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: flags, namespace: shop}
        data: {checkout: "on"}
        """,
    "clusters/beta/app.yaml": BASE_FILES["clusters/beta/app.yaml"],
}


#: A kubeconfig whose server is a closed port: offline mode must never need it.
NOWHERE = """apiVersion: v1
kind: Config
clusters: [{name: x, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: x, user: {token: unused}}]
contexts: [{name: x, context: {cluster: x, user: x}}]
current-context: x
"""


def run(*args: str) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(diff, ["--offline", *args, "--format", "json"], catch_exceptions=False)
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else {}


def by_key(doc: dict[str, Any], cluster: str) -> dict[str, dict[str, Any]]:
    section = next(c for c in doc["clusters"] if c["name"] == cluster)
    return {o["key"]: o for a in section["apps"] for o in a["objects"]}


def test_offline_reports_added_changed_and_removed_objects_between_two_commits(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, BASE_FILES)
    base = str(pygit2.Repository(str(repo.path)).head.target)
    repo.commit(HEAD_FILES, "bump web, add flags, drop the service")
    nowhere = tmp_path / "nowhere.kubeconfig"
    nowhere.write_text(NOWHERE)
    cfg = write_config(tmp_path, repo, {"alpha": nowhere, "beta": nowhere})
    nowhere.unlink()  # offline needs no credentials: a CI runner without cluster access has none

    result, doc = run("--repo", str(repo.path), "--base", base, "--head", "main", "--config", cfg.file)
    assert result.exit_code == 1, result.output
    assert doc["mode"] == "offline" and doc["base"]["sha"] == base and doc["revision"]["ref"] == "main"
    alpha = by_key(doc, "alpha")
    assert {k: o["action"] for k, o in alpha.items()} == {
        "ConfigMap/shop/flags": "create",
        "Deployment.apps/shop/web": "update",
        "Service/shop/web": "prune",
    }
    web = alpha["Deployment.apps/shop/web"]
    assert web["fields"] == [
        {
            "path": "spec.template.spec.containers[name=web].image",
            "op": "replace",
            "before": "nginx:1.27",
            "after": "nginx:1.28",
        }
    ]
    assert "busybox" not in web["diff"] and "+          image: nginx:1.28" in web["diff"]
    assert by_key(doc, "beta") == {}
    assert doc["clusters"][1]["summary"]["unchanged"] == 1

    md = CliRunner().invoke(
        diff,
        [
            "--offline",
            "--repo",
            str(repo.path),
            "--base",
            base,
            "--head",
            "main",
            "--config",
            cfg.file,
            "--format",
            "markdown",
        ],
    )
    assert md.exit_code == 1
    assert "<b>removed</b> <code>Service/shop/web</code>" in md.stdout
    assert "<b>added</b> <code>ConfigMap/shop/flags</code>" in md.stdout
    assert "| alpha | 1 | 1 | 1 | 0 | 0 | changes |" in md.stdout


def test_offline_without_config_takes_clusters_by_convention_and_reads_a_working_checkout(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path, BASE_FILES)
    # A PR checkout: a non-bare clone with one more commit on its branch.
    clone = pygit2.clone_repository(str(repo.path), str(tmp_path / "checkout"))
    files = tmp_path / "next"
    extra = {"clusters/gamma/ns.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: g\n"}
    for rel, text in {**HEAD_FILES, **extra}.items():
        (files / rel).parent.mkdir(parents=True, exist_ok=True)
        (files / rel).write_text(dedent(text).lstrip())
    commit_directory(Path(clone.path), files, "pr change")

    result, doc = run("--repo", clone.workdir, "--base", "refs/remotes/origin/main", "--head", "HEAD")
    assert result.exit_code == 1, result.output
    assert [c["name"] for c in doc["clusters"]] == ["alpha", "beta", "gamma"]
    assert "convention" in doc["notes"][0]
    assert by_key(doc, "gamma") == {"Namespace/g": by_key(doc, "gamma")["Namespace/g"]}
    assert by_key(doc, "gamma")["Namespace/g"]["action"] == "create"
    assert by_key(doc, "alpha")["Service/shop/web"]["action"] == "prune"

    same, doc = run("--repo", clone.workdir, "--base", "HEAD", "--head", "HEAD", "--cluster", "alpha")
    assert same.exit_code == 0, same.output
    assert doc["summary"]["differences"] is False


def test_offline_a_cluster_that_does_not_render_gets_an_error_section_the_others_are_complete(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path, BASE_FILES)
    base = str(pygit2.Repository(str(repo.path)).head.target)
    repo.commit({**HEAD_FILES, "clusters/beta/app.yaml": "kind: ConfigMap\nmetadata: [broken\n"}, "oops")
    result, doc = run("--repo", str(repo.path), "--base", base, "--head", "main")
    assert result.exit_code == 2, result.output
    (beta,) = next(c for c in doc["clusters"] if c["name"] == "beta")["apps"]
    assert beta["error"].startswith("head revision") and "clusters/beta/app.yaml" in beta["error"]
    assert len(by_key(doc, "alpha")) == 3


def test_offline_usage_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(diff, ["--offline", "--repo", str(tmp_path)]).exit_code == 2
    assert runner.invoke(diff, ["--repo", str(tmp_path), "--base", "a", "--head", "b"]).exit_code == 2
    assert runner.invoke(diff, []).exit_code == 2
    missing = runner.invoke(
        diff, ["--offline", "--repo", str(tmp_path / "nope"), "--base", "a", "--head", "b"]
    )
    assert missing.exit_code == 2 and "source error" in missing.stderr


# -- encrypted files and Secrets (docs/secrets.md) ---------------------------------------------


def test_offline_flags_a_file_not_encrypted_to_a_target_clusters_recipient_before_merge(
    tmp_path: Path,
) -> None:
    """The PR check holds no private key: it reads recipients; a cluster missing from them fails it."""
    alpha, beta = age_key(), age_key()
    secret = (
        "apiVersion: v1\nkind: Secret\nmetadata: {name: db, namespace: shop}\nstringData: {p: SENTINEL-pw}\n"
    )
    repo = make_repo(tmp_path, {"shared/keep.yaml": BASE_FILES["clusters/beta/app.yaml"]})
    base = str(pygit2.Repository(str(repo.path)).head.target)
    repo.commit(
        {
            "shared/keep.yaml": BASE_FILES["clusters/beta/app.yaml"],
            "shared/db.yaml": encrypt(secret, alpha.recipient),  # beta's recipient forgotten
            "shared/plain.yaml": secret.replace("name: db", "name: plain"),
        },
        "add the database password",
    )
    nowhere = tmp_path / "nowhere.kubeconfig"
    nowhere.write_text(NOWHERE)
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[source]\nurl = "{repo.path}"\n\n'
        + "".join(
            f'[[clusters]]\nname = "{name}"\nkubeconfig = "{nowhere}"\npath = "shared"\n\n'
            f'[clusters.decryption]\nage_key_env = "UNUSED"\nage_recipients = ["{key.recipient}"]\n\n'
            for name, key in (("alpha", alpha), ("beta", beta))
        )
    )
    result, doc = run("--repo", str(repo.path), "--base", base, "--head", "main", "--config", str(cfg))
    assert result.exit_code == 2, result.output  # an error: the check fails before merge
    findings = {
        c["name"]: [(f["kind"], f["severity"], f["file"]) for a in c["apps"] for f in a["findings"]]
        for c in doc["clusters"]
    }
    plaintext = ("plaintext-secret", "warning", "shared/plain.yaml")
    assert findings == {
        "alpha": [plaintext],
        "beta": [("not-encrypted-to", "error", "shared/db.yaml"), plaintext],
    }
    beta_section = next(c for c in doc["clusters"] if c["name"] == "beta")
    assert beta.recipient in beta_section["apps"][0]["findings"][0]["message"]
    # The encrypted Secret is in the diff, its ciphertext masked; nothing was decrypted.
    assert "Secret/shop/db" in by_key(doc, "alpha")
    assert "ENC[" not in result.stdout and "SENTINEL-pw" not in json.dumps(
        by_key(doc, "alpha")["Secret/shop/db"]
    )
    schema = json.loads((Path(__file__).parent.parent / "docs" / "report-schema.json").read_text())
    jsonschema.validate(doc, schema)
    text = CliRunner().invoke(
        diff, ["--offline", "--repo", str(repo.path), "--base", base, "--head", "main", "--config", str(cfg)]
    )
    assert "error: shared/db.yaml: not encrypted to" in text.stdout


def test_offline_a_helm_delete_hook_added_to_a_chart_is_a_skip_not_an_addition(tmp_path: Path) -> None:
    """Live passes never apply a hook of delete/rollback phases only, so the PR's report says so."""
    chart = {
        "clusters/alpha/guard/Chart.yaml": "apiVersion: v2\nname: guard\nversion: 0.1.0\n",
        "clusters/alpha/guard/templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n"
        "  namespace: shop\ndata:\n  k: v\n",
    }
    hook = """
        apiVersion: batch/v1
        kind: Job
        metadata:
          name: scale-to-zero
          namespace: shop
          annotations: {"helm.sh/hook": pre-delete}
        spec:
          template:
            spec:
              restartPolicy: Never
              containers: [{name: k, image: "bitnami/kubectl:1.31"}]
        """
    repo = make_repo(tmp_path, chart)
    base = str(pygit2.Repository(str(repo.path)).head.target)
    repo.commit({**chart, "clusters/alpha/guard/templates/hook.yaml": hook}, "add a pre-delete hook")
    result, doc = run("--repo", str(repo.path), "--base", base, "--head", "main")
    assert result.exit_code == 0, result.output  # nothing the agent would do differs
    entry = by_key(doc, "alpha")["Job.batch/shop/scale-to-zero"]
    assert (entry["action"], entry["skip"]) == ("skip", "helm-hook")
    assert "pre-delete hook" in entry["reason"] and doc["summary"]["created"] == 0


def test_offline_lists_the_waves_and_hooks_of_a_sync_in_the_order_they_would_run(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {"clusters/alpha/app.yaml": BASE_FILES["clusters/beta/app.yaml"]})
    base = str(pygit2.Repository(str(repo.path)).head.target)
    repo.commit(
        {
            "clusters/alpha/app.yaml": """
                apiVersion: v1
                kind: ConfigMap
                metadata:
                  name: settings
                  namespace: shop
                  annotations: {argocd.argoproj.io/sync-wave: "1"}
                data: {greeting: hello}
                ---
                apiVersion: batch/v1
                kind: Job
                metadata:
                  generateName: upgrade-sql-schema-
                  namespace: shop
                  annotations: {argocd.argoproj.io/hook: PreSync}
                spec:
                  template:
                    spec:
                      restartPolicy: Never
                      containers: [{name: migrate, image: "migrate:1"}]
                ---
                apiVersion: v1
                kind: ConfigMap
                metadata: {name: first, namespace: shop}
                data: {k: v}
                """
        },
        "waves and a hook",
    )
    result, doc = run("--repo", str(repo.path), "--base", base, "--head", "main")
    assert result.exit_code == 1, result.output
    schema = json.loads((Path(__file__).parents[1] / "docs" / "report-schema.json").read_text())
    jsonschema.validate(doc, schema)
    (app,) = next(c for c in doc["clusters"] if c["name"] == "alpha")["apps"]
    assert app["sync"] == [
        "pre-sync hooks (wave 0): Job.batch/shop/upgrade-sql-schema- (argocd hook)",
        "wave 0: ConfigMap/shop/first",
        "wave 1: ConfigMap/shop/settings",
    ]
