"""Public object ids. They sort by creation time (microseconds, fixed-width hex,
then randomness), so cursor pagination is a plain comparison on the primary key."""

import secrets
import time


def new_id(prefix: str) -> str:
    return f"{prefix}{time.time_ns() // 1000:014x}{secrets.token_hex(5)}"
