"""Normalised comparison (agent/plan/normalize.py): what the server rewrites is not drift."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agent.plan.normalize import MISSING, canonical_quantity, leaf_equal, parse_quantity, values_equal
from agent.plan.schema import FallbackNode, SchemaIndex, root_node

BUILTIN_CPU = FallbackNode("Deployment", ("spec", "resources", "limits", "cpu"))
CUSTOM_CPU = FallbackNode("Widget", ("spec", "resources", "limits", "cpu"), typed=False)
PLAIN = FallbackNode("ConfigMap", ("data", "x"))
INT_OR_STRING_REF = "#/components/schemas/io.k8s.apimachinery.pkg.util.intstr.IntOrString"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000m", Decimal(1)),
        ("1", Decimal(1)),
        (1, Decimal(1)),
        (0.5, Decimal("0.5")),
        ("500m", Decimal("0.5")),
        ("1Gi", Decimal(1073741824)),
        ("1073741824", Decimal(1073741824)),
        ("1e3", Decimal(1000)),
        ("1k", Decimal(1000)),
        ("128Mi", Decimal(134217728)),
        ("abc", None),
        (True, None),
        ("1Gb", None),
    ],
)
def test_parses_quantities(text: Any, value: Decimal | None) -> None:
    assert parse_quantity(text) == value


def test_built_in_quantities_compare_by_value_custom_ones_as_written() -> None:
    assert leaf_equal("1000m", "1", BUILTIN_CPU, owned_by_us=False)
    memory = FallbackNode("Pod", ("spec", "limits", "memory"))
    assert leaf_equal("1024Mi", "1Gi", memory, owned_by_us=False)
    # Same amount, other format: the server would store "1073741824", so it is a change.
    assert not leaf_equal(1073741824, "1Gi", memory, owned_by_us=False)
    assert not leaf_equal("1000m", "1", CUSTOM_CPU, owned_by_us=False)
    assert not leaf_equal("1000m", "1", PLAIN, owned_by_us=False)


def test_int_or_string_keeps_its_type_only_where_the_schema_says_so() -> None:
    index = SchemaIndex.from_openapi_v3(
        [
            {
                "components": {
                    "schemas": {
                        "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
                            "type": "string",
                            "format": "int-or-string",
                        },
                        "io.k8s.api.core.v1.Svc": {
                            "type": "object",
                            "properties": {
                                "port": {"allOf": [{"$ref": INT_OR_STRING_REF}]},
                                "count": {"type": "integer"},
                            },
                            "x-kubernetes-group-version-kind": [
                                {"group": "", "version": "v1", "kind": "Svc"}
                            ],
                        },
                    }
                }
            }
        ]
    )
    root = root_node(index, "", "v1", "Svc")
    assert root.field("port").int_or_string and not root.field("count").int_or_string
    assert not leaf_equal("80", 80, root.field("port"), owned_by_us=True)
    assert leaf_equal(80, 80.0, root.field("count"), owned_by_us=True)


def test_numbers_are_one_type_but_booleans_are_not_numbers() -> None:
    assert values_equal(1, 1.0)
    assert not values_equal(True, 1)
    assert not values_equal("1", 1)
    assert values_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})


def test_null_and_empty_equal_absent_zero_values_only_when_we_own_them() -> None:
    assert leaf_equal(None, MISSING, PLAIN, owned_by_us=False)
    assert leaf_equal({}, MISSING, PLAIN, owned_by_us=False)
    assert leaf_equal([], MISSING, PLAIN, owned_by_us=False)
    assert not leaf_equal(False, MISSING, PLAIN, owned_by_us=False)
    assert leaf_equal(False, MISSING, PLAIN, owned_by_us=True)
    assert leaf_equal(0, MISSING, PLAIN, owned_by_us=True)
    assert not leaf_equal("x", MISSING, PLAIN, owned_by_us=True)
    assert leaf_equal({"a": {}, "b": 1}, {"b": 1}, PLAIN, owned_by_us=False)


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("1000m", "1"), ("1", "1"), (1, "1"), ("0.5", "500m"), (0.5, "500m"), ("1500m", "1500m"),
        ("1000", "1k"), ("1e3", "1e3"), ("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("1.5Gi", "1536Mi"),
        ("1073741824", "1073741824"), ("512Ki", "512Ki"), ("0.1n", "1n"), ("0", "0"), ("abc", None),
    ],
)  # fmt: skip
def test_quantities_are_spelled_the_way_the_api_server_stores_them(text: Any, stored: str | None) -> None:
    assert canonical_quantity(text) == stored


def test_a_field_left_out_of_an_atomic_map_equals_live_only_when_live_holds_its_default() -> None:
    # A custom resource's atomic map with a published default: the server fills it in after the apply.
    widget = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "target": {
                        "type": "object",
                        "x-kubernetes-map-type": "atomic",
                        "properties": {
                            "name": {"type": "string"},
                            "mode": {"type": "string", "default": "auto"},
                        },
                    }
                },
            }
        },
        "x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Widget"}],
    }
    index = SchemaIndex.from_openapi_v3([{"components": {"schemas": {"com.example.v1.Widget": widget}}}])
    target = root_node(index, "example.com", "v1", "Widget").field("spec").field("target")
    assert target.atomic_map and target.field_default("mode") == "auto"
    assert leaf_equal({"name": "a"}, {"name": "a", "mode": "auto"}, target, owned_by_us=False)
    assert not leaf_equal({"name": "a"}, {"name": "a", "mode": "manual"}, target, owned_by_us=True)
    assert not leaf_equal({"name": "b"}, {"name": "a", "mode": "auto"}, target, owned_by_us=True)
    # A field without a known default is a change even if we own the map: the apply drops it.
    assert not leaf_equal({"mode": "auto"}, {"name": "a", "mode": "auto"}, target, owned_by_us=True)
    # Built-in defaults the OpenAPI documents leave out, with or without a schema.
    field_ref = FallbackNode("Pod", ("spec", "containers", "env", "valueFrom", "fieldRef"))
    assert leaf_equal(
        {"fieldPath": "x"}, {"fieldPath": "x", "apiVersion": "v1"}, field_ref, owned_by_us=False
    )
    assert not leaf_equal(
        {"fieldPath": "y"}, {"fieldPath": "x", "apiVersion": "v1"}, field_ref, owned_by_us=False
    )
