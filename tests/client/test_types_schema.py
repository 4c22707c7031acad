"""The client's typed objects (batchgen.types, batchgen.pagination) against the
server's OpenAPI schema, generated here by drf-spectacular from the serializers, so
the two cannot drift: a field added to or removed from a serializer fails this test
until the client's type follows.

For each type and the schema component its `__component__` names:
- its fields are the component's properties, by name;
- its fields without a default are the component's `required` ones;
- a required field may be None exactly when the property is `nullable`;
- a field holding a typed object holds the type of the component the property refers to.

This is the one client test that needs the server's packages (Django, DRF,
drf-spectacular): without them it skips, except in CI where it fails.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import batchgen.pagination
import batchgen.types
from batchgen._models import BaseObject, _field_hints, is_optional, object_type
from tests.services import in_ci

# The same page shape answers every cursor list but the batch errors' one.
ALSO_CHECKED = {
    batchgen.pagination.CursorPage: ["FileList", "ModelList", "WebhookEndpointList"],
}


@pytest.fixture(scope="module")
def components() -> dict[str, dict]:
    try:
        from drf_spectacular.generators import SchemaGenerator
    except ImportError as exc:  # the client installed without the server
        if in_ci():
            pytest.fail(f"the server's packages are needed to check the client's types: {exc}")
        pytest.skip(f"the server's packages are not installed ({exc}): "
                    "`pip install .[server]` to check the client's types")
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return schema["components"]["schemas"]


def typed_classes() -> list[type[BaseObject]]:
    """Every public typed object and page of the client."""
    found = []
    for module in (batchgen.types, batchgen.pagination):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseObject):
                found.append(value)
    return found


def referenced_component(prop: dict) -> str | None:
    """The component a property refers to (directly, through allOf, or as its items)."""
    for candidate in (prop, *(prop.get("allOf") or []), prop.get("items") or {}):
        ref = candidate.get("$ref")
        if ref:
            return ref.rsplit("/", 1)[-1]
    return None


def mismatches(cls: type[BaseObject], component: dict) -> list[str]:
    """How `cls` differs from a schema component (empty when it mirrors it)."""
    props = component.get("properties") or {}
    hints = _field_hints(cls)
    problems = []
    if missing := sorted(set(props) - set(hints)):
        problems.append(f"fields the server sends that the type lacks: {missing}")
    if extra := sorted(set(hints) - set(props)):
        problems.append(f"fields the type has that the server no longer sends: {extra}")
    required_fields = {
        f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")
        and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    required = set(component.get("required") or [])
    if required_fields != required:
        problems.append(
            f"required: the schema has {sorted(required)}, the type (fields without a "
            f"default) {sorted(required_fields)}")
    for name in sorted(set(hints) & set(props)):
        hint, prop = hints[name], props[name]
        if name in required and is_optional(hint) != bool(prop.get("nullable")):
            problems.append(f"{name}: nullable is {bool(prop.get('nullable'))} in the schema, "
                            f"the type says {hint}")
        held, _ = object_type(hint)
        ref = referenced_component(prop)
        if held is not None and held.__component__ != ref:
            problems.append(f"{name}: holds {held.__name__} ({held.__component__}), "
                            f"the schema refers to {ref}")
    return problems


def test_every_typed_object_names_a_schema_component():
    unnamed = [cls.__name__ for cls in typed_classes() if not cls.__component__]
    assert typed_classes() and not unnamed


@pytest.mark.parametrize(
    "cls, component_name",
    [(cls, cls.__component__) for cls in typed_classes()]
    + [(cls, name) for cls, names in ALSO_CHECKED.items() for name in names],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_typed_object_matches_the_servers_schema(components, cls, component_name):
    assert component_name in components, f"the schema has no component {component_name}"
    assert mismatches(cls, components[component_name]) == []


def test_a_serializer_change_is_caught(components):
    """The check above can fail: a field added to, or dropped from, a component."""
    batch = components["BatchOutput"]
    added = {**batch, "properties": {**batch["properties"], "priority": {"type": "integer"}}}
    dropped_props = {k: v for k, v in batch["properties"].items() if k != "model"}
    dropped = {**batch, "properties": dropped_props,
               "required": [r for r in batch["required"] if r != "model"]}
    now_nullable = {**batch, "properties": {**batch["properties"],
                                            "model": {"type": "string", "nullable": True}}}

    assert mismatches(batchgen.types.Batch, batch) == []
    assert "['priority']" in mismatches(batchgen.types.Batch, added)[0]
    assert "['model']" in mismatches(batchgen.types.Batch, dropped)[0]
    assert mismatches(batchgen.types.Batch, now_nullable) == [
        "model: nullable is True in the schema, the type says <class 'str'>"]
