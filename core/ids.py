"""Public object ids. They sort by creation time (microseconds, fixed-width hex,
then randomness), so cursor pagination is a plain comparison on the primary key."""

import re
import secrets
import time
from datetime import UTC, datetime

_SHAPE = re.compile(r"(?P<micros>[0-9a-f]{14})[0-9a-f]{10}")


def new_id(prefix: str) -> str:
    return f"{prefix}{time.time_ns() // 1000:014x}{secrets.token_hex(5)}"


def issued_at(value: str, *, prefix: str) -> datetime | None:
    """When an id of this shape was issued, or None if `value` is not such an id
    (another prefix, another length, not hex)."""
    shape = _SHAPE.fullmatch(value[len(prefix):]) if value.startswith(prefix) else None
    if shape is None:
        return None
    return datetime.fromtimestamp(int(shape["micros"], 16) / 1e6, tz=UTC)
