"""`gitops-agent import --from argocd` notes what an app's files hold that the agent does not do
as Argo CD does: hooks of an app's deletion, Jsonnet (sync waves, sync hooks, generateName hooks
and a chart's dependencies: none, the agent does as Argo CD does)."""

from __future__ import annotations

from pathlib import Path

from agent.imports.content import content_notes


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_delete_hooks_and_jsonnet_are_noted_with_their_files_and_sync_hooks_and_waves_are_not(
    tmp_path: Path,
) -> None:
    hook = "kind: Job\nmetadata:\n  generateName: pre-\n  annotations: {argocd.argoproj.io/hook: PreSync}\n"
    cleanup = "kind: Job\nmetadata:\n  name: bye\n  annotations: {argocd.argoproj.io/hook: PostDelete}\n"
    root = _tree(
        tmp_path,
        {
            "hooks/kustomization.yaml": "resources: [job.yaml, cleanup.yaml]\n",
            "hooks/job.yaml": hook,
            "hooks/cleanup.yaml": cleanup,
            "hooks/unused.yaml": "metadata: {annotations: {argocd.argoproj.io/hook: PreDelete}}\n",
            "chart/Chart.yaml": "apiVersion: v2\nname: c\nversion: 0.1.0\n"
            "dependencies: [{name: redis, version: 1.0.0, repository: https://charts.example.com}]\n",
            "chart/templates/x.yaml": "metadata: {annotations: {argocd.argoproj.io/sync-wave: '1'}}\n",
            "jsonnet/main.jsonnet": "{}\n",
        },
    )
    hooks = [f"{n.what} because {n.why}" for n in content_notes(root, "hooks", "Application a")]
    assert hooks == [
        "Application a PostDelete in hooks/cleanup.yaml because the agent never deletes an app on its "
        "own, so its PostDelete hooks never run",
    ]  # the PreSync generateName hook runs as under Argo CD; unused.yaml is not a resource: not noted
    assert content_notes(root, "chart", "Application c") == []  # waves and dependencies: as Argo CD
    assert [n.why for n in content_notes(root, "jsonnet", "Application j")] == [
        "the agent renders no Jsonnet: commit its YAML output"
    ]
    assert content_notes(root, "missing", "Application m") == []
