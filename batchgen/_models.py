"""The base of the client's typed objects (`batchgen.types`): stdlib dataclasses, so
the client keeps its few dependencies (it may be installed without the server).

An object is built from the server's JSON by `construct`, leniently, as openai-python
does: a field the server left out is None, a field the client does not know yet is
kept in the raw dict (so a newer server never breaks an older client), and nothing is
validated. Each object also reads as the dict it came from (`batch["status"]`,
`batch.get("error")`, `dict(batch)`, `batch.to_dict()`), so code written against the
dict-returning methods keeps working with it.

A class's fields mirror one component of the server's OpenAPI schema, named by its
`__component__`: a field without a default is one the schema requires, and a required
field may be None exactly when the schema makes it nullable.
tests/client/test_types_schema.py holds them to that.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="BaseObject")


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class BaseObject(Mapping[str, Any]):
    """A typed server object that also answers as its raw dict."""

    # The schema component this class mirrors (None: not checked).
    __component__: ClassVar[str | None] = None
    _raw: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def construct(cls: type[T], data: Mapping[str, Any]) -> T:
        """The object for `data` (a decoded JSON object), nested objects included."""
        if isinstance(data, BaseObject):
            data = data._raw
        kwargs = {}
        for name, hint in _field_hints(cls).items():
            kwargs[name] = _convert(hint, data.get(name))
        return cls(_raw=dict(data), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A copy of the JSON object the server sent, unknown fields included."""
        return copy.deepcopy(self._raw)

    # Mapping: item access reads the raw JSON, as the dict-returning methods did.
    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    # From the raw dict, not from iteration (a page iterates its items), so that
    # `dict(obj)` is the JSON object on every kind.
    def keys(self):  # type: ignore[override]
        return self._raw.keys()

    def items(self):  # type: ignore[override]
        return self._raw.items()

    def values(self):  # type: ignore[override]
        return self._raw.values()

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BaseObject):
            return type(self) is type(other) and self._raw == other._raw
        if isinstance(other, Mapping):
            return self._raw == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dict it stands for

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                          for f in dataclasses.fields(self) if not f.name.startswith("_"))
        return f"{type(self).__name__}({shown})"


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def object_type(hint: Any) -> tuple[type[BaseObject] | None, bool]:
    """(the BaseObject class a field holds, or None; whether it holds a list of them),
    looking through `X | None`."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is list:
        inner, _ = object_type(typing.get_args(hint)[0])
        return inner, True
    if isinstance(hint, type) and issubclass(hint, BaseObject):
        return hint, False
    return None, False


def is_optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _convert(hint: Any, value: Any) -> Any:
    cls, many = object_type(hint)
    if cls is None or value is None:
        return value
    if many:
        # Lenient: anything that is not an object is passed through as it came.
        return [cls.construct(v) if isinstance(v, Mapping) else v for v in value] \
            if isinstance(value, list) else value
    return cls.construct(value) if isinstance(value, Mapping) else value
