"""The agent reads YAML the way Kubernetes does: every value equals ``sigs.k8s.io/yaml``'s JSON.

The oracle is ``yaml.YAMLToJSONStrict`` of sigs.k8s.io/yaml at the version the pinned
Kubernetes uses, built from tools/go/yamljson/ by ``scripts/install-go-tools`` into the cache;
it cuts a stream into documents as Kubernetes' readers do and prints each as JSON, or why it
refused it. The agent's reading (substitution off) must give the same JSON value, type for type,
for a table of scalars and documents and for every YAML file of the real-world corpus and every
document its charts and kustomizations render; a document the oracle refuses, the agent refuses.
"""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.render.binaries import tool
from agent.render.manifests import Origin, objects_of, parse_yaml
from tests.yamlkit import kubernetes_reads

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
OBJECT = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: t}\n"

#: Scalars whose reading differs between YAML 1.1 parsers, each read as ``v: <scalar>``.
SCALARS = [
    *("=", "1:20", "190:20:30.15", "12:30", "0o17", "0O17", "1e3", "1E3", "1e+3", "1.0e3", "1.5e-3"),
    *(".5e3", "1e21", "1e20", "1e-7", "1e999", "1e-999", ".1e999", "0777", "08", "09.5", "007", "00"),
    *("0x1F", "0X1F", "-0x1F", "+0x1F", "0x_1F", "0x-1", "0x1.8p1", "0b101", "-0b101", "+0b101", "0B101"),
    *("1_000", "1__0", "_1", "1_", "3.14_15", "._5", ".1_0", "1_.5", "0o", "0x", "1e", "+1", "-1", "+0"),
    *("-0", "9223372036854775807", "9223372036854775808", "-9223372036854775809"),
    *("18446744073709551615", "18446744073709551616", "99999999999999999999", "999999999999999999999999"),
    *("0xFFFFFFFFFFFFFFFF", "0x10000000000000000", "1.", ".5", "+.5", "-.5", ".", "1.5", "-1.5", "1.0"),
    *("-0.0", "0.1", "0.", "Inf", "+inf", ".inf", "-.inf", "+.Inf", ".nan", ".NaN"),
    *("yes", "Yes", "YES", "on", "On", "ON", "y", "Y", "true", "True", "TRUE", "tRUE"),
    *("no", "No", "NO", "off", "Off", "oFF", "n", "N", "false", "False", "FALSE"),
    *("~", "null", "Null", "NULL", "nULL", "", "<<", "1/2", "-", "a: b"),
    *("2024-01-01", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5", "2024-1-2"),
    *('"1"', "'yes'", '"~"', "! 1", "! yes", "!!str 1", "!!str", '!!int "1"', "!!float 1", '!!float "1.5"'),
    *("!!int 1.5", '!!int "08"', "!!int", "!!null x", '!!null ""', '!!bool "yes"', "!!bool y"),
    *("|\n  yes\n", ">-\n  1\n  2\n", "[1, y, ~, 0o10, 1e3]", "{a: 1.0}"),
]

#: Whole documents: keys, duplicates, merges, aliases.
DOCUMENTS = {
    "a duplicate key": "a: 1\na: 2\n",
    "a key a merge sets and the mapping sets again": "b: &b {x: 1, y: 2}\na:\n  <<: *b\n  x: 3\n",
    "the same, the merge last": "b: &b {x: 1, y: 2}\na:\n  x: 3\n  <<: *b\n",
    "two merges that set one key": "a: &a {x: 1}\nb: &b {x: 2}\nc:\n  <<: [*a, *b]\n",
    "two merges of distinct keys": "a: &a {x: 1}\nb: &b {z: 2}\nc:\n  <<: [*a, *b]\n",
    "a merge of what it does not set": "b: &b {x: 1}\na:\n  <<: *b\n  z: 3\n",
    "a merge of a sequence": "b: &b [1]\na:\n  <<: *b\n",
    "an int key": "80: http\n",
    "a float key": "1.5: a\n0.1: b\n1e6: c\n3.14159265358979: d\n",
    "a whole float key": "1.0: a\n1e3: b\n",
    "a boolean key": "y: a\nno: b\n",
    "a null key": "~: a\n",
    "a uint64 key": "9223372036854775808: a\n",
    "a list key": "[1]: a\n",
    "an int key and its string": "1: a\n'2': b\n",
    "the same int key twice": "1: a\n01: b\n",
    "an alias of a scalar": "x: &a 1\nz: *a\n",
    "an explicit !!str in a flow mapping": "a: {b: !!str 2}\n",
    "a date key": "2024-01-01: a\n",
}


def same(a: Any, b: Any) -> bool:
    """Equal JSON values of the same JSON types (``1`` is not ``1.0``, ``1`` is not ``True``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def agrees(text: str) -> str:
    """Why the agent's reading of a stream differs from Kubernetes' ("" when it agrees).

    The agent refuses a document when parsing or the object checks (which refuse what JSON
    cannot carry: ``.inf``) report a problem; empty documents are left out on both sides.
    """
    theirs = kubernetes_reads(text)
    docs, problems = parse_yaml(text, Origin("t.yaml"), None)
    refused = any("error" in t for t in theirs)
    if refused or problems:
        if not (refused and problems):
            return f"Kubernetes: {theirs}; the agent: {[p.message for p in problems] or 'accepted'}"
        return ""
    ours = [d.value for d in docs if d.value is not None]
    kube = [t["doc"] for t in theirs if t["doc"] is not None]
    if not (len(ours) == len(kube) and all(same(a, b) for a, b in zip(ours, kube, strict=True))):
        return f"Kubernetes: {kube!r:.300}; the agent: {ours!r:.300}"
    return ""


@pytest.mark.parametrize("scalar", SCALARS)
def test_a_scalar_reads_as_kubernetes_reads_it(scalar: str) -> None:
    text = f"{OBJECT}v: {scalar}\n"
    docs, problems = parse_yaml(text, Origin("t.yaml"), None)
    objects, invalid = objects_of(docs, Origin("t.yaml"))
    (theirs,) = kubernetes_reads(text)
    if "error" in theirs:
        assert problems or invalid, f"Kubernetes refuses it ({theirs['error']}); the agent read {docs}"
        return
    assert not problems and not invalid, [p.message for p in [*problems, *invalid]]
    ((obj, _),) = objects
    assert same(obj, theirs["doc"]), f"Kubernetes: {theirs['doc']['v']!r}; the agent: {obj['v']!r}"


@pytest.mark.parametrize("text", list(DOCUMENTS.values()), ids=list(DOCUMENTS))
def test_a_document_reads_as_kubernetes_reads_it_or_is_refused_as_it_refuses_it(text: str) -> None:
    if text == DOCUMENTS["an int key and its string"]:  # distinct keys, as go-yaml reads them
        assert parse_yaml(text, Origin("t.yaml"), None)[0][0].value == {"1": "a", "2": "b"}
    assert agrees(text) == ""


def test_a_key_kubernetes_reads_two_ways_is_refused_as_a_duplicate() -> None:
    """``1`` and ``"1"`` are distinct to go-yaml but one JSON key: Kubernetes keeps either value,
    depending on Go's map order; the agent refuses the document instead of guessing."""
    docs, problems = parse_yaml("1: a\n'1': b\n", Origin("t.yaml"), None)
    assert docs == [] and [p.message for p in problems] == [
        "duplicate mapping key '1' (YAML would keep only one) (first at line 1)"
    ]


#: What random scalars are made of: the characters and pieces YAML 1.1 and Go's number syntax
#: give meaning to.
_PIECES = [*"0123456789+-._eExXoObBaAfF:yYnN~", "0x", "0o", "0b", "1e", ".inf", ".nan", "_", "1_0", "9" * 20]
_PIECES += ["true", "Null", "on", "."]


def _random_scalars(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 6))) for _ in range(count)]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("place", ["value", "key"])
def test_random_number_like_scalars_read_as_kubernetes_reads_them(place: str, seed: int) -> None:
    """3,000 scalars per run in one oracle process, as values (``v: s``) and as keys (``s: v``)."""
    scalars = _random_scalars(seed, 3_000)
    docs = [f"{OBJECT}v: {s}\n" if place == "value" else f"{OBJECT}{s}: v\n" for s in scalars]
    verdicts = kubernetes_reads("".join(f"---\n{d}" for d in docs))
    assert len(verdicts) == len(docs)
    wrong = []
    for scalar, doc, theirs in zip(scalars, docs, verdicts, strict=True):
        parsed, problems = parse_yaml(doc, Origin("t.yaml"), None)
        objects, invalid = objects_of(parsed, Origin("t.yaml"))
        refused = bool(problems or invalid)
        if refused != ("error" in theirs) or (not refused and not same(objects[0][0], theirs["doc"])):
            wrong.append(
                (scalar, theirs, [m for m, _ in objects], [p.message for p in [*problems, *invalid]])
            )
    assert wrong == []


def _plain_files() -> list[Path]:
    """The corpus' YAML files but Helm templates (Go templates, not YAML until rendered)."""
    return sorted(
        p for p in CORPUS.rglob("*") if p.suffix in (".yaml", ".yml") and "templates" not in p.parts
    )


KUSTOMIZATIONS = sorted(p.parent for p in (CORPUS / "opentelemetry-operator").rglob("kustomization.yaml"))
CHARTS = {
    # cert-manager ships its CRDs only when asked; the kube version is the pinned Kubernetes'.
    "ingress-nginx-chart": (),
    "cert-manager-chart": ("--set", "crds.enabled=true"),
}


def test_the_corpus_is_where_the_tests_read_it() -> None:
    assert len(_plain_files()) >= 200 and len(KUSTOMIZATIONS) >= 10, CORPUS


@pytest.mark.parametrize("path", _plain_files(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_every_yaml_file_of_the_corpus_reads_as_kubernetes_reads_it(path: Path) -> None:
    assert agrees(path.read_text()) == ""


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(CORPUS)))
def test_every_document_kustomize_builds_from_the_corpus_reads_as_kubernetes_reads_it(
    directory: Path,
) -> None:
    out = subprocess.run(
        [str(tool("kustomize")), "build", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip(), f"kustomize built nothing from {directory}"
    assert agrees(out.stdout) == ""


@pytest.mark.parametrize("chart", list(CHARTS))
def test_every_document_helm_renders_from_the_corpus_charts_reads_as_kubernetes_reads_it(chart: str) -> None:
    kube_version = re.search(
        r"^KUBERNETES_VERSION=v?(\S+)$", (ROOT / "tools" / "versions.env").read_text(), re.M
    )
    assert kube_version is not None
    out = subprocess.run(
        [
            str(tool("helm")),
            "template",
            "release",
            str(CORPUS / chart),
            "--kube-version",
            kube_version.group(1),
            *list(CHARTS[chart]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.count("\n---\n") >= 10 and agrees(out.stdout) == ""


def test_the_oracle_is_sigs_k8s_io_yaml_at_the_pinned_version() -> None:
    go_mod = (ROOT / "tools" / "go" / "yamljson" / "go.mod").read_text()
    assert re.search(r"^require sigs\.k8s\.io/yaml v1\.6\.0$", go_mod, re.M), go_mod
