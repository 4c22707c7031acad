"""Fleet: 1, 2, 4 and 8 inference workers on PostgreSQL + RabbitMQ (issue 12).

The simulated engine answers every request after a fixed latency, so a worker's
ideal throughput is its slots / latency and what is measured is orchestration: how
close N workers come to N times one worker, and what the control plane costs the
database and the broker per request. Each run gets a fresh PostgreSQL database on
the local server and a fresh virtual host on a private RabbitMQ node (started by
this script, so its message counters count this run alone), and runs one batch of
`--requests-per-worker` x N requests through `manage.py serve --inference-workers N`.

Reported per N: requests/s (in_progress to completed, from the database's own
timestamps), the speed-up over one worker (goal: at least 0.8 x N where the CPU is
not the limit: the machine's CPU use and each role's CPU seconds are recorded),
database transactions and rows per 1,000 requests and per worker-second
(pg_stat_database of the run's database, read before the batch and after the
server stopped, when every backend has flushed its counters; pg_stat_statements
is used for statement counts when the server preloads it), and broker messages
published and delivered per 1,000 requests (rabbit_global_counters of the private
node).

    .venv/bin/python benchmarks/fleet.py                   # 1, 2, 4, 8 workers
    .venv/bin/python benchmarks/fleet.py --quick           # 1 and 2, small batches
    .venv/bin/python benchmarks/fleet.py --workers 1,4 --requests-per-worker 4000
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    Server,
    mark_start,
    print_table,
    scratch_dir,
    server_cpu_seconds,
    server_env,
    server_env_arg,
    wait_for_quiet,
    write_results,
)

from tests import services  # noqa: E402
from tests.e2e.harness import Api, chat_lines, fresh_postgres_database, output_ids  # noqa: E402
from tests.faults.faults import PrivateRabbitMQ  # noqa: E402
from tests.fleet.fleet import pg_query  # noqa: E402

GOAL_EFFICIENCY = 0.8  # N workers at least 0.8 x N times one worker
IDLE_SECONDS = 20.0  # the idle window before each batch
ROLES = ["web worker", "control worker", "inference worker"]
DB_COUNTERS = ["xact_commit", "xact_rollback", "tup_returned", "tup_fetched", "tup_inserted",
               "tup_updated", "tup_deleted"]
# One query for the node's AMQP counters: published (received from clients),
# routed to a queue, delivered to consumers, acknowledged.
BROKER_COUNTERS = (
    "O = rabbit_global_counters:overview(), "
    "P = maps:get([{protocol,amqp091}], O), "
    "C = maps:get([{protocol,amqp091},{queue_type,rabbit_classic_queue}], O), "
    "{maps:get(messages_received_total, P), maps:get(messages_routed_total, P), "
    "maps:get(messages_delivered_total, C), maps:get(messages_acknowledged_total, C)}.")


# --- the broker: a private node, a vhost per run ------------------------------------------


class Broker:
    def __init__(self, directory: Path) -> None:
        self.node = PrivateRabbitMQ(directory)

    def start(self) -> Broker:
        self.node.start()
        return self

    def vhost(self) -> str:
        name = f"fleet_{uuid.uuid4().hex[:8]}"
        for args in (("add_vhost", name), ("set_permissions", "-p", name, "guest", ".*", ".*",
                                           ".*")):
            done = self.node.ctl(*args)
            if done.returncode != 0:
                raise RuntimeError(f"rabbitmqctl {args[0]}: {done.stderr}")
        return f"amqp://guest:guest@127.0.0.1:{self.node.port}/{name}"

    def counters(self) -> dict[str, int]:
        done = self.node.ctl("eval", BROKER_COUNTERS)
        values = [int(v) for v in re.findall(r"\d+", done.stdout)]
        if done.returncode != 0 or len(values) != 4:
            raise RuntimeError(f"rabbitmqctl eval: {done.stdout} {done.stderr}")
        return dict(zip(["published", "routed", "delivered", "acknowledged"], values,
                        strict=True))

    def cpu_seconds(self) -> float:
        try:
            node = psutil.Process(self.node.process.pid)
            processes = [node, *node.children(recursive=True)]
        except psutil.Error:
            return 0.0
        return sum(_cpu(p) for p in processes)

    def stop(self) -> None:
        self.node.stop()


# --- the database ----------------------------------------------------------------------------


def db_counters(database_url: str) -> dict[str, int]:
    name = database_url.rsplit("/", 1)[1]
    row = pg_query(services.POSTGRES_URL,
                   f"SELECT {', '.join(DB_COUNTERS)} FROM pg_stat_database WHERE datname = %s",
                   (name,))[0]
    found = dict(zip(DB_COUNTERS, (int(v) for v in row), strict=True))
    found["statements"] = statements(database_url)
    return found


def statements(database_url: str) -> int | None:
    """Statements run in this database, when the server preloads pg_stat_statements
    (else None: transactions are the figure, each autocommit statement being one)."""
    preloaded = pg_query(database_url, "SHOW shared_preload_libraries")[0][0]
    if "pg_stat_statements" not in preloaded:
        return None
    pg_query(database_url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return int(pg_query(database_url, "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s"
                        " JOIN pg_database d ON d.oid = s.dbid "
                        "WHERE d.datname = current_database()")[0][0])


def run_seconds(database_url: str, batch_id: str) -> float:
    """From in_progress to the last chunk's close, by the database's clock."""
    return float(pg_query(
        database_url, "SELECT extract(epoch FROM max(c.finished_at) - b.in_progress_at) "
                      "FROM batches_batch b JOIN batches_chunk c ON c.batch_id = b.id "
                      "WHERE b.id = %s GROUP BY b.in_progress_at", (batch_id,))[0][0])


def table_writes(database_url: str) -> dict[str, int]:
    """Rows updated per table: where the control plane's writes go (a hot row shows)."""
    return {name: int(updates) for name, updates in pg_query(
        database_url, "SELECT relname, n_tup_upd FROM pg_stat_user_tables "
                      "WHERE n_tup_upd > 0 ORDER BY n_tup_upd DESC")}


def postgres_cpu_seconds() -> float:
    return sum(_cpu(p) for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres")


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


# --- baselines: what the database and the broker do alone on this machine ---------------------


def pgbench_tps(seconds: float) -> dict:
    """pgbench's simple-update transaction (-N: one UPDATE, one SELECT, one INSERT) with
    8 clients, on a fresh database of the same server: the primary's own rate here."""
    import shutil
    import subprocess

    if shutil.which("pgbench") is None:
        return {"tps": None, "note": "pgbench not installed"}
    url, drop = fresh_postgres_database(services.POSTGRES_URL)
    try:
        subprocess.run(["pgbench", "-i", "-s", "10", "-q", url], check=True,
                       capture_output=True, timeout=300)
        done = subprocess.run(["pgbench", "-N", "-c", "8", "-j", "2", "-T", str(int(seconds)),
                               url], check=True, capture_output=True, text=True,
                              timeout=seconds + 120)
    finally:
        drop()
    tps = re.search(r"tps = ([\d.]+)", done.stdout)
    return {"tps": round(float(tps.group(1))) if tps else None, "clients": 8,
            "workload": "pgbench -N (simple update), scale 10", "seconds": seconds}


def broker_round_trips(url: str, count: int = 20_000) -> dict:
    """One Python client publishes `count` persistent messages to a durable queue and
    consumes them (acknowledged): a lower bound of the node's rate, the client being
    the limit."""
    from kombu import Connection, Exchange, Queue

    queue = Queue("fleet-baseline", Exchange("fleet-baseline", type="direct"),
                  routing_key="fleet-baseline", durable=True)
    body = {"chunk_id": 123456, "batch_id": "batch_0123456789abcdef"}
    with Connection(url) as connection:
        producer = connection.Producer()
        started = time.perf_counter()
        for _ in range(count):
            producer.publish(body, exchange=queue.exchange, routing_key="fleet-baseline",
                             declare=[queue], delivery_mode=2, serializer="json")
        published = time.perf_counter() - started
        received = 0

        def on_message(_body, message):
            nonlocal received
            received += 1
            message.ack()

        started = time.perf_counter()
        with connection.Consumer(queue, callbacks=[on_message], prefetch_count=100):
            while received < count:
                connection.drain_events(timeout=10)
        consumed = time.perf_counter() - started
    return {"messages": count, "published_per_s": round(count / published),
            "consumed_per_s": round(count / consumed)}


# --- one run -----------------------------------------------------------------------------------


def run_fleet(work: Path, broker: Broker, *, workers: int, requests: int, settings: dict,
              timeout: float) -> dict:
    database_url, drop = fresh_postgres_database(services.POSTGRES_URL)
    storage = work / f"storage-{workers}"
    server = Server(storage=storage, web_workers=None,
                    env=server_env(storage=storage, database_url=database_url,
                                   broker_url=broker.vhost(), **settings),
                    args=["--inference-workers", str(workers)])
    try:
        server.start(ready_timeout=300)
        api = Api(server.base_url)
        input_file = api.upload(chat_lines(requests))
        noise = wait_for_quiet()
        # The fixed cost of a live fleet (heartbeats, Celery's worker events), measured
        # with nothing to do, so the per-request cost can be told apart from it.
        idle_db, idle_broker = db_counters(database_url), broker.counters()
        time.sleep(IDLE_SECONDS)
        db_before, broker_before = db_counters(database_url), broker.counters()
        idle = {"transactions": _transactions(db_before) - _transactions(idle_db),
                **{k: broker_before[k] - idle_broker[k] for k in broker_before}}
        cpu_before, pg_before = server_cpu_seconds(server), postgres_cpu_seconds()
        rabbit_before = broker.cpu_seconds()
        psutil.cpu_percent(interval=None)
        t0 = time.perf_counter()
        batch = api.create_batch(input_file["id"]).json()
        done = api.wait_status(batch["id"], {"completed", "failed", "cancelled"},
                               timeout=timeout)
        wall = time.perf_counter() - t0
        machine_busy = psutil.cpu_percent(interval=None)
        cpu_after, pg_after = server_cpu_seconds(server), postgres_cpu_seconds()
        rabbit_after = broker.cpu_seconds()
        if done["status"] != "completed":
            raise RuntimeError(f"batch ended {done['status']}: {done.get('errors')}")
        ids = output_ids(api.content(done["output_file_id"]))
        if len(ids) != requests or len(set(ids)) != requests:
            raise RuntimeError(f"{len(ids)} output lines, {len(set(ids))} distinct, "
                               f"expected {requests}")
        run_s = run_seconds(database_url, batch["id"])
    finally:
        server.stop()
    # The backends have exited: every counter is flushed now.
    db_after, broker_after = db_counters(database_url), broker.counters()
    writes = table_writes(database_url)
    drop()

    db = {k: db_after[k] - db_before[k] for k in DB_COUNTERS}
    db["transactions"] = db["xact_commit"] + db["xact_rollback"]
    db["rows_written"] = db["tup_inserted"] + db["tup_updated"] + db["tup_deleted"]
    if db_after["statements"] is not None and db_before["statements"] is not None:
        db["statements"] = db_after["statements"] - db_before["statements"]
    messages = {k: broker_after[k] - broker_before[k] for k in broker_after}
    per_k = 1000 / requests
    worker_seconds = workers * max(wall, 1e-9)
    idle_rate = {k: v / IDLE_SECONDS for k, v in idle.items()}
    totals = {"transactions": db["transactions"], **messages}
    # What the requests cost beyond the fleet's idle traffic over the same time.
    net = {k: round((totals[k] - idle_rate[k] * wall) * per_k, 1) for k in totals}
    return {
        "workers": workers,
        "requests": requests,
        "run_s": round(run_s, 2),
        "create_to_completed_s": round(wall, 2),
        "requests_per_s": round(requests / max(run_s, 1e-9), 1),
        "ideal_requests_per_s": round(workers * ideal_per_worker(settings), 1),
        "db": db,
        "db_per_1000_requests": {k: round(v * per_k, 1) for k, v in db.items()},
        "db_transactions_per_worker_second": round(db["transactions"] / worker_seconds, 1),
        "db_rows_updated_by_table": writes,
        "broker_messages": messages,
        "broker_per_1000_requests": {k: round(v * per_k, 1) for k, v in messages.items()},
        "idle_per_s": {k: round(v, 2) for k, v in idle_rate.items()},
        "idle_per_worker_s": {k: round(v / workers, 2) for k, v in idle_rate.items()},
        "net_of_idle_per_1000_requests": net,
        "cpu_seconds": {**{r: round(cpu_after.get(r, 0) - cpu_before.get(r, 0), 2)
                           for r in ROLES},
                        "postgres (all databases)": round(pg_after - pg_before, 2),
                        "rabbitmq": round(rabbit_after - rabbit_before, 2)},
        "machine_cpu_busy_percent": machine_busy,
        "noise_before": noise,
    }


def _transactions(counters: dict[str, int]) -> int:
    return counters["xact_commit"] + counters["xact_rollback"]


def ideal_per_worker(settings: dict) -> float:
    return int(settings["BATCHGEN_MAX_POOL_SIZE"]) / (
        float(settings["BATCHGEN_SIM_LATENCY_MS"]) / 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts")
    parser.add_argument("--requests-per-worker", type=int, default=2400,
                        help="batch size per worker (default 2,400: about 15 s of work)")
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--pool-size", type=int, default=32, help="slots per worker")
    parser.add_argument("--chunk-size", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, 600 each")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--baseline-seconds", type=float, default=15,
                        help="how long pgbench runs for the database's own rate")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--server-env", action="append", metavar="BATCHGEN_X=VALUE",
                        help="extra server setting for every run (repeatable)")
    parser.add_argument("--name", default="fleet",
                        help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    if not (services.reachable("postgresql") and PrivateRabbitMQ.SERVER.exists()):
        raise SystemExit("needs PostgreSQL on 127.0.0.1:5432 (TEST_POSTGRES_URL) and "
                         "rabbitmq-server installed (a private node is started)")
    mark_start()
    counts = [1, 2] if args.quick else [int(v) for v in args.workers.split(",")]
    per_worker = 600 if args.quick else args.requests_per_worker
    settings = {"BATCHGEN_SIM_LATENCY_MS": str(args.latency_ms),
                "BATCHGEN_MAX_POOL_SIZE": str(args.pool_size),
                "BATCHGEN_CHUNK_SIZE": str(args.chunk_size),
                "BATCHGEN_FLOWER_PORT": "0", **server_env_arg(args.server_env)}

    runs = []
    with scratch_dir("fleet", keep=args.keep) as work:
        broker = Broker(work / "rabbitmq").start()
        try:
            print("baselines: pgbench on the same PostgreSQL, one client on the broker ...",
                  flush=True)
            wait_for_quiet()
            baselines = {"postgresql": pgbench_tps(args.baseline_seconds)}
            broker_baseline = broker_round_trips(broker.vhost())
            baselines["rabbitmq"] = broker_baseline
            print(f"  pgbench {baselines['postgresql']['tps']} tps; broker "
                  f"{broker_baseline['published_per_s']:,} published/s, "
                  f"{broker_baseline['consumed_per_s']:,} consumed/s", flush=True)
            for workers in counts:
                print(f"{workers} worker(s): {per_worker * workers:,} requests ...", flush=True)
                runs.append(run_fleet(work, broker, workers=workers,
                                      requests=per_worker * workers, settings=settings,
                                      timeout=args.timeout))
                print(f"  {runs[-1]['requests_per_s']:,} requests/s", flush=True)
        finally:
            broker.stop()

    base = runs[0]["requests_per_s"] / runs[0]["workers"]
    for run in runs:
        run["speedup"] = round(run["requests_per_s"] / base, 2)
        run["efficiency"] = round(run["speedup"] / run["workers"], 2)
        run["goal_met"] = run["efficiency"] >= GOAL_EFFICIENCY
    print_table(f"simulated engine at {args.latency_ms:.0f} ms, {args.pool_size} slots and "
                f"chunks of {args.chunk_size}: PostgreSQL + RabbitMQ",
                ["workers", "requests", "run s", "req/s", "ideal req/s", "speed-up",
                 "x N", "machine CPU %"],
                [[r["workers"], r["requests"], r["run_s"], r["requests_per_s"],
                  r["ideal_requests_per_s"], r["speedup"], r["efficiency"],
                  r["machine_cpu_busy_percent"]] for r in runs])
    print_table("per 1,000 requests, and per worker-second",
                ["workers", "DB transactions", "DB rows written", "DB rows read",
                 "broker published", "broker delivered", "DB xact / worker-s"],
                [[r["workers"], r["db_per_1000_requests"]["transactions"],
                  r["db_per_1000_requests"]["rows_written"],
                  r["db_per_1000_requests"]["tup_fetched"],
                  r["broker_per_1000_requests"]["published"],
                  r["broker_per_1000_requests"]["delivered"],
                  r["db_transactions_per_worker_second"]] for r in runs])
    print_table("idle fleet, per second (heartbeats, Celery events), and the batch's own cost "
                "per 1,000 requests beyond it",
                ["workers", "DB xact/s idle", "published/s idle", "delivered/s idle",
                 "DB xact net", "published net", "delivered net"],
                [[r["workers"], r["idle_per_s"]["transactions"], r["idle_per_s"]["published"],
                  r["idle_per_s"]["delivered"],
                  r["net_of_idle_per_1000_requests"]["transactions"],
                  r["net_of_idle_per_1000_requests"]["published"],
                  r["net_of_idle_per_1000_requests"]["delivered"]] for r in runs])
    print_table("CPU seconds during the batch",
                ["workers", *ROLES, "postgres", "rabbitmq"],
                [[r["workers"], *r["cpu_seconds"].values()] for r in runs])
    write_results(args.name, {"settings": settings, "requests_per_worker": per_worker,
                              "goal_efficiency": GOAL_EFFICIENCY, "baselines": baselines,
                              "runs": runs})


if __name__ == "__main__":
    main()
