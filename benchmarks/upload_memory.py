"""Upload memory: the web process stays flat while a 1 GiB upload streams (issue 2).

Starts a real server (`manage.py serve`, one gunicorn worker), then streams a
1 GiB multipart upload to `POST /v1/files`. The client generates the body on the
fly (a 1 MiB block of JSONL lines sent again and again from a generator, with an
exact Content-Length), so neither side ever has the file in memory. The RSS of the
gunicorn worker that handles the request is sampled every 50 ms.

Reported: the worker's RSS at the start (after a small warm-up upload), its peak
during the upload and at the end, and the upload throughput; next to a baseline
that does the same server-side work without HTTP (hash with sha256 and write the
same bytes to a file on the same disk, then fsync), to show what the disk allows.

Flat means peak - start under ~30 MB. The same upload then goes to a server whose
files are on S3 (`BATCHGEN_STORAGE_URL`, a real SeaweedFS started as tests/s3.py
starts it), side by side in the same run (`--no-s3` for the path only).

    .venv/bin/python benchmarks/upload_memory.py            # 1 GiB
    .venv/bin/python benchmarks/upload_memory.py --quick    # 128 MiB
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MiB,
    RssSampler,
    Server,
    mark_start,
    mib,
    print_table,
    running_server,
    scratch_dir,
    server_env,
    server_processes,
    wait_for_quiet,
    write_results,
)

from tests.s3 import BUCKET, seaweedfs  # noqa: E402

FLAT_MB = 30


def jsonl_block(size: int = MiB) -> bytes:
    """About `size` bytes of valid chat JSONL lines, cut at a line end."""
    lines, total, i = [], 0, 0
    while total < size:
        line = orjson.dumps({"custom_id": f"request-{i}", "method": "POST",
                             "url": "/v1/chat/completions",
                             "body": {"model": "m", "messages": [
                                 {"role": "user", "content": f"Tell me about the number {i}."}
                             ]}}) + b"\n"
        lines.append(line)
        total += len(line)
        i += 1
    block = b"".join(lines)
    return block[:block.rfind(b"\n", 0, size) + 1]


def content(total: int, block: bytes) -> Iterator[bytes]:
    view = memoryview(block)
    left = total
    while left:
        take = min(left, len(block))
        yield bytes(view[:take]) if take < len(block) else block
        left -= take


def multipart(total: int, block: bytes) -> tuple[dict[str, str], int, Iterator[bytes]]:
    boundary = uuid.uuid4().hex
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            f"batch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"big.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body() -> Iterator[bytes]:
        yield head
        yield from content(total, block)
        yield tail

    length = len(head) + total + len(tail)
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}",
               "Content-Length": str(length)}
    return headers, length, body()


def baseline(path: Path, total: int, block: bytes) -> dict:
    """What the server does with the bytes, without HTTP: hash, write, fsync."""
    started = time.perf_counter()
    digest = hashlib.sha256()
    with path.open("wb") as fh:
        for piece in content(total, block):
            digest.update(piece)
            fh.write(piece)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return {"seconds": round(seconds, 2), "mib_per_s": round(total / MiB / seconds, 1)}


def upload(http: httpx.Client, total: int, block: bytes) -> tuple[dict, float]:
    headers, _, body = multipart(total, block)
    started = time.perf_counter()
    response = http.post("/v1/files", content=body, headers=headers)
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"upload answered {response.status_code}: {response.text[:500]}")
    return response.json(), seconds


@contextlib.contextmanager
def serve(storage: Path, checkout: Path | None, **env: str) -> Iterator[Server]:
    if checkout is None:
        with running_server(storage, engine="simulated", **env) as server:
            yield server
        return
    server = Server(storage=storage, env=server_env(storage=storage, **env), root=checkout)
    try:
        yield server.start(ready_timeout=180)
    finally:
        server.stop()


def web_worker_only(server):
    return {"web worker": server_processes(server)["web worker"]}


def measure(server: Server, total: int, block: bytes, interval: float) -> dict:
    """One upload of `total` bytes with the web worker's RSS sampled throughout."""
    with httpx.Client(base_url=server.base_url, timeout=900) as http:
        upload(http, MiB, block)  # warm-up: the first upload's imports and buffers
        time.sleep(0.5)
        sampler = RssSampler(lambda: web_worker_only(server), interval=interval)
        start_rss = sampler.current()["web worker"]
        sampler.start()
        time.sleep(0.3)
        sampler.set_phase("upload")
        print(f"uploading {mib(total)} MiB ...", flush=True)
        file, seconds = upload(http, total, block)
        sampler.set_phase("after")
        time.sleep(1.0)
        sampler.stop()
        end_rss = sampler.current()["web worker"]
        http.delete(f"/v1/files/{file['id']}")
    if file["bytes"] != total:
        raise RuntimeError(f"the server stored {file['bytes']} bytes, not {total}")
    series = sampler.series.get("web worker", [])
    peak = sampler.peak("web worker", ["upload"])
    step = max(1, len(series) // 200)  # keep the JSON small: about 200 points
    return {"rss_start_mib": mib(start_rss), "rss_peak_mib": mib(peak),
            "rss_end_mib": mib(end_rss), "rss_growth_mib": mib(peak - start_rss),
            "flat": peak - start_rss < FLAT_MB * 1e6, "upload_s": round(seconds, 2),
            "upload_mib_per_s": round(total / MiB / seconds, 1), "samples": len(series),
            "rss_series_mib": [[t, mib(v)] for t, v in series[::step]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="upload size in MiB")
    parser.add_argument("--quick", action="store_true", help="128 MiB")
    parser.add_argument("--interval", type=float, default=0.05, help="RSS sampling period, s")
    parser.add_argument("--name", default="upload_memory",
                        help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--checkout", type=Path,
                        help="run another checkout's server (e.g. the code before a change)")
    parser.add_argument("--no-s3", action="store_true",
                        help="the storage path only (no SeaweedFS run beside it)")
    args = parser.parse_args()
    mark_start()
    total = (128 if args.quick else args.mib) * MiB
    block = jsonl_block()
    runs = {}
    with scratch_dir("upload") as work, \
            (contextlib.nullcontext() if args.no_s3 else seaweedfs()) as s3:
        noise = wait_for_quiet()
        print(f"baseline: sha256 + write + fsync of {mib(total)} MiB to {work} ...", flush=True)
        base = baseline(work / "baseline.bin", total, block)
        backends = {"path": {}} if s3 is None else {
            "path": {}, "s3": {**s3.env, "BATCHGEN_STORAGE_URL": f"s3://{BUCKET}/upload"}}
        for key, env in backends.items():
            print(f"{key}:", flush=True)
            with serve(work / f"storage-{key}", args.checkout, **env) as server:
                runs[key] = measure(server, total, block, args.interval)
    for run in runs.values():
        run["ratio_to_baseline"] = round(run["upload_mib_per_s"] / base["mib_per_s"], 2)
    print_table(f"Upload of {mib(total)} MiB, web worker RSS sampled every "
                f"{int(args.interval * 1000)} ms", ["figure", *runs], [
                    [label, *(run[key] for run in runs.values())] for label, key in [
                        ("RSS at start, MiB", "rss_start_mib"),
                        ("RSS peak during upload, MiB", "rss_peak_mib"),
                        ("RSS at end, MiB", "rss_end_mib"),
                        ("peak - start, MiB", "rss_growth_mib"),
                        ("upload time, s", "upload_s"),
                        ("upload throughput, MiB/s", "upload_mib_per_s"),
                        ("upload / baseline throughput", "ratio_to_baseline")]])
    print(f"baseline (sha256 + write + fsync): {base['mib_per_s']} MiB/s")
    for key, run in runs.items():
        print(f"{key}: flat (peak - start under {FLAT_MB} MB): "
              f"{'YES' if run['flat'] else 'NO'} ({run['rss_growth_mib']} MiB)")
    path = runs["path"]
    write_results(args.name, {
        "quick": args.quick, "upload_bytes": total, "noise_before": noise, "baseline": base,
        # the path's figures at the top level, as before S3 was measured beside it
        **{k: v for k, v in path.items() if k not in ("samples",)},
        "runs": runs,
    })


if __name__ == "__main__":
    main()
