"""What an Argo CD app's files hold that the agent does not do as Argo CD does, as notes: hooks
of an app's deletion, Jsonnet. (Sync waves, PreSync/Sync/PostSync/SyncFail hooks with their
delete policies, ``generateName`` hooks and Helm hooks run as under Argo CD (docs/ordering.md);
a chart's dependencies from repositories are fetched by the agent's poll, as Argo CD's
``helm dependency build``: no note.)

Called by ``argocd`` for each app whose path is in PATH. Files are searched as text (a chart's
templates are not YAML), those the path reaches only: its kustomization's resources, else every
file under it.
"""

from __future__ import annotations

from pathlib import Path

from agent.imports.model import Note
from agent.imports.reading import MAX_FILE_BYTES, reach
from agent.render.kustomize import kustomization_file

#: Text in a file → why the app does not behave as under Argo CD.
_MARKS = {
    b"PreDelete": "the agent never deletes an app on its own, so its PreDelete hooks never run",
    b"PostDelete": "the agent never deletes an app on its own, so its PostDelete hooks never run",
}


def content_notes(root: Path, path: str, what: str) -> list[Note]:
    """Notes on what ``path`` (PATH-relative) holds; none when it is not a directory in PATH."""
    directory = (root / path).resolve()
    if not directory.is_dir() or not directory.is_relative_to(root.resolve()):
        return []
    notes: list[Note] = []
    if any(directory.glob("*.*sonnet")):
        notes.append(
            Note(f"{what} path {path} (Jsonnet)", "the agent renders no Jsonnet: commit its YAML output")
        )
    if kustomization_file(directory) is not None:
        files = sorted(root.resolve() / f for f in reach(root, path, []).files)
    else:
        files = sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())
    found: dict[bytes, list[str]] = {}
    for file in files:
        if file.stat().st_size > MAX_FILE_BYTES or file.suffix not in (".yaml", ".yml", ".json", ".tpl"):
            continue
        text = file.read_bytes()
        for mark in _MARKS:
            if mark in text:
                found.setdefault(mark, []).append(file.relative_to(root.resolve()).as_posix())
    for mark, where in found.items():
        shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        notes.append(Note(f"{what} {mark.decode().rstrip(':')} in {shown}", _MARKS[mark]))
    return notes
