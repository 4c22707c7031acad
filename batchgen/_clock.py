"""The only place the client waits or reads the time.

Retry back-off, status polling and wait timeouts all go through these two functions,
so tests replace them (monkeypatch `batchgen._clock.sleep` / `.monotonic`) and never
really sleep.
"""

import time


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def monotonic() -> float:
    return time.monotonic()
