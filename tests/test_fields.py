"""The fieldsV1 codec and the owned-path set of a manifest (agent/plan/fields.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.model import FieldPath
from agent.plan.fields import (
    decode_fields_v1,
    encode_fields_v1,
    field_element,
    index_element,
    key_element,
    manifest_paths,
    parse_element,
    pointer_to_path,
    remove_path,
    render_path,
    value_element,
)
from agent.plan.schema import root_node

# Names with the characters that break naive parsers: dots, colons, slashes, quotes, unicode.
_names = st.text(alphabet="abcXYZ.:/-_\"'{}é ", min_size=1, max_size=12)
_scalars = st.one_of(st.integers(-5, 70000), st.text(max_size=8), st.booleans(), st.none())
_elements = st.one_of(
    _names.map(field_element),
    st.dictionaries(
        _names, st.one_of(st.integers(0, 65535), st.text(max_size=6)), min_size=1, max_size=3
    ).map(key_element),
    _scalars.map(value_element),
    st.integers(0, 20).map(index_element),
)
_paths = st.lists(_elements, min_size=1, max_size=5).map(tuple)


@settings(max_examples=300)
@given(st.sets(_paths, max_size=25))
def test_decoding_an_encoded_set_gives_the_set_back(paths: set[FieldPath]) -> None:
    encoded = encode_fields_v1(paths)
    assert decode_fields_v1(encoded) == paths
    # Through real JSON too, as the API server stores it.
    assert decode_fields_v1(json.loads(json.dumps(encoded))) == paths


@settings(max_examples=200)
@given(st.sets(_paths, max_size=25))
def test_encoding_a_decoded_trie_gives_the_trie_back(paths: set[FieldPath]) -> None:
    trie = encode_fields_v1(paths)
    assert encode_fields_v1(decode_fields_v1(trie)) == trie


def test_dot_marks_a_node_that_is_a_member_and_has_children() -> None:
    trie: dict[str, Any] = {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}
    assert decode_fields_v1(trie) == {
        ("f:metadata", "f:labels"),
        ("f:metadata", "f:labels", "f:app"),
    }
    assert encode_fields_v1(decode_fields_v1(trie)) == trie


def test_parses_a_real_apply_entry_with_multi_field_keys_and_set_values() -> None:
    trie = {
        "f:metadata": {
            "f:finalizers": {'v:"example.com/x"': {}},
            "f:labels": {"f:app.kubernetes.io/name": {}},
        },
        "f:spec": {
            "f:ports": {'k:{"protocol":"TCP","port":80}': {".": {}, "f:port": {}, "f:targetPort": {}}},
        },
    }
    paths = decode_fields_v1(trie)
    # Key fields come back in canonical (sorted) order whatever order the server wrote.
    assert ("f:spec", "f:ports", 'k:{"port":80,"protocol":"TCP"}', "f:targetPort") in paths
    assert ("f:metadata", "f:finalizers", 'v:"example.com/x"') in paths
    assert ("f:metadata", "f:labels", "f:app.kubernetes.io/name") in paths
    assert (
        render_path(("f:spec", "f:ports", 'k:{"port":80,"protocol":"TCP"}'))
        == "spec.ports[port=80,protocol=TCP]"
    )


def test_keys_with_dots_and_colons_stay_one_element() -> None:
    path = (field_element("example.com/a:b"), key_element({"name": "x:y.z"}))
    assert decode_fields_v1(encode_fields_v1({path})) == {path}
    assert parse_element(path[1]) == ("k", {"name": "x:y.z"})


@pytest.mark.parametrize("bad", ["x:1", "spec", 'k:["a"]'])
def test_rejects_elements_that_are_not_field_path_elements(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_fields_v1({bad: {}})


DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "d", "labels": {"app": "web"}, "finalizers": ["a/b"]},
    "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "spec": {
                "containers": [
                    {"name": "app", "image": "i", "args": ["a", "b"], "ports": [{"containerPort": 80}]}
                ]
            }
        },
    },
    "status": {"replicas": 1},
}


def test_manifest_paths_follow_server_side_apply_list_types() -> None:
    paths = {render_path(p) for p in manifest_paths(DEPLOYMENT, root_node(None, "apps", "v1", "Deployment"))}
    assert paths == {
        "metadata.labels.app",
        'metadata.finalizers["a/b"]',  # set list: v: element
        "spec.selector",  # atomic map: a leaf
        "spec.template.spec.containers[name=app]",  # list-map item: a member itself
        "spec.template.spec.containers[name=app].name",
        "spec.template.spec.containers[name=app].image",
        "spec.template.spec.containers[name=app].args",  # atomic list: a leaf
        "spec.template.spec.containers[name=app].ports[containerPort=80,protocol=TCP]",  # defaulted key
        "spec.template.spec.containers[name=app].ports[containerPort=80,protocol=TCP].containerPort",
    }


def test_an_associative_item_without_its_key_makes_the_list_atomic() -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"image": "i"}]},
    }
    assert manifest_paths(doc, root_node(None, "", "v1", "Pod")) == {("f:spec", "f:containers")}


def test_json_pointers_resolve_to_field_paths_and_removal_follows_keys() -> None:
    node = root_node(None, "apps", "v1", "Deployment")
    path = pointer_to_path("/spec/template/spec/containers/0/image", DEPLOYMENT, node)
    assert path == ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"app"}', "f:image")
    assert pointer_to_path("/spec/template/spec/containers/name=app/image", DEPLOYMENT, node) == path
    assert pointer_to_path("/spec/selector/matchLabels/app", DEPLOYMENT, node) == ("f:spec", "f:selector")
    assert pointer_to_path("/metadata/annotations/a~1b", DEPLOYMENT, node) == (
        "f:metadata", "f:annotations", "f:a/b",
    )  # fmt: skip
    assert pointer_to_path("spec", DEPLOYMENT, node) is None
    doc = json.loads(json.dumps(DEPLOYMENT))
    assert remove_path(doc, path, node)
    assert "image" not in doc["spec"]["template"]["spec"]["containers"][0]
    assert not remove_path(doc, path, node)
