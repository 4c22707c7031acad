"""A chunk's path on a worker (issue 33): traced on the chunk's thread as it runs, in
process with the simulated engine. The path only goes down, and the worker reads its
input and writes its results through its ports:

- no return: no module of the server is entered again while one of its frames is
  still on the thread's stack, i.e. nothing the chunk loop calls calls back into a
  module it came from (before the split, the slot pool ran a generator of the
  runtime's, 1 return per admission round);
- the chunk's own code (inference.runtime, inference.chunk_loop) reaches the batches
  and files packages only through the ports: the input through inference.chunk_input,
  the database through inference.database and the ledger, the incremental file
  through inference.storage_pause."""

from __future__ import annotations

import sys

import pytest

from batches.models import Chunk, ChunkStatus
from files import storage
from files.incremental import append_lines
from inference.output import format_line
from serving.engines.base import EngineResult

pytestmark = pytest.mark.django_db(transaction=True)

SERVER = ("core", "files", "serving", "batches", "inference", "webhooks", "batchgen_site")
CHUNK_CODE = ("inference.runtime", "inference.chunk_loop")
PORTS = {"inference.chunk_input", "inference.database", "inference.ledger",
         "inference.storage_pause"}


class PathTrace:
    """Every call on this thread while active: (caller module, callee module) of each
    call that crosses from one server module to another, and the returns, i.e. calls
    into a server module that is still on the stack below."""

    def __init__(self, packages: tuple[str, ...] = SERVER) -> None:
        self.packages = packages
        self.stack: list[str] = []
        self.crossings: list[tuple[str, str, str]] = []
        self.returns: list[tuple[str, str]] = []

    def _profile(self, frame, event, arg) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            # The nearest server module below (a library between them, as contextlib
            # running a module's own context manager, is not a stop).
            caller = next((m for m in reversed(self.stack)
                           if m.split(".")[0] in self.packages), "")
            if module.split(".")[0] in self.packages and module != caller:
                self.crossings.append((caller, module, frame.f_code.co_name))
                if module in self.stack:
                    self.returns.append((caller, module))
            self.stack.append(module)
        elif event == "return" and self.stack:
            self.stack.pop()

    def __enter__(self) -> PathTrace:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def stops(crossings: list[tuple[str, str, str]]) -> list[str]:
    """The modules the chunk's code calls, in order, each of their functions counted
    at its first call (a loop's repeats are one), consecutive calls into one module
    one stop."""
    seen, path = set(), []
    for caller, callee, function in crossings:
        if caller not in CHUNK_CODE or callee in CHUNK_CODE or (callee, function) in seen:
            continue
        seen.add((callee, function))
        if not path or path[-1] != callee:
            path.append(callee)
    return path


def test_a_chunks_path_only_goes_down_and_through_the_ports(
        runtime_factory, batch_in_progress):
    runtime = runtime_factory()
    batch = batch_in_progress(6, chunk_size=3)
    first, second = Chunk.objects.filter(batch=batch).order_by("index")
    # The second is a redelivery: an earlier attempt wrote one result and died.
    Chunk.objects.filter(id=second.id).update(status=ChunkStatus.RUNNING, attempts=1,
                                              worker="dead-worker",
                                              lease_expires_at="2000-01-01T00:00:00Z")
    append_lines(storage.absolute(storage.incremental_name(batch.id)),
                 [format_line("req-3", EngineResult(body={"earlier": True}))])

    with PathTrace() as trace:
        outcomes = [runtime.run_chunk(first.id), runtime.run_chunk(second.id)]

    assert all("done, 3 completed" in o or "done, 2 completed" in o for o in outcomes), outcomes
    assert trace.returns == []
    path = stops(trace.crossings)
    outside = {m for m in path if not m.startswith("inference.")}
    assert not {m for m in outside if m.split(".")[0] in ("batches", "files")} - {
        "batches.usage"}, path  # Usage: a value the ledger adds up
    assert PORTS <= set(path), path


def test_the_trace_sees_a_return():
    # The check itself: a callback into a module still on the stack is a return
    # (this test's module counted as the server's here).
    from inference import worker_state

    state = worker_state.WorkerState(name="probe")

    class Switch:
        def changed(self) -> None:
            state.going_away()  # back into worker_state, whose switch_queue runs

    state.queue_switch = Switch()
    with PathTrace((*SERVER, "tests")) as trace:
        state.switch_queue()
    assert trace.returns == [("tests.inference.test_chunk_path", "inference.worker_state")]
