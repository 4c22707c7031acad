"""Completion windows: `24h` as OpenAI takes it, and, as an extension, any window
within the server's bounds (BATCHGEN_MIN/MAX_COMPLETION_WINDOW_SECONDS). A batch's
own window sets its `expires_at`; past it the batch ends as the 24 h rule says, with
its partial output (services.batches_expire)."""

from __future__ import annotations

import re

from django.conf import settings

# `90m`, `24h`, `7d`, `3600s`: a whole number and a unit, as OpenAI writes `24h`.
WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class InvalidWindow(ValueError):
    """A window that is not one, or lies outside the server's bounds; says which."""


def window_seconds(window: str) -> int:
    """The seconds of a well-formed window (`24h` -> 86400); InvalidWindow else."""
    match = WINDOW.match(window) if isinstance(window, str) else None
    if match is None:
        raise InvalidWindow(f"completion_window must be a whole number and a unit (s, m, h "
                            f"or d), as `24h`; got {window!r}.")
    return int(match.group(1)) * UNIT_SECONDS[match.group(2)]


def window_check(window: str) -> int:
    """The seconds of `window` if this server accepts it (read per request: the bounds
    are settings); InvalidWindow naming the bounds else. `24h` is always accepted,
    as OpenAI's clients send it whatever the bounds."""
    seconds = window_seconds(window)
    if window == "24h":
        return seconds
    low = settings.BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS
    high = settings.BATCHGEN_MAX_COMPLETION_WINDOW_SECONDS
    if not low <= seconds <= high:
        raise InvalidWindow(f"completion_window must lie between {low} and {high} seconds "
                            f"(this server's bounds) or be `24h`; got {window!r} "
                            f"({seconds} seconds).")
    return seconds
