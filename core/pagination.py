"""OpenAI-style cursor lists: {"object":"list","data",...,"has_more","first_id","last_id"}."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import serializers

from core.errors import BatchGenError
from core.representation import represent_many


def invalid_cursor(after: str, *, kind: str) -> BatchGenError:
    """A cursor that names no position in the list: answered 400, never with the
    first page again (a client paging on would start over without noticing)."""
    return BatchGenError(
        f"after={after!r} names no {kind} of this list; a cursor is the `last_id` of the "
        "page before.", param="after", code="invalid_cursor")


def newest_first(queryset: QuerySet, *, after: str | None, owner=None, kind: str) -> QuerySet:
    """The rows of a list newest first (ids sort by creation time), an owner's only
    when one is given, from after the cursor `after` (a 400 if it names no row)."""
    rows = queryset.order_by("-id")
    if owner is not None:
        rows = rows.filter(owner=owner)
    if after:
        if not rows.filter(id=after).exists():
            raise invalid_cursor(after, kind=kind)
        rows = rows.filter(id__lt=after)
    return rows


def list_page(queryset: QuerySet, *, limit: int, serializer_class) -> dict:
    rows = list(queryset[: limit + 1])
    has_more = len(rows) > limit
    rows = rows[:limit]
    return {
        "object": "list",
        "data": represent_many(serializer_class, rows),
        "has_more": has_more,
        "first_id": rows[0].pk if rows else None,
        "last_id": rows[-1].pk if rows else None,
    }


def list_envelope_serializer(name: str, item_serializer) -> type[serializers.Serializer]:
    """A serializer class describing a list envelope, for the OpenAPI schema."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "object": serializers.CharField(default="list"),
            "data": item_serializer(many=True),
            "has_more": serializers.BooleanField(),
            "first_id": serializers.CharField(allow_null=True),
            "last_id": serializers.CharField(allow_null=True),
        },
    )
