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
``Sops.output_docs``) asks krender to hand over a stream with a List (``-yaml-if-list``).

kustomize output is converted inside the build (``krender -json``; with ``-yaml-if '${'`` where
the app substitutes: substitution needs the YAML, a plain ``${N}`` becomes a number), helm's by
``krender -helm-output`` reading helm's output through a pipe (``helm_json``), which also hands
over the lines of helm's ``# Source:`` comments, since the agent no longer has the text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.errors import RenderProblem
from agent.render.manifests import Document, Origin, parse_yaml
from agent.render.tools import helm_sections, source_comments

#: ``krender -json``'s YAML (handed back) with substitution on: what substitution acts on.
SUBSTITUTED = "${"


def read_output(
    text: str, origin: Origin, variables: Mapping[str, str] | None
) -> tuple[list[Document], list[RenderProblem]]:
    """The documents of a tool's output: krender's JSON as printed (``krender -json``, whose YAML
    never starts with ``[``), else ``parse_yaml``'s."""
    if text.startswith("["):
        return documents(text), []
    return parse_yaml(text, origin, variables)


#: How ``krender -helm-output``'s JSON starts; helm's own output starts with ``---`` (or is empty).
HELM_JSON = '{"sources":'


def helm_json(text: str) -> tuple[list[tuple[int, str]], list[Document]] | None:
    """``krender -helm-output``'s ``# Source:`` comments and documents, or ``None`` where it
    printed helm's output as helm did."""
    if not text.startswith(HELM_JSON):
        return None
    found = json.loads(text)
    return [(line, rest) for line, rest in found["sources"]], _documents(found["documents"])


def read_helm_output(text: str, chart_rel: str) -> tuple[tuple[tuple[int, str], ...], list[Document] | None]:
    """The sections of helm's output (``# Source:`` comments as repository paths) and its
    documents as krender printed them, or ``None`` where it printed helm's output for ``parse_yaml``."""
    found = helm_json(text)
    comments, docs = found if found is not None else (source_comments(text), None)
    return helm_sections(comments, chart_rel), docs


def documents(text: str) -> list[Document]:
    """krender's JSON documents (``[line, value]`` each) as the parser's documents."""
    return _documents(json.loads(text))


def _documents(pairs: list[list[Any]]) -> list[Document]:
    return [Document(value, index, line or None, json=True) for index, (line, value) in enumerate(pairs)]
