"""ETA accuracy and completion windows kept (issue 36), on the fleet path.

`manage.py serve --inference-workers N` on a fresh PostgreSQL database and a fresh
RabbitMQ virtual host, the simulated engine with a time per token
(BATCHGEN_SIM_TOKEN_LATENCY_MS; answers of varied lengths, engine_args
answer_tokens, each cut at its line's max_tokens; prompt tokens at 1/20 of an output
token, which the estimator learns, eta.PromptFit), several API keys. Every figure is read over
HTTP as a client would: each key's batch list polled every second.

Accuracy: `--batches` batches of 50 to `--largest` requests (log-uniform), each of
one of three answer lengths (max_tokens around 24, 96 or 256, varied line by line),
on `--keys` keys, created at random times over the first `--arrivals` seconds. For
each batch, the `estimated_completion_at` the API showed while it was still queued
(no request done yet) and when 10 %, 25 % and 50 % of its requests were done, against
its real `completed_at`: relative error = |ETA - completed_at| / (completed_at - time
of the reading); a reading within MIN_LEFT seconds of the end says nothing and is
left out. Goal: median at most 25 % (queued), 15 %, 10 %, 5 %; p90 reported. Beside
it, one of the ETA's inputs alone (`cost_left`, from the database every second): the
output tokens of a batch's requests left at 10, 25 and 50 % done, reckoned at the
mean of its answers so far and by the output limits left (eta.left_output), against
what they came to.

Windows: three 24 h batches on three keys, then (once the fleet's rate is measured
from their progress) a batch on a fourth key with a window of `--short-slack` times
what it takes with the whole fleet, plus WINDOW_MARGIN seconds: feasible, but short
of what its fair quarter gives it. The same run with BATCHGEN_DEADLINE_POLICY on and
off: windows kept of windows feasible (goal 100 % with the policy; without it, the
short batch misses).

    flock /tmp/batchgen-heavy.lock .venv/bin/python benchmarks/eta.py          # ~10 min
    flock /tmp/batchgen-heavy.lock .venv/bin/python benchmarks/eta.py --only accuracy \\
        --baseline /work/wt-old          # a worktree of an older commit, run first
    flock /tmp/batchgen-heavy.lock .venv/bin/python benchmarks/eta.py --only accuracy \\
        --baseline /work/wt-old --repeat 3   # seeds 1-3, each point pooled: ~55 min
    flock /tmp/batchgen-heavy.lock .venv/bin/python benchmarks/eta.py --engine vllm \\
        --only accuracy --workers 1 --slots 64 --batches 12 --largest 120 --arrivals 120 \\
        --kinds 8,16,32          # the real engine, ~9 min (6 batches over 60 s: ~5 min)
    flock /tmp/batchgen-heavy.lock .venv/bin/python benchmarks/eta.py --engine vllm \\
        --only accuracy --workers 1 --slots 64 --batches 10 --largest 600 --arrivals 150 \\
        --kinds 8,16,32 --timeout 1500 --seed 2     # larger batches on the real engine, ~8 min

`--record PREFIX` has the server write every refresh's play (BATCHGEN_ETA_RECORD) and
this script every poll: benchmarks/eta_replay.py plays them again with another
version of the play, in seconds, on the run's own states.

benchmarks/eta_model.py is the discrete-event model of the same questions (no
processes, a minute, deterministic): the policy's quick check while changing it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_MODEL,
    ROOT,
    Server,
    mark_start,
    print_table,
    scratch_dir,
    server_env,
    write_results,
)

from batches.eta import left_output  # noqa: E402
from tests import services  # noqa: E402
from tests.e2e.harness import fresh_postgres_database  # noqa: E402
from tests.fleet.fleet import RabbitVhost  # noqa: E402

POLL = 1.0
MIN_LEFT = 5.0  # a reading this close to the end (a refresh's period) is left out
POINTS = {"queued": 0.25, "10%": 0.15, "25%": 0.10, "50%": 0.05}  # point -> goal (median)
KINDS = (24, 96, 256)  # a batch's max_tokens, around which its lines vary
WINDOW_MARGIN = 10  # seconds: the dispatch window and the last chunk's tail
TERMINAL = {"completed", "failed", "expired", "cancelled"}
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


# --- the fleet ----------------------------------------------------------------------------


@dataclass
class Fleet:
    server: Server
    drop: object
    vhost: RabbitVhost
    database_url: str = ""
    keys: list[str] = field(default_factory=list)
    connection: object = None  # query's, opened on first use

    def query(self, sql: str) -> list[tuple]:
        """Rows of `sql` on the fleet's database, for --trace: one connection kept
        for the run (the rates are read every second), closed by stop()."""
        import psycopg

        if self.connection is None:
            self.connection = psycopg.connect(self.database_url, autocommit=True)
        return [tuple(row) for row in self.connection.execute(sql).fetchall()]

    def chunk_log(self) -> list[tuple]:
        """Every chunk as (batch, index, requests, worker, published, claimed,
        finished, the batch's output tokens per request, its prompt tokens per
        request), Unix seconds: what ran where and when, for --trace."""
        return self.query(
                "SELECT c.batch_id, c.index, c.count, c.worker, "
                "extract(epoch from c.published_at)::float, "
                "extract(epoch from c.claimed_at)::float, "
                "extract(epoch from c.finished_at)::float, "
                "b.usage_output_tokens::float / greatest(b.completed, 1), "
                "b.usage_input_tokens::float / greatest(b.completed, 1) "
                "FROM batches_chunk c JOIN batches_batch b ON b.id = c.batch_id")

    def rates(self) -> list[tuple]:
        """The measured rates now, each ModelThroughput row as a dict (cost units a
        second, workers, cost per request, prompt weight, as the version run has
        them): what the ETAs were played at, for --trace."""
        return self.query("SELECT row_to_json(t) FROM batches_modelthroughput t")

    def costs(self) -> list[tuple]:
        """Each batch's figures the cost of its requests left is reckoned from
        (estimates.load_of): (id, status, total, done, output tokens, the done
        requests' output limits, the lines' mean limit); none from a checkout
        before the limits were counted (Batch.output_limit_done)."""
        try:
            return self.query("SELECT id, status, total, completed + failed, "
                              "usage_output_tokens, output_limit_done, output_limit_mean "
                              "FROM batches_batch")
        except psycopg.errors.UndefinedColumn:
            return []

    def stop(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.server.stop()
        log = self.server.log_path
        said = [line for line in (log.read_text(errors="replace").splitlines() if log else [])
                if (" WARNING " in line or " ERROR " in line)
                and "Service Unavailable: /health" not in line]  # starting
        if said:  # the scratch directory goes with the run: what the server warned of stays
            print(f"the server's log held {len(said)} WARNING or ERROR lines; the first:",
                  *said[:5], sep="\n  ", flush=True)
        self.vhost.delete()
        self.drop()


def start_fleet(work: Path, args, *, policy: bool, port: int, name: str,
                root: Path = ROOT, record: Path | None = None) -> Fleet:
    services.require("postgresql")
    services.require("rabbitmq")
    database_url, drop = fresh_postgres_database(services.POSTGRES_URL)
    storage = work / f"storage-{name}"
    vhost = RabbitVhost(services.RABBITMQ_URL)
    vhost.create(server_env(storage=storage, broker_url=services.RABBITMQ_URL))
    settings = {"BATCHGEN_MAX_POOL_SIZE": str(args.slots),
                "BATCHGEN_CHUNK_SIZE": str(args.chunk),
                "BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS": "30",
                "BATCHGEN_DEADLINE_POLICY": "true" if policy else "false"}
    if record:  # every refresh's play, for benchmarks/eta_replay.py
        settings["BATCHGEN_ETA_RECORD"] = f"{record}.jsonl"
    if args.engine == "simulated":
        settings |= {"BATCHGEN_SIM_TOKEN_LATENCY_MS": str(args.token_ms),
                     "BATCHGEN_ENGINE_ARGS": json.dumps({"answer_tokens": [8, 300]})}
    else:  # the real engine: the e2e tests' settings for SmolLM2 on a CPU
        settings |= {"BATCHGEN_MODELS": f"m={args.model}", "BATCHGEN_MAX_CONTEXT_LENGTH": "512"}
    env = server_env(storage=storage, database_url=database_url, broker_url=vhost.url,
                     engine=args.engine, **settings)
    # The checkout's own modules, whichever the benchmark runs from.
    env["PYTHONPATH"] = ":".join([*(p for p in env.get("PYTHONPATH", "").split(":")
                                    if p and Path(p).resolve() != ROOT), str(root)])
    server = Server(storage=storage, env=env, web_workers=None, port=port, root=root,
                    args=["--inference-workers", str(args.workers)])
    fleet = Fleet(server, drop, vhost, database_url)
    try:
        server.start(ready_timeout=600)
        for i in range(args.keys):
            done = subprocess.run([sys.executable, "manage.py", "createapikey", f"key{i}"],
                                  cwd=root, env=env, capture_output=True, text=True,
                                  timeout=120, check=True)
            fleet.keys.append(done.stdout.strip())
    except BaseException:
        fleet.stop()
        raise
    return fleet


class Client:
    """A key's client. A 503 (the server's database or workers busy) is tried again
    after its Retry-After, as the openai SDK does, and printed."""

    TRIES = 5

    def __init__(self, base_url: str, key: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=120,
                                 headers={"Authorization": f"Bearer {key}"})

    def send(self, method: str, path: str, **kwargs) -> httpx.Response:
        for _ in range(self.TRIES - 1):
            answer = self.http.request(method, path, **kwargs)
            if answer.status_code != 503:
                break
            print(f"{method} {path}: 503 {answer.text[:200]}", flush=True)
            time.sleep(float(answer.headers.get("Retry-After", "1")))
        else:
            answer = self.http.request(method, path, **kwargs)
        answer.raise_for_status()
        return answer

    def upload(self, content: bytes) -> str:
        return self.send("POST", "/v1/files", files={"file": ("in.jsonl", content)},
                         data={"purpose": "batch"}).json()["id"]

    def create(self, file_id: str, window: str = "24h") -> dict:
        return self.send("POST", "/v1/batches", json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": window}).json()

    def batches(self) -> list[dict]:
        return self.send("GET", "/v1/batches", params={"limit": 100}).json()["data"]


def lines(rng: random.Random, count: int, prefix: str, kind: int) -> bytes:
    out = []
    for i in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 150)))
        body = {"model": "m", "max_tokens": rng.randint(kind // 2, kind * 3 // 2),
                "messages": [{"role": "user", "content": f"{prefix} {i} {words}"}]}
        out.append(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST",
                               "url": "/v1/chat/completions", "body": body}))
    return ("\n".join(out) + "\n").encode()


# --- watching batches over HTTP -------------------------------------------------------------


@dataclass
class Watched:
    id: str
    key: int
    created: float
    samples: list[tuple[float, str, int, int, int | None]] = field(default_factory=list)
    final: dict | None = None

    def done(self) -> bool:
        return self.final is not None


def poll(clients: list[Client], watched: dict[str, Watched]) -> None:
    for client in clients:
        now = time.time()
        for batch in client.batches():
            seen = watched.get(batch["id"])
            if seen is None or seen.done():
                continue
            counts = batch["request_counts"]
            seen.samples.append((now, batch["status"], counts["completed"] + counts["failed"],
                                 counts["total"], batch.get("estimated_completion_at")))
            if batch["status"] in TERMINAL:
                seen.final = batch


def readings(batch: Watched, shown: bool = True) -> dict[str, tuple[float, int | None]]:
    """The first ETA the API showed at each point: point -> (when, ETA); with
    `shown` False, the first poll at each point, whether it showed an ETA or not."""
    found: dict[str, tuple[float, int | None]] = {}
    for at, status, done, total, eta in batch.samples:
        if (shown and eta is None) or status in TERMINAL:
            continue
        if done == 0 and "queued" not in found:
            found["queued"] = (at, eta)
        for point in ("10%", "25%", "50%"):
            if total and done / total >= int(point[:-1]) / 100 and point not in found:
                found[point] = (at, eta)
    return found


def scored(batch: Watched) -> dict[str, tuple[float, int, float]]:
    """Each point's reading of a batch that ended, (when, ETA, signed error), the
    signed error (ETA - completed_at) / (completed_at - reading); a reading within
    MIN_LEFT of the end says nothing and is left out."""
    real = batch.final.get("completed_at") if batch.final else None
    if real is None:
        return {}
    return {point: (at, eta, (eta - real) / (real - at))
            for point, (at, eta) in readings(batch).items() if real - at >= MIN_LEFT}


def errors(batches: list[Watched]) -> tuple[dict[str, list[float]], list[dict],
                                            dict[str, list[float]], dict[str, list[float]]]:
    """Each point's errors, each batch's detail, each point's errors of the readings
    after which no batch was created until this one ended (what the ETA could have
    known, as no model can know the batches created after it), and each point's
    signed errors, (ETA - completed_at) / (completed_at - reading): a bias reads
    there, where noise cancels out."""
    found: dict[str, list[float]] = {point: [] for point in POINTS}
    settled: dict[str, list[float]] = {point: [] for point in POINTS}
    signed: dict[str, list[float]] = {point: [] for point in POINTS}
    created = [batch.created for batch in batches]
    detail = []
    for batch in batches:
        real = batch.final.get("completed_at") if batch.final else None
        row = {"batch": batch.id, "key": batch.key, "status": batch.final and
               batch.final["status"], "total": batch.samples[-1][3] if batch.samples else 0,
               "took": real and real - batch.created, "created": round(batch.created, 1)}
        for point, (at, eta, sign) in scored(batch).items():
            error = abs(sign)
            found[point].append(error)
            signed[point].append(sign)
            if not any(at < when < real for when in created):
                settled[point].append(error)
            row[point] = round(error, 3)
            row[f"{point} read/eta"] = (round(at - batch.created, 1), eta - round(batch.created))
        detail.append(row)
    return found, detail, settled, signed


LAST_MINUTE = ((5, 15), (15, 30), (30, 60))  # seconds left at a reading


def last_minute(batches: list[Watched]) -> dict[str, dict]:
    """The ETA a batch shows in its last minute, every poll of it: per band of
    seconds left, the median of |ETA - completed_at| / (completed_at - reading) and
    the signed median in seconds. A user watching a batch finish reads these; the
    points above read none of them."""
    found: dict[str, list[tuple[float, float]]] = {f"{lo}-{hi}s": [] for lo, hi in LAST_MINUTE}
    for batch in batches:
        real = batch.final.get("completed_at") if batch.final else None
        if real is None or batch.final["status"] != "completed":
            continue
        for at, status, _, _, eta in batch.samples:
            left = real - at
            for lo, hi in LAST_MINUTE:
                if eta is not None and status not in TERMINAL and lo <= left < hi:
                    found[f"{lo}-{hi}s"].append((abs(eta - real) / left, eta - real))
    result = {band: {"n": len(v), "median": median([e for e, _ in v]),
                     "signed_s": median([s for _, s in v])} for band, v in found.items()}
    print_table("The ETA in a batch's last minute (every poll; |ETA - end| / time left, "
                "and ETA - end in seconds)", ["time left", "readings", "median", "signed (s)"],
                [[band, row["n"], row["median"], row["signed_s"]]
                 for band, row in result.items()])
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass
class Trace:
    """What a run samples beside the polls: the batches' cost figures (Fleet.costs)
    every second; with --trace also the measured rates and, at the end, every chunk."""

    costs: list[tuple[float, list[tuple]]] = field(default_factory=list)
    rates: list[tuple[float, list[tuple]]] = field(default_factory=list)
    chunks: list[tuple] = field(default_factory=list)

    def sample(self, fleet: Fleet, every: bool) -> None:
        now = time.time()
        self.costs.append((now, fleet.costs()))
        if every:
            self.rates.append((now, fleet.rates()))

    def write(self, path: str, watched: dict[str, Watched]) -> None:
        """Every reading, for a closer look: (seconds since create, done, total, ETA)."""
        Path(path).write_text(json.dumps(
            {"readings": {b.id: [(round(at - b.created, 1), done, total,
                                  eta and eta - round(b.created))
                                 for at, _, done, total, eta in b.samples]
                          for b in watched.values()},
             "created": {b.id: b.created for b in watched.values()},
             "chunks": self.chunks, "rates": self.rates, "costs": self.costs}))


def write_polls(path: Path, watched: dict[str, Watched]) -> None:
    """Every poll of every batch and how it ended, beside the server's recorded
    plays (--record): what benchmarks/eta_replay.py reads the replayed ETAs at."""
    path.write_text(json.dumps({"batches": [dataclasses.asdict(b) for b in watched.values()]}))


def read_polls(path: Path) -> list[Watched]:
    """write_polls' batches again (from a gzip'd file where the name ends in .gz)."""
    text = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text()
    return [Watched(**{**batch, "samples": [tuple(s) for s in batch["samples"]]})
            for batch in json.loads(text)["batches"]]


def cost_left(samples: list[tuple[float, list[tuple]]], label: str) -> dict:
    """The output tokens of each batch's requests left when 10, 25 and 50 % of it
    was done, as the ETA would reckon them: at the mean of its answers so far, and
    by the output limits left (eta.left_output), against what they came to (its
    final output tokens less those done then). Per point, the signed median of
    (reckoned - real) / real over the batches; empty from a checkout that does not
    count the limits."""
    final = {row[0]: row[4] for _, rows in samples for row in rows if row[1] == "completed"}
    errors: dict[str, dict[str, list[float]]] = {}
    seen: set[tuple[str, int]] = set()
    for _, rows in samples:
        for batch_id, status, total, done, tokens, limit_done, limit_mean in rows:
            if batch_id not in final or status != "in_progress" or not total:
                continue
            left, real = total - done, final[batch_id] - tokens
            by_limits = left_output(done, left, tokens, limit_done, limit_mean)
            for point in (10, 25, 50):
                if done / total < point / 100 or (batch_id, point) in seen:
                    continue
                seen.add((batch_id, point))
                if real > 0 and by_limits is not None:
                    found = errors.setdefault(f"{point}%", {"mean_so_far": [], "by_limits": []})
                    found["mean_so_far"].append((left * tokens / done - real) / real)
                    found["by_limits"].append((left * by_limits - real) / real)
    result = {point: {"n": len(found["by_limits"]),
                      **{way: round(statistics.median(values), 3)
                         for way, values in found.items()}}
              for point, found in sorted(errors.items(), key=lambda item: int(item[0][:-1]))}
    if result:
        print_table(f"Output tokens of the requests left, reckoned against what they came to "
                    f"({label}; signed median of (reckoned - real) / real)",
                    ["point", "batches", "mean so far", "by the limits left"],
                    [[point, row["n"], row["mean_so_far"], row["by_limits"]]
                     for point, row in result.items()])
    return result


# --- the scenarios ---------------------------------------------------------------------------


def workload(args) -> list[tuple[float, int, int, bytes]]:
    """The accuracy scenario's batches, a function of --seed, --batches, --largest,
    --arrivals and --kinds alone: (when it is created, its index, its kind, its
    lines), in the order made. So a recorded run's batches can be made again
    (eta_replay.py --limits-from-seed)."""
    rng = random.Random(args.seed)
    made = []
    for i in range(args.batches):
        size = int(round(10 ** rng.uniform(math.log10(50), math.log10(args.largest))))
        kind = rng.choice(args.kinds)
        made.append((rng.uniform(0, args.arrivals), i, kind, lines(rng, size, f"b{i}", kind)))
    return made


def accuracy(work: Path, args, root: Path = ROOT, label: str = "this") -> dict:
    record = args.record and Path(f"{args.record}-{label}-s{args.seed}").resolve()
    fleet = start_fleet(work, args, policy=True, port=args.port + (label != "this") * 10,
                        name=f"accuracy-{label}", root=root, record=record)
    try:
        clients = [Client(fleet.server.base_url, key) for key in fleet.keys]
        plan = sorted((at, i % len(clients), kind, clients[i % len(clients)].upload(body))
                      for at, i, kind, body in workload(args))
        print(f"accuracy ({label}): {args.batches} batches, {args.workers} workers, uploaded",
              flush=True)
        watched: dict[str, Watched] = {}
        trace = Trace()
        started = time.time()
        while len(watched) < len(plan) or not all(b.done() for b in watched.values()):
            while len(watched) < len(plan) and plan[len(watched)][0] <= time.time() - started:
                _, key, _, file_id = plan[len(watched)]
                batch = clients[key].create(file_id)
                watched[batch["id"]] = Watched(batch["id"], key, time.time())
            poll(clients, watched)
            trace.sample(fleet, every=bool(args.trace))
            if time.time() - started > args.timeout:
                print("accuracy: timed out", flush=True)
                break
            time.sleep(POLL)
        wall = time.time() - started
        trace.chunks = fleet.chunk_log() if args.trace else []
    finally:
        fleet.stop()
        if args.trace and fleet.server.log_path:  # the engine's stats lines, kept
            shutil.copy(fleet.server.log_path, f"{args.trace}-{label}.log")
    found, detail, settled, signed = errors(list(watched.values()))
    if args.trace:
        trace.write(f"{args.trace}-{label}.json", watched)
    if record:
        write_polls(Path(f"{record}.json"), watched)
    return {"checkout": str(root), "seed": args.seed, "wall_s": round(wall, 1),
            "points": summary(found, settled, signed, f"{label} ({root.name}; {args.engine}, "
                              f"{args.workers} workers, seed {args.seed}, {wall:.0f} s)"),
            "batches": detail, "cost_left": cost_left(trace.costs, label),
            "last_minute": last_minute(list(watched.values())),
            "errors": {point: [round(e, 4) for e in v] for point, v in found.items()},
            "settled": {point: [round(e, 4) for e in v] for point, v in settled.items()},
            "signed": {point: [round(e, 4) for e in v] for point, v in signed.items()}}


def summary(found: dict[str, list[float]], settled: dict[str, list[float]],
            signed: dict[str, list[float]], title: str) -> dict:
    """Print each point's errors against its goal; return them as the results hold them."""
    rows = [[point, len(v), median(v), p(v, 0.9), goal,
             "met" if v and statistics.median(v) <= goal else "not met",
             median(signed[point]), len(settled[point]), median(settled[point])]
            for (point, goal), v in zip(POINTS.items(), found.values(), strict=True)]
    print_table(f"ETA relative error, {title}",
                ["point", "readings", "median", "p90", "goal (median)", "", "signed median",
                 "no arrival after", "its median"], rows)
    return {point: {"n": len(v), "median": statistics.median(v) if v else None,
                     "p90": p(v, 0.9), "signed_median": median(signed[point]),
                     "no_arrival_after": {"n": len(settled[point]), "median":
                                          median(settled[point]) if settled[point] else None}}
            for point, v in found.items()}


def run_interval(runs: list[list[float]], draws: int = 2000, seed: int = 1,
                 level: float = 0.9) -> tuple[float, float] | None:
    """The `level` interval of the pooled median of `runs` (each run's errors at one
    point), by resampling whole runs with replacement: a run's readings move
    together (its machine's speed that day, its batches' sizes), so resampling
    readings one by one would read too narrow. None without two runs with errors."""
    runs = [errors for errors in runs if errors]
    if len(runs) < 2:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median([e for _ in runs for e in rng.choice(runs)])
                     for _ in range(draws))
    tail = (1 - level) / 2
    return medians[int(tail * draws)], medians[min(int((1 - tail) * draws), draws - 1)]


def print_intervals(intervals: dict[str, tuple[float, float] | None]) -> None:
    print("each point's pooled median, 90 % interval by resampling whole runs: "
          + ", ".join(f"{point} {found[0]:.3f}-{found[1]:.3f}"
                      for point, found in intervals.items() if found))


def accuracy_runs(work: Path, args, roots: dict[str, Path]) -> dict[str, dict]:
    """accuracy() of each checkout (label: root, the baseline first) for each of the
    `--repeat` seeds from `--seed`, the checkouts in turn at each seed; with several
    seeds, each point's errors pooled over them too: one run's median over a dozen
    batches moves by 0.1 from run to run of the same workload (docs/benchmarks.md),
    a pool of several much less."""
    seeds = list(range(args.seed, args.seed + max(args.repeat, 1)))
    runs: dict[str, list[dict]] = {label: [] for label in roots}
    for seed in seeds:
        for label, root in roots.items():
            runs[label].append(accuracy(work, argparse.Namespace(**{**vars(args), "seed": seed}),
                                        root, label))
    if len(seeds) == 1:
        return {label: found[0] for label, found in runs.items()}
    results = {}
    for label, found in runs.items():
        pooled = {key: {point: [e for run in found for e in run[key][point]] for point in POINTS}
                  for key in ("errors", "settled", "signed")}
        intervals = {point: run_interval([run["errors"][point] for run in found])
                     for point in POINTS}
        results[label] = {"checkout": str(roots[label]), "seeds": seeds, "runs": found,
                          "points": summary(pooled["errors"], pooled["settled"],
                                            pooled["signed"],
                                            f"{label} ({roots[label].name}), pooled over "
                                            f"seeds {seeds}"),
                          "median_90_by_runs": intervals}
        print_intervals(intervals)
    return results


def windows_run(work: Path, args, policy: bool) -> dict:
    rng = random.Random(args.seed + 1)
    fleet = start_fleet(work, args, policy=policy, port=args.port + 1 + policy,
                        name=f"windows-{policy}")
    try:
        clients = [Client(fleet.server.base_url, key) for key in fleet.keys[:4]]
        long_files = [c.upload(lines(rng, args.long_requests, f"long{i}", 96))
                      for i, c in enumerate(clients[:3])]
        short_file = clients[3].upload(lines(rng, args.short_requests, "short", 96))
        watched: dict[str, Watched] = {}
        for i, file_id in enumerate(long_files):
            batch = clients[i].create(file_id)
            watched[batch["id"]] = Watched(batch["id"], i, time.time())
        started = time.time()
        while time.time() - started < args.warm:  # the fleet's rate, from their progress
            poll(clients, watched)
            time.sleep(POLL)
        done = sum(b.samples[-1][2] for b in watched.values())
        rate = done / (time.time() - started)
        window = math.ceil(args.short_slack * args.short_requests / rate) + WINDOW_MARGIN
        short = clients[3].create(short_file, f"{window}s")
        watched[short["id"]] = Watched(short["id"], 3, time.time())
        while not all(b.done() for b in watched.values()):
            poll(clients, watched)
            if time.time() - started > args.timeout:
                break
            time.sleep(POLL)
    finally:
        fleet.stop()
    detail = []
    for batch in watched.values():
        final = batch.final or {}
        limit = final.get("expires_at") or batch.created + 86400
        finished = final.get("completed_at")
        detail.append({"batch": "short" if batch.id == short["id"] else f"long{batch.key}",
                       "status": final.get("status"), "window_s": round(limit - batch.created),
                       "took_s": finished and round(finished - batch.created, 1),
                       "kept": final.get("status") == "completed" and finished <= limit})
    return {"rate_req_s": round(rate, 1), "window_s": window,
            "kept": sum(d["kept"] for d in detail), "feasible": len(detail), "batches": detail}


def windows(work: Path, args) -> dict:
    results = {name: windows_run(work, args, policy)
               for name, policy in (("off", False), ("on", True))}
    rows = [[name, r["kept"], r["feasible"], 100.0 * r["kept"] / r["feasible"],
             ", ".join(f"{d['batch']}:{d['status']} {d['took_s']}/{d['window_s']}s"
                       for d in r["batches"] if d["batch"] == "short"), r["rate_req_s"]]
            for name, r in results.items()]
    print_table("Windows kept of windows feasible (short batch: took/window)",
                ["policy", "kept", "feasible", "%", "short", "fleet req/s"], rows)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["accuracy", "windows"])
    parser.add_argument("--engine", default="simulated", choices=["simulated", "vllm"])
    parser.add_argument("--model", default=str(DEFAULT_MODEL),
                        help="the real engine's model folder (a worktree: the main checkout's)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--slots", type=int, default=12, help="BATCHGEN_MAX_POOL_SIZE")
    parser.add_argument("--chunk", type=int, default=50, help="BATCHGEN_CHUNK_SIZE")
    parser.add_argument("--token-ms", type=float, default=20.0,
                        help="BATCHGEN_SIM_TOKEN_LATENCY_MS")
    parser.add_argument("--kinds", type=lambda v: [int(x) for x in v.split(",")],
                        default=list(KINDS), help="the batches' max_tokens, around which "
                        "their lines vary (one per batch)")
    parser.add_argument("--batches", type=int, default=14)
    parser.add_argument("--largest", type=int, default=2000)
    parser.add_argument("--arrivals", type=float, default=150.0)
    parser.add_argument("--long-requests", type=int, default=1500)
    parser.add_argument("--short-requests", type=int, default=900)
    parser.add_argument("--short-slack", type=float, default=2.0)
    parser.add_argument("--warm", type=float, default=25.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1,
                        help="accuracy runs with seeds --seed, --seed + 1, ...: each "
                             "point's errors pooled over them (the checkouts in turn)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--port", type=int, default=12100)
    parser.add_argument("--results", default="eta")
    parser.add_argument("--trace", help="write every reading to TRACE-LABEL.json, the "
                                        "server's log to TRACE-LABEL.log")
    parser.add_argument("--record", help="record every ETA refresh's play to "
                        "RECORD-LABEL-sSEED.jsonl (BATCHGEN_ETA_RECORD) and every poll to "
                        "RECORD-LABEL-sSEED.json, for benchmarks/eta_replay.py")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout (a worktree of an older commit) whose server "
                             "runs the same accuracy workload first, side by side")
    args = parser.parse_args()
    mark_start()
    results: dict = {"options": vars(args)}
    with scratch_dir("eta-") as work:
        if args.only in (None, "accuracy"):
            roots = {"baseline": args.baseline.resolve()} if args.baseline else {}
            found = accuracy_runs(work, args, roots | {"this": ROOT})
            if args.baseline:
                results["accuracy_baseline"] = found["baseline"]
            results["accuracy"] = found["this"]
            write_results(args.results, results)  # so far, should the windows run fail
        if args.only in (None, "windows"):
            results["windows"] = windows(work, args)
    write_results(args.results, results)


if __name__ == "__main__":
    main()
