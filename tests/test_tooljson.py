"""Tool output read through krender's JSON gives the documents the agent's own parser makes.

``krender -convert`` (tools/go/krender/tojson.go) prints an ordinary YAML stream as JSON
documents with their lines, and hands back (exit 3) every stream the agent's parser treats on
its own; ``krender -helm-output`` does the same for helm's output piped into it, with helm's
``# Source:`` comments, printing a stream it hands back as it is; ``agent.render.tooljson``
reads either. Compared here with ``parse_yaml`` -- value, key order, index and line of every
document -- on a table of streams and on what the corpus' charts and kustomizations render.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.render import renderer, tooljson
from agent.render.binaries import tool
from agent.render.manifests import MAX_DEPTH, Document, Origin, parse_yaml
from agent.render.renderer import RenderSpec, render
from agent.render.tooljson import documents, helm_json, read_output
from agent.render.tools import source_comments

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
OBJECT = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: t}\n"

#: Streams krender reads: each must give parse_yaml's documents.
CONVERTED = {
    "one object": OBJECT,
    "empty documents and comments": f"# head\n---\n# only a comment\n---\n{OBJECT}---\n---\n",
    "a leading document without a marker": f"{OBJECT}---\n{OBJECT}",
    "helm's source comments": f"---\n# Source: c/a.yaml\n{OBJECT}---\n# Source: c/b.yaml\n",
    "indented content and blank lines": f"\n\n   \n{OBJECT}data:\n  a: |\n    x\n\n    y\n",
    "a list in markdown": f"{OBJECT}data:\n  d: a\n    * b\n    * c\n",
    "an expression with a bang": f"{OBJECT}data:\n  e: 'a ||\n    !has(self.x)'\n",
    "an anchor without alias": f"{OBJECT}data: &d\n  a: b\n",
    "numbers": f"{OBJECT}x: [1, 1.0, 1.5, 1e3, 1e21, 0x1F, 0o17, 077, 18446744073709551615, -0.0, 1e-7]\n",
    "booleans and nulls": f"{OBJECT}v: [yes, no, on, off, true, ~, null, '', y]\n",
    "dates and colons stay strings": f"{OBJECT}v: [2024-01-01, 12:30, '1:2']\n",
    "strings JSON escapes": f'{OBJECT}v: "tab\\there \\u0001 quote\\" back\\\\ é ☃"\n',
    "key order": f"{OBJECT}z: 1\na: 2\nm: {{x: 1, b: 2}}\n",
    "a List": "apiVersion: v1\nkind: List\nitems:\n- " + OBJECT.replace("\n", "\n  ").rstrip() + "\n",
    "a document marker with a comment": f"--- # c\n{OBJECT}",
    "a bare tag (a string, as Kubernetes reads it)": f"{OBJECT}v: ! 1\n",
    "a shell heredoc": f"{OBJECT}data:\n  s: |\n    cat <<EOF\n    x\n    EOF\n",
}

#: Streams krender hands back: the agent's parser reads (or refuses) them itself.
HANDED_BACK = {
    "a tag": f"{OBJECT}v: !!str 1\n",
    "a custom tag": f"{OBJECT}v: !x 1\n",
    "an alias": f"{OBJECT}a: &a {{x: 1}}\nb: *a\n",
    "a merge key": f"{OBJECT}a: {{x: 1}}\nb:\n  <<: {{x: 2}}\n",
    "an int key": f"{OBJECT}data:\n  80: http\n",
    "a key go-yaml reads as a boolean": f"{OBJECT}data:\n  y: a\n",
    "a null key": f"{OBJECT}data:\n  ~: a\n",
    "a duplicate key": f"{OBJECT}data:\n  a: 1\n  a: 2\n",
    "a document marker with content": f"--- {{a: 1}}\n{OBJECT}",
    "a document end marker": f"{OBJECT}...\n",
    "a directive": f"%YAML 1.1\n---\n{OBJECT}",
    "CRLF line ends": OBJECT.replace("\n", "\r\n"),
    "a byte order mark": "\ufeff" + OBJECT,
    "a line separator": f"{OBJECT}v: a\u2028b\n",
    "a syntax error": f"{OBJECT}v: [1\n",
    "a list as a document": "- a\n",
    "a scalar as a document": "a\n",
    "an empty mapping": "{}\n",
    "not a number in JSON": f"{OBJECT}v: .nan\n",
    "deep nesting": OBJECT + "v: " + "[" * 120 + "]" * 120 + "\n",
}


def krender_convert(text: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(tool("krender")), "-convert"], input=text.encode(), capture_output=True, timeout=120
    )


def shape(doc: Document) -> tuple[int, int | None, str]:
    """What a document must agree in: index, line (of a non-empty one), value with key order."""
    return doc.index, doc.line if doc.value is not None else None, json.dumps(doc.value)


def converted(text: str) -> list[Document]:
    out = krender_convert(text)
    assert out.returncode == 0, (out.returncode, out.stderr.decode())
    return documents(out.stdout.decode())


def assert_same_as_parse_yaml(text: str) -> None:
    ours, problems = parse_yaml(text, Origin("t.yaml"), None)
    assert problems == []
    assert [shape(d) for d in converted(text)] == [shape(d) for d in ours]


@pytest.mark.parametrize("text", list(CONVERTED.values()), ids=list(CONVERTED))
def test_krender_converts_an_ordinary_stream_to_the_documents_the_agent_parses(text: str) -> None:
    assert_same_as_parse_yaml(text)


@pytest.mark.parametrize("text", list(HANDED_BACK.values()), ids=list(HANDED_BACK))
def test_krender_hands_back_a_stream_the_agent_reads_on_its_own(text: str) -> None:
    out = krender_convert(text)
    assert (out.returncode, out.stdout) == (3, b"")


def test_output_handed_back_is_parsed_here_with_its_messages_and_lines() -> None:
    text = f"{OBJECT}data:\n  a: 1\n  a: 2\n"
    assert read_output(text, Origin("t.yaml"), None) == parse_yaml(text, Origin("t.yaml"), None)


def krender_helm_output(text: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(tool("krender")), "-helm-output", *args], input=text.encode(), capture_output=True, timeout=120
    )


def helm_output(text: str, *args: str) -> tuple[list[tuple[int, str]], list[Document]] | None:
    out = krender_helm_output(text, *args)
    assert out.returncode == 0, (out.returncode, out.stderr.decode())
    printed = out.stdout.decode()
    found = helm_json(printed)
    assert found is not None or printed == text  # handed back: exactly as helm printed it
    return found


@pytest.mark.parametrize("text", list(CONVERTED.values()), ids=list(CONVERTED))
def test_krender_helm_output_gives_the_documents_and_source_comments_the_agent_finds(text: str) -> None:
    found = helm_output(text)
    assert found is not None
    comments, docs = found
    assert comments == source_comments(text)
    ours, _ = parse_yaml(text, Origin("t.yaml"), None)
    assert [shape(d) for d in docs] == [shape(d) for d in ours]


@pytest.mark.parametrize(
    "text",
    [*HANDED_BACK.values(), "# Source: c/a\x0c\n" + OBJECT, "# Source: c/a\x1c\n" + OBJECT],
    ids=[*HANDED_BACK, "a form feed", "a file separator"],
)
def test_krender_helm_output_prints_a_stream_the_agent_reads_on_its_own_as_it_is(text: str) -> None:
    """The agent then parses it and counts its lines itself (str.splitlines breaks at \\x0c, \\x1c)."""
    assert helm_output(text) is None


def test_a_list_is_handed_back_where_the_caller_keeps_the_lines_of_its_items() -> None:
    text = CONVERTED["a List"]
    assert helm_output(text) is not None
    assert helm_output(text, "-yaml-if-list") is None


def test_krender_helm_output_over_its_limit_prints_one_byte_more_and_fails() -> None:
    """The agent reads that as output over its limit, as it would reading helm itself."""
    out = krender_helm_output(OBJECT * 10, "-max-input", "100")
    assert (out.returncode, out.stdout) == (1, (OBJECT * 10).encode()[:101])


def test_documents_krender_converts_are_never_deeper_than_the_agent_checks() -> None:
    """``Document.json`` spares ``validate`` the walk over every value: krender hands over deeper ones."""
    source = (ROOT / "tools" / "go" / "krender" / "tojson.go").read_text()
    found = re.search(r"^const maxDepth = (\d+)$", source, re.M)
    assert found is not None and int(found.group(1)) <= MAX_DEPTH
    deep = OBJECT + "v: " + "[" * int(found.group(1)) + "]" * int(found.group(1)) + "\n"
    assert krender_convert(deep).returncode == 3


def _kube_version() -> str:
    found = re.search(r"^KUBERNETES_VERSION=v?(\S+)$", (ROOT / "tools" / "versions.env").read_text(), re.M)
    assert found is not None
    return found.group(1)


def _helm(chart: str, *args: str) -> str:
    argv = [str(tool("helm")), "template", "r", str(CORPUS / chart), "--include-crds"]
    argv += ["--kube-version", _kube_version(), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout


def test_the_corpus_charts_output_converts_to_the_documents_the_agent_parses() -> None:
    for text in (_helm("cert-manager-chart", "--set", "crds.enabled=true"), _helm("ingress-nginx-chart")):
        assert_same_as_parse_yaml(text)
        found = helm_output(text)
        assert found is not None and found[0] == source_comments(text)
        assert [shape(d) for d in found[1]] == [shape(d) for d in converted(text)]


@pytest.mark.parametrize("substitute", [False, True])
def test_the_corpus_kustomization_builds_to_the_documents_the_agent_parses(
    tmp_path: Path, substitute: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendered as JSON and as YAML (the reader forced to parse), the objects are the same."""
    spec = RenderSpec("c", ("opentelemetry-operator/default",), vars={} if substitute else None)
    calls: list[Any] = []
    real = tooljson.documents
    monkeypatch.setattr(tooljson, "documents", lambda text: calls.append(1) or real(text))
    as_json = render(CORPUS, spec)
    assert calls == [1]  # read from krender's JSON: no "${" in its values
    build = renderer.kustomize_build
    monkeypatch.setattr(
        renderer, "kustomize_build", lambda *a, **kw: build(*a, **{**kw, "json_unless": None})
    )
    as_yaml = render(CORPUS, spec)
    assert calls == [1]
    assert [(json.dumps(o.manifest), o.provenance) for o in as_json.objects] == [
        (json.dumps(o.manifest), o.provenance) for o in as_yaml.objects
    ]


def test_kustomize_output_with_a_reference_is_substituted_in_its_yaml(tmp_path: Path) -> None:
    """``replicas: ${N}`` becomes a number: substitution reads the YAML, which krender then prints."""
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\n")
    (tmp_path / "cm.yaml").write_text(f"{OBJECT}data: {{a: '${{A}}'}}\nn: ${{N}}\n")
    ds = render(tmp_path, RenderSpec("c", (".",), vars={"A": "x", "N": "3"}))
    ((manifest, _),) = [(o.manifest, o.provenance) for o in ds.objects]
    assert (manifest["data"], manifest["n"]) == ({"a": "x"}, 3)
