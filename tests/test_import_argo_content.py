"""`gitops-agent import --from argocd` notes what an app's files hold that the agent does not do
as Argo CD does: hooks, sync waves, generateName, Jsonnet (a chart's dependencies: none, the
agent fetches them)."""

from __future__ import annotations

from pathlib import Path

from agent.imports.content import content_notes


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_hooks_waves_generate_name_dependencies_and_jsonnet_are_noted_with_their_files(
    tmp_path: Path,
) -> None:
    hook = "kind: Job\nmetadata:\n  generateName: pre-\n  annotations: {argocd.argoproj.io/hook: PreSync}\n"
    root = _tree(
        tmp_path,
        {
            "hooks/kustomization.yaml": "resources: [job.yaml]\n",
            "hooks/job.yaml": hook,
            "hooks/unused.yaml": "metadata: {annotations: {argocd.argoproj.io/sync-wave: '1'}}\n",
            "chart/Chart.yaml": "apiVersion: v2\nname: c\nversion: 0.1.0\n"
            "dependencies: [{name: redis, version: 1.0.0, repository: https://charts.example.com}]\n",
            "chart/templates/x.yaml": "metadata: {annotations: {argocd.argoproj.io/sync-wave: '1'}}\n",
            "jsonnet/main.jsonnet": "{}\n",
        },
    )
    hooks = [f"{n.what} because {n.why}" for n in content_notes(root, "hooks", "Application a")]
    assert hooks == [
        "Application a argocd.argoproj.io/hook in hooks/job.yaml because Argo CD hooks run around a sync; "
        "the agent applies them as ordinary objects",
        "Application a generateName in hooks/job.yaml because the agent needs a stable name for every "
        "object: the render refuses generateName",
    ]  # unused.yaml is not a resource of the kustomization: not applied, not noted
    chart = [n.what for n in content_notes(root, "chart", "Application c")]
    assert chart == [
        "Application c argocd.argoproj.io/sync-wave in chart/templates/x.yaml",
    ]
    assert [n.why for n in content_notes(root, "jsonnet", "Application j")] == [
        "the agent renders no Jsonnet: commit its YAML output"
    ]
    assert content_notes(root, "missing", "Application m") == []
