"""How `make test` splits the suite between its pytest-xdist workers.

Most of the suite's time is spent waiting on real processes (servers starting,
brokers cut off and back, batches draining), so two workers overlap that waiting
on a 2-core machine. Two rules keep that safe:

- A test file runs whole in one worker (`--dist loadfile`): its tests share module
  fixtures such as a started server, and tests/e2e/test_batches_e2e.py the shared
  broker's default queues.
- Every file of the real engine (module-level `pytestmark = pytest.mark.vllm`) is one
  unit, run first, in one worker: vLLM's CPU build takes every core it is given, so
  two engines side by side would each take twice as long as the tests' deadlines
  allow for, and this unit is the longest, so it starts at once rather than last.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

REAL_ENGINE = "real-engine"


@cache
def is_real_engine_file(path: str) -> bool:
    """Whether a test file marks all its tests `vllm` (read from its source, as the
    xdist controller collects nothing itself)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return False
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "pytestmark"
                for target in node.targets):
            return any(isinstance(sub, ast.Attribute) and sub.attr == "vllm"
                       for sub in ast.walk(node.value))
    return False


class RealEngineFirst(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return REAL_ENGINE if is_real_engine_file(str(self.config.rootpath / path)) else path


def make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own scheduler for the other modes
    return RealEngineFirst(config, log)


def prepare_worker_items(items: list) -> None:
    """Runs in every worker, on the same collection, so their orders agree."""
    # schemathesis 4.32 on pytest 9.2 gives every operation's item (`test[GET /path]`)
    # the bare function's node id; xdist keys its work by node id and would run one
    # of them. pytest reads an item's id from `_id` (a NodeId) since 9.2.
    for item in items:
        if "[" in item.name and not item.nodeid.endswith(f"::{item.name}"):
            unique = f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}"
            try:
                from _pytest.nodeid import NodeId
            except ImportError:  # before pytest 9.2 the id was the string `_nodeid`
                item._nodeid = unique
            else:
                item._id = NodeId.parse(unique)
    # The real engine's unit first (xdist keeps the collection's order of units).
    items.sort(key=lambda item: not is_real_engine_file(str(item.path)))
