"""Rendering model objects with their output serializers, without rebuilding the
serializer's fields on every call.

`Serializer(obj).data` builds (and, for a ModelSerializer, derives from the model)
every field anew each time: most of the CPU of a `GET /v1/batches/{id}` poll. An
output serializer's fields hold no per-object state, so one bound instance per class
renders every object, from any thread; the serializer stays the single definition of
the JSON (and of the OpenAPI schema)."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from rest_framework import serializers


@functools.cache
def _shared(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    serializer = serializer_class()
    serializer.fields  # noqa: B018 - build and bind them once, here
    return serializer


def represent(serializer_class: type[serializers.Serializer], instance) -> dict:
    """The same dict as `serializer_class(instance).data`."""
    return _shared(serializer_class).to_representation(instance)


def represent_many(serializer_class: type[serializers.Serializer], instances: Iterable) -> list:
    serializer = _shared(serializer_class)
    return [serializer.to_representation(instance) for instance in instances]
