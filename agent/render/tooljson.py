"""A tool's output read through krender's JSON: ``json.loads`` instead of parsing its YAML here.

Called by ``agent.render.renderer`` for kustomize and helm output. Reading that output was most of
a chart's or a kustomization's render after the tool's own run: libyaml and the walk over its
nodes take ~0.1 s per MB, and charts and kustomizations print their CRDs (cert-manager's chart:
1 MB), while ``json.loads`` of the same as JSON takes a few milliseconds.

krender (tools/go/krender, ``tojson.go``) reads an *ordinary* stream with go-yaml v2 as
sigs.k8s.io/yaml does -- the reading the agent's own parser matches (tests/test_yaml_oracle.py)
-- and prints every document as JSON with the line its root node starts on, keys in their
order. Any other stream (tags, anchors with aliases, merge keys, keys that are not strings,
duplicate keys, syntax errors, deep nesting, unusual line breaks) it hands back, and
``manifests.parse_yaml`` reads it: the reference for every value, message and line. So the
documents are the ones ``parse_yaml`` makes, index and line included (tests/test_tooljson.py),
but for the lines of the items of a ``List``: a caller that keeps those (no
``Sops.output_docs``) passes ``item_lines`` and gets a stream with a List parsed here.

kustomize output is converted inside the build (``krender -json``; with ``-yaml-if '${'`` where
the app substitutes: substitution needs the YAML, a plain ``${N}`` becomes a number), helm's by
``krender -convert`` on its text, where it is large enough to be worth a process start.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import LocalClusterError, RenderProblem
from agent.render.binaries import tool
from agent.render.manifests import Document, Origin, parse_yaml
from agent.render.tools import Runner

#: Output below this many characters is parsed here: a process start costs more than libyaml takes.
CONVERT_MIN_CHARS = 64 * 1024
#: ``krender -json``'s YAML (handed back) with substitution on: what substitution acts on.
SUBSTITUTED = "${"

#: Documents of a stream read by krender, or ``None`` where the agent reads it itself.
Converter = Callable[[str], list[Document] | None]


def read_output(
    text: str,
    origin: Origin,
    variables: Mapping[str, str] | None,
    *,
    convert: Converter | None = None,
    item_lines: bool = False,
) -> tuple[list[Document], list[RenderProblem]]:
    """The documents of a tool's output: krender's JSON as printed (``krender -json``, whose YAML
    never starts with ``[``), YAML through ``convert`` where it reads it, else ``parse_yaml``."""
    docs = documents(text) if text.startswith("[") else convert(text) if convert is not None else None
    if docs is None or (item_lines and any(_is_list(d.value) for d in docs)):
        return parse_yaml(text, origin, variables)
    return docs, []


def documents(text: str) -> list[Document]:
    """krender's JSON documents (``[line, value]`` each) as the parser's documents."""
    return [Document(value, index, line or None) for index, (line, value) in enumerate(json.loads(text))]


def converter(cwd: Path, *, timeout: float, max_output: int, runner: Runner) -> Converter | None:
    """``krender -convert`` of a YAML stream (at least ``CONVERT_MIN_CHARS`` long), run as the tools
    are (``runner``: bounded); a stream it hands back (exit 3) or a failed run is read here.
    ``None`` where krender is not installed."""
    try:
        krender = tool("krender")
    except LocalClusterError:
        return None

    def convert(text: str) -> list[Document] | None:
        if len(text) < CONVERT_MIN_CHARS:
            return None
        try:
            res = runner(
                [str(krender), "-convert"],
                cwd=cwd,
                env={},
                timeout=timeout,
                max_output=max_output,
                stdin=text.encode("utf-8"),
            )
        except OSError:
            return None
        if res.returncode != 0 or res.timed_out or res.truncated or res.out_of_memory:
            return None
        return documents(res.stdout.decode("utf-8"))

    return convert


def _is_list(value: Any) -> bool:
    return isinstance(value, dict) and str(value.get("kind", "")).endswith("List") and "items" in value
