"""What a model swap costs on this machine (issue 27): the vLLM engines a multiplexing
worker stops and starts, in one process as the worker does (`InferenceRuntime.
replace_engine`), with the worker's own engine configs: the bundled chat model, then
the embedding model, then the chat model again, each started and stopped in turn.
Sleep mode is asked for as a multiplexing worker asks; the CPU build has none, so
each swap here is a stop and a start.

    .venv/bin/python benchmarks/swap_cost.py --embedding-model storage/models/all-MiniLM-L6-v2
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_MODEL, ROOT, mark_start, print_table, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))


async def cycle(order: list[str]) -> list[dict]:
    from inference.engines import load_engine
    from inference.runtime import engine_config_from_settings

    rows = []
    for model in order:
        config = dataclasses.replace(engine_config_from_settings(model), sleep_mode=True)
        engine = load_engine(config)
        began = time.monotonic()
        await engine.start()
        started = time.monotonic()
        can_sleep = engine.can_sleep
        await engine.shutdown()
        rows.append({"model": model, "start_seconds": round(started - began, 1),
                     "stop_seconds": round(time.monotonic() - started, 1),
                     "sleep_mode": can_sleep})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chat-model", default=str(DEFAULT_MODEL))
    parser.add_argument("--embedding-model", required=True,
                        help="a prepared all-MiniLM-L6-v2 folder (serve prepares one)")
    args = parser.parse_args()
    os.environ["BATCHGEN_MODELS"] = f"chat={args.chat_model},embed={args.embedding_model}"
    os.environ.setdefault("BATCHGEN_MAX_CONTEXT_LENGTH", "512")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchgen_site.settings")
    import django

    django.setup()
    mark_start()
    rows = asyncio.run(cycle(["chat", "embed", "chat"]))
    print_table("engine start and stop, in one process (a swap is a stop then a start)",
                ["model", "start s", "stop s", "sleep mode"],
                [[r["model"], r["start_seconds"], r["stop_seconds"], r["sleep_mode"]]
                 for r in rows])
    write_results("swap_cost", {"runs": rows})


if __name__ == "__main__":
    main()
