from __future__ import annotations

import threading

import pytest

from inference.slots import SlotPool


def test_slots_count_what_is_held():
    slots = SlotPool(3)
    assert slots.try_acquire() and slots.try_acquire()
    assert (slots.active, slots.free, slots.capacity) == (2, 1, 3)
    slots.release()
    assert (slots.active, slots.free) == (1, 2)


def test_no_slot_beyond_capacity():
    slots = SlotPool(2)
    assert slots.try_acquire() and slots.try_acquire()
    assert not slots.try_acquire()
    assert not slots.acquire(timeout=0.01)
    assert slots.active == 2


def test_a_released_slot_wakes_a_waiter():
    slots = SlotPool(1)
    slots.try_acquire()
    got = threading.Event()

    def wait_for_slot():
        if slots.acquire(timeout=30):
            got.set()

    waiter = threading.Thread(target=wait_for_slot)
    waiter.start()
    assert not got.is_set()
    slots.release()
    waiter.join(timeout=30)
    assert got.is_set() and slots.active == 1


def test_releasing_more_than_held_is_a_bug():
    slots = SlotPool(1)
    with pytest.raises(RuntimeError):
        slots.release()


def test_a_worker_needs_a_slot():
    with pytest.raises(ValueError):
        SlotPool(0)
