"""Model multiplexing on PostgreSQL and RabbitMQ: two workers (`serve
--inference-workers 2 --multiplex`) serve five models; the simulated engine's model
load costs 3 s and its stop 1 s. A large batch of one model runs first; four small
batches of the four others are submitted behind it, and one worker is SIGKILLed in
the middle of a swap (the supervisor starts it again).

What must hold: each small batch completes within the wait bound
(BATCHGEN_MAX_MODEL_WAIT_SECONDS) of its creation while the large one still has work
(its model was taken off a worker for them, not waited out), every batch completes
with each custom_id once, the killed worker's swap loses nothing, no 5xx and no error
line."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from datetime import datetime

import psutil

from tests.e2e.harness import wait_until
from tests.faults.faults import assert_each_custom_id_once, request_ids
from tests.fleet.fleet import error_lines, pg_query

FINISHED = {"completed", "failed", "cancelled"}
MODELS = ["big", "s1", "s2", "s3", "s4"]
LARGE, SMALL = 24_000, 60
MAX_WAIT = 120.0
# 100 ms a request and 16 slots: 160 requests/s a worker at most, so the large batch
# would hold both workers for well over a minute, beyond the stretch (8 s asked,
# raised to ten swaps' time: 40 s) after which the small ones take workers from it; a
# swap costs 4 s of engine stop and start plus its hand-back.
SETTINGS = {"BATCHGEN_SIM_LATENCY_MS": "100", "BATCHGEN_MAX_POOL_SIZE": "16",
            "BATCHGEN_CHUNK_SIZE": "40", "BATCHGEN_MODEL_STRETCH_SECONDS": "8",
            "BATCHGEN_MAX_MODEL_WAIT_SECONDS": str(MAX_WAIT),
            "BATCHGEN_ENGINE_ARGS": json.dumps({"start_seconds": 3, "stop_seconds": 1})}


def lines(model: str, count: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"{model}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": f"n {i}"}]},
    }).encode() + b"\n" for i in range(count))


def swapping_worker(database_url: str) -> int | None:
    """The pid of a live worker told to hold a model it does not hold yet (mid-swap)."""
    rows = pg_query(database_url,
                    "SELECT w.pid FROM inference_worker w JOIN inference_residency r "
                    "ON r.worker = w.name WHERE w.stopped_at IS NULL AND r.model != '' "
                    "AND w.model != r.model")
    return rows[0][0] if rows else None


SWAP_TASK = re.compile(r"Task residency\.swap\[[^\]]+\] succeeded in [^:]+: \{'swap': (\d+),")


def shown_swaps(logs) -> set[int]:
    """The swaps the control worker ran a residency.swap task for (Flower's view)."""
    return {int(match) for path in logs
            for match in SWAP_TASK.findall(path.read_text(errors="replace"))}


def test_two_workers_serve_five_models_within_the_wait_bound_through_a_kill(
        fleet_backends, start_fleet, tmp_path):
    database_url, broker_url = fleet_backends
    models = ",".join(f"{name}={tmp_path / 'models' / 'SmolLM2-135M-Instruct'}"
                      for name in MODELS)
    fleet = start_fleet(workers=2, database_url=database_url, broker_url=broker_url,
                        args=("--multiplex",), BATCHGEN_MODELS=models, **SETTINGS)
    api = fleet.api

    # Given: the large batch running, then four small ones of other models behind it
    large = api.create_batch(api.upload(lines("big", LARGE))["id"]).json()
    api.wait_status(large["id"], {"in_progress"}, timeout=60)
    wait_until(lambda: api.batch(large["id"])["request_counts"]["completed"] > 0,
               timeout=120, message="the large batch running")
    small = {model: api.create_batch(api.upload(lines(model, SMALL))["id"]).json()
             for model in MODELS[1:]}

    # When: a worker is SIGKILLed in the middle of a swap
    pid = wait_until(lambda: swapping_worker(database_url), timeout=120, interval=0.05,
                     message="a worker swapping")
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=10) if psutil.pid_exists(pid) else None

    # Then: every batch completes, each custom_id once, the small ones within the bound
    done = {model: api.wait_status(batch["id"], FINISHED, timeout=300)
            for model, batch in small.items()}
    large_then = api.batch(large["id"])["request_counts"]["completed"]
    large_done = api.wait_status(large["id"], FINISHED, timeout=400)
    assert_each_custom_id_once(api, large_done, request_ids(LARGE, "big"))
    late = {}
    for model, batch in done.items():
        assert_each_custom_id_once(api, batch, request_ids(SMALL, model))
        took = batch["completed_at"] - batch["created_at"]
        if took > MAX_WAIT:
            late[model] = took
    swaps = pg_query(database_url, "SELECT worker, from_model, to_model, reason, decided_at, "
                                   "seconds FROM inference_modelswap ORDER BY id")
    history = "\n".join(f"{w[-12:]} {f or '-'} -> {t} ({r}) at "
                        f"{d.astimezone().strftime('%H:%M:%S') if isinstance(d, datetime) else d}"
                        f" took {s}" for w, f, t, r, d, s in swaps)
    assert late == {}, f"small batches later than {MAX_WAIT} s: {late}\n{history}"
    assert {to for _, _, to, *_ in swaps} == set(MODELS), history
    assert large_then < LARGE, "the small batches waited for the large one to finish"
    assert {"stretch", "deadline"} & {reason for *_, reason, _, _ in swaps}, history
    # Flower shows each swap the workers made as a residency.swap task (run on the
    # control worker; logged with its result): all but one the killed worker was making
    made = {row[0] for row in pg_query(
        database_url, "SELECT s.id FROM inference_modelswap s WHERE s.seconds IS NOT NULL "
        f"AND s.worker NOT IN (SELECT name FROM inference_worker WHERE pid = {pid})")}
    shown = wait_until(lambda: (ids := shown_swaps(fleet.logs)) >= made and ids,
                       timeout=60, message="every swap shown as a residency.swap task")
    assert made and shown <= {row[0] for row in pg_query(
        database_url, "SELECT id FROM inference_modelswap")}
    assert api.server_errors == []
    assert error_lines(fleet.logs, expected_exits=[pid]) == []
    print(f"{len(swaps)} residency decisions, {time.strftime('%H:%M:%S')}:\n{history}")
