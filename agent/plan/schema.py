"""A pure index of the server's OpenAPI v3 schemas, for the plan stage.

The plan needs to know, for any field of any kind, what server-side apply
knows: whether a list is ``atomic``, a ``set`` or a ``map`` keyed by
``x-kubernetes-list-map-keys`` (and the defaults of those keys), whether a map
is atomic (``x-kubernetes-map-type``), whether a field is a struct field or a
map entry, and whether a value is a ``Quantity`` or ``IntOrString``.

``SchemaIndex.from_openapi_v3(documents)`` takes the already-fetched JSON of
``/openapi/v3/<group-version>`` documents (the cluster module fetches them once
per cluster and caches them); nothing here does I/O. ``root_node(index, group,
version, kind)`` returns a ``Node`` to walk; when the index is missing or does
not know the kind it returns a ``FallbackNode`` whose conservative guesses
(well-known list-map keys of core types, every other list atomic) can cost an
extra write but never hide a change or claim a path the server would not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Protocol

_REF_PREFIX = "#/components/schemas/"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
#: Defaults the API server's Go code sets inside atomic structs that its OpenAPI documents do
#: not publish (no ``default``; checked against a real server by tests/test_plan_defaults.py).
#: Without them a Git value that leaves one out reads as drift on every pass.
_UNPUBLISHED_DEFAULTS: dict[str, dict[str, Any]] = {
    "io.k8s.api.core.v1.ObjectFieldSelector": {"apiVersion": "v1"},
    "io.k8s.api.core.v1.ResourceFieldSelector": {"divisor": "0"},
    "io.k8s.api.networking.v1.NetworkPolicyPort": {"protocol": "TCP"},
    # Webhook rules and admission policies' resource rules (istio, gateway-api's policy).
    "io.k8s.api.admissionregistration.v1.RuleWithOperations": {"scope": "*"},
    "io.k8s.api.admissionregistration.v1.NamedRuleWithOperations": {"scope": "*"},
    "io.k8s.api.admissionregistration.v1.MatchResources": {"matchPolicy": "Equivalent"},
}


@dataclass(frozen=True)
class ListInfo:
    """How server-side apply merges one list."""

    type: str = "atomic"  # "atomic" | "set" | "map"
    keys: tuple[str, ...] = ()
    #: Defaults of key fields, used when an item omits one (``protocol: TCP`` of ports).
    key_defaults: tuple[tuple[str, Any], ...] = ()

    def key_default(self, name: str) -> Any:
        return dict(self.key_defaults).get(name)


ATOMIC_LIST = ListInfo()


class Node(Protocol):
    """One position in a kind's schema; walkers descend with ``field``/``item``."""

    @property
    def typed(self) -> bool:
        """True when the server converts values to Go types (built-in kinds): quantities are canonicalised."""
        ...

    def field(self, name: str) -> Node: ...

    def is_struct_field(self, name: str) -> bool:
        """Whether ``name`` is a declared property (apply tracks map entries, not struct fields)."""
        ...

    def item(self) -> Node: ...

    def field_default(self, name: str) -> Any:
        """The value the server gives field ``name`` when a write leaves it out; ``None``: none known."""
        ...

    def list_info(self) -> ListInfo: ...

    @property
    def atomic_map(self) -> bool: ...

    @property
    def int_or_string(self) -> bool: ...

    @property
    def quantity(self) -> bool: ...


# ---------------------------------------------------------------------------
# From OpenAPI v3


@dataclass(eq=False)
class SchemaIndex:
    """Component schemas of every fetched document, and which one describes each (group, version, kind).

    Grows with ``add_document`` as the reconciler fetches group-versions (once per cluster);
    the planner only reads it.
    """

    components: dict[str, Mapping[str, Any]] = dc_field(default_factory=dict)
    kinds: dict[tuple[str, str, str], str] = dc_field(default_factory=dict)
    #: Kinds served by CRDs: values are stored as sent, so quantities are not canonicalised.
    custom: set[tuple[str, str, str]] = dc_field(default_factory=set)

    @classmethod
    def from_openapi_v3(cls, documents: Iterable[Mapping[str, Any]]) -> SchemaIndex:
        index = cls()
        for doc in documents:
            index.add_document(doc)
        return index

    def add_document(self, document: Mapping[str, Any]) -> None:
        """Index one ``/openapi/v3/<group-version>`` document."""
        schemas: Mapping[str, Mapping[str, Any]] = (document.get("components") or {}).get("schemas") or {}
        self.components.update(schemas)
        for name, schema in schemas.items():
            for gvk in schema.get("x-kubernetes-group-version-kind") or ():
                key = (str(gvk.get("group", "")), str(gvk.get("version", "")), str(gvk.get("kind", "")))
                # Option kinds (DeleteOptions...) share GVKs across documents; a list kind has "items".
                if key in self.kinds and "items" in (schema.get("properties") or {}):
                    continue
                self.kinds[key] = name
                # CRD schemas are inlined under a reverse-domain name; built-in types live under io.k8s.
                if not name.startswith("io.k8s."):
                    self.custom.add(key)
                else:
                    self.custom.discard(key)

    def knows(self, group: str, version: str, kind: str) -> bool:
        return (group, version, kind) in self.kinds

    def resolve(self, schema: Mapping[str, Any]) -> tuple[Mapping[str, Any], frozenset[str]]:
        """Follow ``$ref``/single ``allOf`` chains; returns the merged schema and the names passed through."""
        names: set[str] = set()
        merged: dict[str, Any] = {}
        current: Mapping[str, Any] | None = schema
        for _ in range(32):  # a chain longer than this is a cycle
            if current is None:
                break
            ref = current.get("$ref")
            all_of = current.get("allOf")
            if ref is None and isinstance(all_of, list) and len(all_of) == 1:
                ref = all_of[0].get("$ref")
            # The outer schema's extensions (list-type, defaults) win over the target's.
            for k, v in current.items():
                if k not in ("$ref", "allOf"):
                    merged.setdefault(k, v)
            if not isinstance(ref, str) or not ref.startswith(_REF_PREFIX):
                break
            name = ref[len(_REF_PREFIX) :]
            names.add(name)
            current = self.components.get(name)
        return merged, frozenset(names)


@dataclass(frozen=True, eq=False)
class SchemaNode:
    """A node of an OpenAPI v3 schema, resolved; ``raw`` is the schema at this position."""

    index: SchemaIndex
    raw: Mapping[str, Any]
    typed: bool = True
    _resolved: list[Any] = dc_field(default_factory=list, repr=False)

    def _schema(self) -> tuple[Mapping[str, Any], frozenset[str]]:
        if not self._resolved:  # memoised: frozen, so cache in a list
            self._resolved.append(self.index.resolve(self.raw))
        resolved: tuple[Mapping[str, Any], frozenset[str]] = self._resolved[0]
        return resolved

    def _child(self, raw: Mapping[str, Any] | None) -> Node:
        if raw is None:
            return UNKNOWN_TYPED if self.typed else UNKNOWN
        return SchemaNode(self.index, raw, self.typed)

    def field(self, name: str) -> Node:
        s, _ = self._schema()
        props = s.get("properties") or {}
        if name in props:
            return self._child(props[name])
        extra = s.get("additionalProperties")
        return self._child(extra if isinstance(extra, Mapping) else None)

    def is_struct_field(self, name: str) -> bool:
        s, _ = self._schema()
        return name in (s.get("properties") or {})

    def item(self) -> Node:
        s, _ = self._schema()
        items = s.get("items")
        return self._child(items if isinstance(items, Mapping) else None)

    def field_default(self, name: str) -> Any:
        s, names = self._schema()
        prop = (s.get("properties") or {}).get(name)
        if not isinstance(prop, Mapping):
            return None
        published = self.index.resolve(prop)[0].get("default")
        if published is not None or not self.typed:
            return published
        return next((d[name] for n in names if name in (d := _UNPUBLISHED_DEFAULTS.get(n, {}))), None)

    def list_info(self) -> ListInfo:
        s, _ = self._schema()
        kind = s.get("x-kubernetes-list-type", "atomic")
        if kind == "set":
            return ListInfo("set")
        if kind == "map":
            keys = tuple(s.get("x-kubernetes-list-map-keys") or ())
            if not keys:
                return ATOMIC_LIST
            item = self.item()
            defaults: list[tuple[str, Any]] = []
            if isinstance(item, SchemaNode):
                props = item._schema()[0].get("properties") or {}
                for k in keys:
                    if k in props:
                        d = self.index.resolve(props[k])[0].get("default")
                        if d is not None:
                            defaults.append((k, d))
            return ListInfo("map", keys, tuple(defaults))
        return ATOMIC_LIST

    @property
    def atomic_map(self) -> bool:
        return self._schema()[0].get("x-kubernetes-map-type") == "atomic"

    @property
    def int_or_string(self) -> bool:
        s, names = self._schema()
        return (
            bool(s.get("x-kubernetes-int-or-string"))
            or s.get("format") == "int-or-string"
            or _INT_OR_STRING in names
        )

    @property
    def quantity(self) -> bool:
        # Only a built-in Quantity is canonicalised by the server; a CRD stores "1000m" as sent.
        return self.typed and _QUANTITY in self._schema()[1]


# ---------------------------------------------------------------------------
# Without a schema: conservative, name-based guesses


#: Well-known associative lists of core types, by field name: (keys, key defaults).
_LIST_MAPS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]] = {
    "containers": (("name",), ()),
    "initContainers": (("name",), ()),
    "ephemeralContainers": (("name",), ()),
    "env": (("name",), ()),
    "volumes": (("name",), ()),
    "volumeMounts": (("mountPath",), ()),
    "volumeDevices": (("devicePath",), ()),
    "imagePullSecrets": (("name",), ()),
    "hostAliases": (("ip",), ()),
    "ownerReferences": (("uid",), ()),
    "topologySpreadConstraints": (("topologyKey", "whenUnsatisfiable"), ()),
    "resourceClaims": (("name",), ()),
    "conditions": (("type",), ()),
}
_CONTAINER_LISTS = frozenset({"containers", "initContainers", "ephemeralContainers"})
_SET_LISTS = frozenset({"finalizers"})
#: Maps the server replaces whole (selectors, object references).
_ATOMIC_MAPS = frozenset(
    {
        "selector", "podSelector", "namespaceSelector", "labelSelector", "nodeSelector",
        "configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef", "configMapRef", "secretRef",
        "scaleTargetRef", "roleRef", "matchConstraints", "matchResources",
    }
)  # fmt: skip
_QUANTITY_MAPS = frozenset({"limits", "requests", "hard", "capacity", "allocatable", "overhead"})
#: ``_UNPUBLISHED_DEFAULTS`` by (kind, field name); kind "" matches any kind.
_FIELD_DEFAULTS: dict[tuple[str, str], dict[str, Any]] = {
    ("", "fieldRef"): {"apiVersion": "v1"},
    ("", "resourceFieldRef"): {"divisor": "0"},
    ("NetworkPolicy", "ports"): {"protocol": "TCP"},
    ("ValidatingAdmissionPolicy", "resourceRules"): {"scope": "*"},
    ("ValidatingAdmissionPolicy", "excludeResourceRules"): {"scope": "*"},
    ("ValidatingAdmissionPolicy", "matchConstraints"): {"matchPolicy": "Equivalent"},
    ("ValidatingAdmissionPolicyBinding", "resourceRules"): {"scope": "*"},
    ("ValidatingAdmissionPolicyBinding", "excludeResourceRules"): {"scope": "*"},
    ("ValidatingAdmissionPolicyBinding", "matchResources"): {"matchPolicy": "Equivalent"},
}
_INT_OR_STRING_FIELDS = frozenset({"targetPort", "maxSurge", "maxUnavailable", "minAvailable"})


@dataclass(frozen=True)
class FallbackNode:
    """Name-based guesses for one position; ``names``: field names from the root, list items skipped."""

    kind: str = ""
    names: tuple[str, ...] = ()
    typed: bool = True
    #: A preserve-unknown-fields subtree: server-side apply treats every key as a map entry.
    deduced: bool = False

    def field(self, name: str) -> Node:
        # metadata is always ObjectMeta, even for custom resources.
        typed = self.typed or (not self.names and name == "metadata")
        return FallbackNode(self.kind, (*self.names, name), typed, self.deduced)

    def is_struct_field(self, name: str) -> bool:
        # Guessing "struct field" for entries of free-form maps is harmless: those maps hold
        # scalars in core kinds, and a scalar's own path is owned either way.
        return not self.deduced

    def item(self) -> Node:
        return FallbackNode(self.kind, self.names, self.typed, self.deduced)

    def field_default(self, name: str) -> Any:
        if not self.typed or self.deduced or not self.names:
            return None
        for kind in ("", self.kind):
            defaults = _FIELD_DEFAULTS.get((kind, self.names[-1]))
            if defaults and name in defaults:
                return defaults[name]
        return None

    def list_info(self) -> ListInfo:
        last = self.names[-1] if self.names else ""
        parent = self.names[-2] if len(self.names) > 1 else ""
        if last in _SET_LISTS and self.names[:1] == ("metadata",):
            return ListInfo("set")
        if not self.typed:
            return ATOMIC_LIST
        if last == "ports":
            if parent in _CONTAINER_LISTS:
                return ListInfo("map", ("containerPort", "protocol"), (("protocol", "TCP"),))
            if self.kind == "Service" and self.names == ("spec", "ports"):
                return ListInfo("map", ("port", "protocol"), (("protocol", "TCP"),))
            return ATOMIC_LIST
        if last in _LIST_MAPS:
            keys, defaults = _LIST_MAPS[last]
            return ListInfo("map", keys, defaults)
        return ATOMIC_LIST

    @property
    def atomic_map(self) -> bool:
        return bool(self.names) and self.names[-1] in _ATOMIC_MAPS and self.typed

    @property
    def int_or_string(self) -> bool:
        if not self.names:
            return False
        last = self.names[-1]
        return last in _INT_OR_STRING_FIELDS or (
            last == "port" and len(self.names) > 1 and self.names[-2] in ("httpGet", "tcpSocket")
        )

    @property
    def quantity(self) -> bool:
        if not self.typed or not self.names:
            return False
        return (len(self.names) > 1 and self.names[-2] in _QUANTITY_MAPS) or self.names[-1] == "sizeLimit"


#: A position the schema does not describe (preserve-unknown-fields): every list atomic, maps granular.
UNKNOWN = FallbackNode(typed=False, names=("<unknown>",), deduced=True)
UNKNOWN_TYPED = FallbackNode(typed=True, names=("<unknown>",), deduced=True)


def builtin_group(group: str) -> bool:
    """Groups whose objects the server decodes into Go types (core, ``apps``, ``*.k8s.io``)."""
    return "." not in group or group.endswith(".k8s.io")


def root_node(index: SchemaIndex | None, group: str, version: str, kind: str) -> Node:
    """The schema root of one kind, or conservative fallbacks when the index does not know it."""
    if index is not None:
        name = index.kinds.get((group, version, kind))
        if name is not None:
            typed = (group, version, kind) not in index.custom
            return SchemaNode(index, index.components[name], typed)
    return FallbackNode(kind=kind, typed=builtin_group(group))
