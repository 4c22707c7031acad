"""Publish: what a chunk message costs the dispatcher on RabbitMQ with publisher
confirms (issue 26: core.publishing) against the plain publish before them.

Each mode runs in a process of its own (its own connection pool) on a fresh
virtual host of the local RabbitMQ: `publish_all` of windows of `--window` chunk
messages, as `batches.dispatch.publish_chunks` sends them, `--messages` in all,
after a warm-up. `plain` is the path before confirms (one producer, no confirm);
`confirm` is BatchGen's path now (each publish waits for the broker's ack).
Reported: microseconds per message (median window), and what that adds to the
dispatch of a 1,000,000-request batch at the default chunk size.

    .venv/bin/python benchmarks/publish.py
    .venv/bin/python benchmarks/publish.py --messages 20000 --window 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_mode(mode: str, broker_url: str, messages: int, window: int) -> dict:
    os.environ.update({"DJANGO_SETTINGS_MODULE": "batchgen_site.settings",
                       "BATCHGEN_BROKER_URL": broker_url,
                       "BATCHGEN_STORAGE_PATH": tempfile.mkdtemp(prefix="publish-bench-")})
    import django

    django.setup()
    from core.celery import app
    from core.publishing import Message, publisher

    if mode == "plain":
        app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                             "confirm_publish": False}

    def one_window(start: int) -> float:
        batch = [Message("inference.run_chunk", ("batch_bench", start + i),
                         {"queue": "inference.bench", "shadow": f"chunk bench#{start + i}"})
                 for i in range(window)]
        began = time.perf_counter()
        if mode == "plain":  # the loop publish_chunks ran before confirms
            with app.producer_or_acquire() as producer:
                for m in batch:
                    app.send_task(m.name, args=m.args, producer=producer, **m.options)
        else:
            assert publisher.publish_all(batch) == window
        return time.perf_counter() - began

    for start in range(0, 20 * window, window):  # warm-up: connection, queue declare
        one_window(start)
    times = [one_window(start) for start in range(0, messages, window)]
    return {"mode": mode, "us_per_message": statistics.median(times) / window * 1e6,
            "p90_window_ms": sorted(times)[int(len(times) * 0.9)] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--broker-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.broker_url, args.messages, args.window)))
        return

    from tests import services
    from tests.fleet.fleet import RabbitVhost

    vhost = RabbitVhost(services.RABBITMQ_URL).create(dict(os.environ))
    if not vhost.created:
        sys.exit("rabbitmqctl cannot add a virtual host here")
    try:
        results = []
        for mode in ("plain", "confirm", "plain", "confirm"):  # interleaved rounds
            done = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--broker-url", vhost.url,
                 "--messages", str(args.messages), "--window", str(args.window)],
                capture_output=True, text=True, check=True, cwd=ROOT)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        vhost.delete()
    chunk = 200  # BATCHGEN_CHUNK_SIZE's default (batchgen_site/settings.py)
    chunks = -(-1_000_000 // chunk)
    by_mode = {m: statistics.median(r["us_per_message"] for r in results if r["mode"] == m)
               for m in ("plain", "confirm")}
    for r in results:
        print(f"{r['mode']:>8}: {r['us_per_message']:7.1f} us/message, "
              f"p90 window of {args.window}: {r['p90_window_ms']:.2f} ms")
    extra = (by_mode["confirm"] - by_mode["plain"]) * chunks / 1e6
    print(f"confirms add {by_mode['confirm'] - by_mode['plain']:.1f} us a message: "
          f"{extra:.2f} s over the {chunks} chunks of a 1,000,000-request batch "
          f"(chunk size {chunk})")


if __name__ == "__main__":
    main()
