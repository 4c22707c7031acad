"""The worker's slots: how many requests may be inside its engine at once."""

from __future__ import annotations

import threading


class SlotPool:
    """A counting semaphore that also tells how many slots are in use."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a worker needs at least one slot")
        self.capacity = capacity
        self._active = 0
        self._cond = threading.Condition()

    @property
    def active(self) -> int:
        return self._active

    @property
    def free(self) -> int:
        return self.capacity - self._active

    def try_acquire(self) -> bool:
        with self._cond:
            if self._active >= self.capacity:
                return False
            self._active += 1
            return True

    def acquire(self, timeout: float | None = None) -> bool:
        with self._cond:
            if not self._cond.wait_for(lambda: self._active < self.capacity, timeout):
                return False
            self._active += 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._active <= 0:
                raise RuntimeError("slot released more often than acquired")
            self._active -= 1
            self._cond.notify()
