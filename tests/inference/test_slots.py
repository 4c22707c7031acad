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


def test_token_budget_holds_back_what_would_overflow_the_engine():
    slots = SlotPool(10, token_budget=100)
    assert slots.try_acquire(tokens=60)
    assert not slots.try_acquire(tokens=50)  # 110 > 100
    assert slots.try_acquire(tokens=40)
    assert slots.tokens_active == 100
    slots.release(tokens=60)
    assert slots.try_acquire(tokens=50) and slots.tokens_active == 90


def test_an_oversized_request_still_runs_alone():
    slots = SlotPool(10, token_budget=100)
    assert slots.try_acquire(tokens=5_000)
    assert not slots.try_acquire(tokens=1)
    slots.release(tokens=5_000)
    assert slots.active == 0 and slots.tokens_active == 0


def test_estimate_counts_prompt_and_output_limit():
    from inference.slots import DEFAULT_OUTPUT_ESTIMATE, estimate_tokens
    from serving.engines.base import EngineRequest

    chat = EngineRequest("r", "c", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x" * 400}],
                          "max_completion_tokens": 50})
    assert 100 <= estimate_tokens(chat) - 50 <= 110
    open_ended = EngineRequest("r", "c", "/v1/completions", {"prompt": "y" * 40})
    assert estimate_tokens(open_ended) == 11 + DEFAULT_OUTPUT_ESTIMATE


def test_estimate_counts_the_output_of_each_of_n_choices():
    from inference.slots import estimate_tokens
    from serving.engines.base import EngineRequest

    body = {"messages": [{"role": "user", "content": "x" * 400}], "max_completion_tokens": 50}
    one = estimate_tokens(EngineRequest("r", "c", "/v1/chat/completions", body))
    four = estimate_tokens(EngineRequest("r", "c", "/v1/chat/completions", {**body, "n": 4}))

    assert four - one == 3 * 50


def test_a_shared_prefix_counts_once_while_requests_hold_it():
    from inference.slots import Cost

    # 100 tokens each, 80 of them a shared system prompt: the engine's prefix cache
    # holds those once, so three such requests take 80 + 3 x 20 = 140 tokens.
    slots = SlotPool(10, token_budget=150)
    shared = Cost(100, prefix=7, shared=80)
    assert slots.try_acquire(cost=shared)
    assert slots.try_acquire(cost=shared) and slots.try_acquire(cost=shared)
    assert slots.tokens_active == 140 and slots.prefixes_active == 1
    assert not slots.try_acquire(cost=Cost(100, prefix=8, shared=80))  # another prefix
    for _ in range(3):
        slots.release(cost=shared)
    assert slots.tokens_active == 0 and slots.prefixes_active == 0


def test_a_prefix_is_counted_until_its_last_request_leaves():
    from inference.slots import Cost

    slots = SlotPool(10, token_budget=1000)
    shared = Cost(100, prefix=7, shared=80)
    slots.try_acquire(cost=shared)
    slots.try_acquire(cost=shared)
    slots.release(cost=shared)  # the first holder leaves, the prefix stays
    assert slots.tokens_active == 100
    slots.release(cost=shared)
    assert slots.tokens_active == 0


def test_estimate_shares_the_system_prompt_of_a_chat():
    from inference.slots import estimate_cost
    from serving.engines.base import EngineRequest

    def chat(question):
        return EngineRequest("r", "c", "/v1/chat/completions", {
            "max_tokens": 10, "messages": [{"role": "system", "content": "s" * 800},
                                           {"role": "user", "content": question}]})

    one, two = estimate_cost(chat("why?")), estimate_cost(chat("how, exactly?"))
    assert one.prefix == two.prefix and 200 <= one.shared < one.tokens
    alone = estimate_cost(EngineRequest("r", "c", "/v1/chat/completions", {
        "max_tokens": 10, "messages": [{"role": "user", "content": "s" * 800}]}))
    assert alone.shared <= 512 // 4 + 4  # a lone message: its first characters only
    embedding = estimate_cost(EngineRequest("r", "c", "/v1/embeddings", {"input": "s" * 800}))
    assert embedding.shared == 0 and embedding.prefix is None


def test_chunks_admit_in_the_order_they_joined():
    from inference.slots import Cost

    slots = SlotPool(2)
    woken = []
    first, second = object(), object()
    slots.join(first, lambda: woken.append("first"))
    slots.join(second, lambda: woken.append("second"))
    assert slots.admit(second, [Cost(1)]) == 0  # the older chunk goes first
    assert slots.admit(first, [Cost(1)] * 3) == 2  # as many as fit
    slots.release(tokens=1)
    assert woken == ["first"]  # room freed: the chunk whose turn it is hears of it
    slots.leave(first)
    assert woken == ["first", "second"]
    assert slots.admit(second, [Cost(1)]) == 1


def test_admission_from_the_engine_keeps_its_queue_at_the_depth():
    from inference.slots import Cost

    slots = SlotPool(100, token_budget=None)
    slots.follow_engine(queue_depth=3)
    woken = []
    chunk = object()
    slots.join(chunk, lambda: woken.append(chunk))
    assert slots.admit(chunk, [Cost(1)] * 10) == 3  # the engine runs none yet: 3 queued
    assert slots.engine_queued == 3
    slots.engine_load(running=3)  # it took all three in: room for three more
    assert woken == [chunk]
    assert slots.admit(chunk, [Cost(1)] * 7) == 3
    slots.engine_load(running=3)  # the same figure again: nothing to wake for
    assert woken == [chunk]
    slots.engine_load(running=5)
    assert woken == [chunk, chunk] and slots.admit(chunk, [Cost(1)] * 4) == 2
    assert slots.engine_queued == 3


def test_a_finished_request_makes_room_before_the_engine_reports_it():
    from inference.slots import Cost

    slots = SlotPool(100)
    slots.follow_engine(queue_depth=1)
    chunk = object()
    slots.join(chunk, lambda: None)
    assert slots.admit(chunk, [Cost(1)] * 3) == 1
    slots.engine_load(running=1)
    assert slots.admit(chunk, [Cost(1)] * 2) == 1
    assert slots.admit(chunk, [Cost(1)]) == 0  # one running, one queued
    # The running one finished: its place is taken at once, not a step later when the
    # engine reports it (the queued one moves up meanwhile).
    slots.release(cost=Cost(1))
    assert slots.admit(chunk, [Cost(1)] * 2) == 1
    assert slots.engine_queued == 1


def test_admission_from_the_engine_still_respects_slots_and_an_explicit_budget():
    from inference.slots import Cost

    slots = SlotPool(4, token_budget=100)
    slots.follow_engine(queue_depth=10)
    chunk = object()
    slots.join(chunk, lambda: None)
    assert slots.admit(chunk, [Cost(40)] * 3) == 2  # the budget
    slots.engine_load(running=2)
    assert slots.admit(chunk, [Cost(10)] * 5) == 2  # the slots
    with pytest.raises(ValueError):
        slots.follow_engine(0)


def test_busy_seconds_count_the_time_a_request_was_held(monkeypatch):
    """The engine's working time for the ETA's cost fit: while at least one request
    is in hand, not the time between (nor twice for two at once)."""
    clock = [100.0]
    monkeypatch.setattr("inference.slots.time.monotonic", lambda: clock[0])
    slots = SlotPool(4)
    assert slots.try_acquire()
    clock[0] = 102.0
    assert slots.try_acquire()  # two at once: still one engine's time
    clock[0] = 103.0
    slots.release()
    assert slots.busy_seconds == 3.0  # one still held: counted up to now
    clock[0] = 104.0
    slots.release()
    clock[0] = 110.0  # idle
    assert slots.busy_seconds == 4.0
    assert slots.try_acquire()
    clock[0] = 111.5
    assert slots.busy_seconds == 5.5
