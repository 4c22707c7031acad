"""What the benchmark scripts share: a BatchGen server started as real processes
(the end-to-end harness of tests/e2e), RSS sampling of its processes, tables and the
JSON result files under benchmarks/results/.

Nothing here talks to anything but 127.0.0.1, and every process a script starts is
stopped by `running_server` (or the script's own finally block) on the way out.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.e2e.harness import Api, Server, server_env, wait_until  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
DEFAULT_MODEL = ROOT / "storage" / "models" / "SmolLM2-135M-Instruct"
MiB = 1024 * 1024

__all__ = [
    "Api", "DEFAULT_MODEL", "MiB", "PySpy", "ROOT", "RssSampler", "Server", "drive_batch",
    "machine_info",
    "mark_start", "mib", "print_table", "ratios_by_round", "run_rounds", "running_server",
    "scratch_dir", "server_env", "server_env_arg", "summarize_rounds",
    "server_processes", "server_timeline", "wait_for_quiet", "wait_until", "write_results",
]


# --- output --------------------------------------------------------------------------


def machine_info() -> dict:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit, dirty = "", None
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        # Read-only: --no-optional-locks keeps status from refreshing the index.
        dirty = bool(subprocess.run(
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip())
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "gpu": shutil.which("nvidia-smi") is not None,
        "python": platform.python_version(),
        "commit": commit,
        "uncommitted_changes": dirty,
    }


def wait_for_quiet(*, max_busy: float = 30.0, timeout: float = 300.0) -> dict:
    """Other work shares this machine: wait (up to `timeout` s) until the whole
    machine's CPU is at most `max_busy` % busy over 3 s. Returns what was seen, so a
    result can say how noisy its run was."""
    started = time.monotonic()
    while True:
        busy = psutil.cpu_percent(interval=3.0)
        waited = time.monotonic() - started
        if busy <= max_busy or waited >= timeout:
            quiet = busy <= max_busy
            if not quiet:
                print(f"  (machine still {busy:.0f}% busy after {waited:.0f} s; "
                      "measuring anyway)", flush=True)
            return {"cpu_busy_percent": busy, "waited_s": round(waited, 1), "quiet": quiet,
                    "load_avg_1m": round(os.getloadavg()[0], 2)}


_STARTED: dict = {}


def _stop_on_sigterm(signum: int, _frame) -> None:
    """A benchmark stopped by SIGTERM (`kill`, `pkill`, a CI timeout) unwinds as on
    Ctrl-C: the servers it started stop in its `finally` blocks and context exits
    instead of running on without it (they run in sessions of their own, so the
    signal does not reach them)."""
    raise SystemExit(128 + signum)


if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _stop_on_sigterm)


def mark_start() -> None:
    """Record the machine and the commit as the run starts (the tree may change while
    a long run goes on; write_results records both)."""
    _STARTED.update(machine_info())


def write_results(name: str, data: dict) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    machine = machine_info()
    if _STARTED:
        machine["started"] = _STARTED["date"]
        machine["commit_at_start"] = _STARTED["commit"]
        machine["uncommitted_changes_at_start"] = _STARTED["uncommitted_changes"]
    payload = {"benchmark": name, "machine": machine, **data}
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    print(f"\nresults written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


def print_table(title: str, headers: list[str], rows: list[list]) -> None:
    def cell(value) -> str:
        if isinstance(value, float):
            if abs(value) >= 100:
                return f"{value:,.0f}"
            if abs(value) >= 10:
                return f"{value:,.1f}"
            return f"{value:,.2f}"
        if isinstance(value, int):
            return f"{value:,}"
        return "" if value is None else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) if i else v.ljust(w)
                        for i, (v, w) in enumerate(zip(row, widths, strict=True))))


@contextlib.contextmanager
def scratch_dir(prefix: str, keep: bool = False, base: str | None = None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"batchgen-bench-{prefix}-", dir=base))
    try:
        yield path
    finally:
        if keep:
            print(f"kept scratch directory {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def _db_time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC).timestamp()


def server_timeline(storage: Path, batch_id: str) -> dict:
    """Server-side timestamps of a batch (microsecond resolution), read read-only from
    the server's SQLite database, as seconds after the batch was created."""
    conn = sqlite3.connect(f"file:{storage / 'batchgen.sqlite3'}?mode=ro", uri=True, timeout=30)
    try:
        batch = conn.execute(
            "SELECT created_at, validation_started_at, in_progress_at, finalizing_at, "
            "completed_at FROM batches_batch WHERE id = ?", (batch_id,)).fetchone()
        chunks = conn.execute(
            "SELECT count(*), count(published_at), min(published_at), max(published_at), "
            "min(finished_at), max(finished_at) FROM batches_chunk WHERE batch_id = ?",
            (batch_id,)).fetchone()
    finally:
        conn.close()
    created, started, in_progress, finalizing, completed = map(_db_time, batch)
    first_pub, last_pub, first_done, last_done = map(_db_time, chunks[2:])

    def since(t):
        return None if t is None or created is None else round(t - created, 3)

    return {
        "chunks": chunks[0], "chunks_published": chunks[1],
        "queued_to_validation_start_s": since(started),
        "created_to_in_progress_s": since(in_progress),
        "validation_s": round(in_progress - started, 3) if started and in_progress else None,
        "created_to_first_publish_s": since(first_pub),
        "created_to_last_publish_s": since(last_pub),
        "created_to_first_chunk_done_s": since(first_done),
        "created_to_last_chunk_done_s": since(last_done),
        "created_to_finalizing_s": since(finalizing),
        "created_to_completed_s": since(completed),
    }


# --- interleaved rounds ---------------------------------------------------------------


def run_rounds(steps: list[tuple[str, Callable[[], dict]]], rounds: int, *, amount: str,
               labels: dict[str, str], alternate: bool = False,
               quiet_timeout: float = 300.0) -> dict[str, list[dict]]:
    """Run every step once per round, interleaved, so slow drifts in the machine's
    other load spread over all the paths instead of landing on one. `alternate`
    reverses the order every other round, so no path always goes first. Each result
    gets `rate` (its `amount` per second of `run_s`) and the noise around it."""
    runs: dict[str, list[dict]] = {}
    for round_no in range(1, rounds + 1):
        ordered = steps[::-1] if alternate and round_no % 2 == 0 else steps
        for key, step in ordered:
            print(f"round {round_no}: {labels.get(key, key)} ...", flush=True)
            noise = wait_for_quiet(timeout=quiet_timeout)
            result = step()
            result["round"] = round_no
            result["noise_before"] = noise
            result["load_avg_after"] = round(os.getloadavg()[0], 2)
            result["rate"] = result[amount] / result["run_s"]
            runs.setdefault(key, []).append(result)
            print(f"  {result[amount]} {amount.replace('_', ' ')} in {result['run_s']:.1f} s "
                  f"({result['rate']:.0f}/s), start-up {result['startup_s']:.1f} s", flush=True)
    return runs


def summarize_rounds(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per path: the median, min and max rate over the rounds, the median run and
    start-up (start-up apart from the run)."""
    summary = {}
    for key, results in runs.items():
        rates = [r["rate"] for r in results]
        summary[key] = {
            "rate_median": round(statistics.median(rates), 1),
            "rate_min": round(min(rates), 1),
            "rate_max": round(max(rates), 1),
            "run_s_median": round(statistics.median(r["run_s"] for r in results), 2),
            "startup_s_median": round(statistics.median(r["startup_s"] for r in results), 1),
            "rounds": len(results),
        }
    return summary


def ratios_by_round(runs: dict[str, list[dict]], summary: dict[str, dict], key: str,
                    base: str) -> dict[str, float | list[float]]:
    """`key`'s rate over `base`'s: of the medians, and paired by round (how much the
    ratio itself moved with the noise)."""
    if key not in summary or base not in summary:
        return {}
    pairs = zip(runs[key], runs[base], strict=False)
    return {f"{key}_vs_{base}": round(summary[key]["rate_median"]
                                      / summary[base]["rate_median"], 3),
            f"{key}_vs_{base}_by_round": [round(a["rate"] / b["rate"], 3) for a, b in pairs]}


# --- the server ----------------------------------------------------------------------


def server_env_arg(values: list[str] | None) -> dict[str, str]:
    """`--server-env KEY=VALUE` options as a dict (BATCHGEN_* settings only)."""
    env = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("BATCHGEN_"):
            raise SystemExit(f"--server-env wants BATCHGEN_NAME=value, got {item!r}")
        env[key] = value
    return env


@contextlib.contextmanager
def running_server(storage: Path, *, engine: str = "simulated", args: list[str] | None = None,
                   ready_timeout: float = 180, **env: str) -> Iterator[Server]:
    """`manage.py serve` on a free loopback port with its own storage path; every
    process it started is gone when the block exits, whatever happened inside."""
    server = Server(storage=storage, env=server_env(storage=storage, engine=engine, **env),
                    args=args or [])
    try:
        server.start(ready_timeout=ready_timeout)
        yield server
    finally:
        server.stop()


def drive_batch(http, path: Path, *, poll: float, timeout: float,
                endpoint: str = "/v1/chat/completions",
                during: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                ) -> dict:
    """Upload `path`, create a batch of it, poll until it ends, download its output:
    a user's whole flow over HTTP (`http`: an httpx.Client on the server). `during`
    wraps the run from the create to the end (a profiler). Returns the phases'
    seconds, the final batch and the output's bytes; raises unless completed."""
    t0 = time.perf_counter()
    with path.open("rb") as fh:
        file = http.post("/v1/files", data={"purpose": "batch"},
                         files={"file": (path.name, fh, "application/jsonl")})
    file.raise_for_status()
    t_uploaded = time.perf_counter()
    with during():
        response = http.post("/v1/batches", json={"input_file_id": file.json()["id"],
                                                  "endpoint": endpoint,
                                                  "completion_window": "24h"})
        response.raise_for_status()
        batch = response.json()
        t_in_progress = None
        deadline = time.monotonic() + timeout
        while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch not done after {timeout} s: "
                                   f"{batch['request_counts']}")
            time.sleep(poll)
            batch = http.get(f"/v1/batches/{batch['id']}").json()
            if t_in_progress is None and batch["status"] != "validating":
                t_in_progress = time.perf_counter()
        t_completed = time.perf_counter()
    if batch["status"] != "completed":
        raise RuntimeError(f"batch ended {batch['status']}: {batch.get('error')}")
    content = http.get(f"/v1/files/{batch['output_file_id']}/content")
    content.raise_for_status()
    t_downloaded = time.perf_counter()
    return {
        "upload_s": round(t_uploaded - t0, 3),
        "create_to_in_progress_s": round((t_in_progress or t_completed) - t_uploaded, 3),
        "in_progress_to_completed_s": round(t_completed - (t_in_progress or t_uploaded), 3),
        "download_s": round(t_downloaded - t_completed, 3),
        "end_to_end_s": round(t_downloaded - t0, 3),
        "batch": batch, "content": content.content,
    }


def server_processes(server: Server) -> dict[str, list[psutil.Process]]:
    """BatchGen's processes by role. The gunicorn worker is the master's child; the
    vLLM engine core (if any) is a child of the inference worker."""
    roles: dict[str, list[psutil.Process]] = {
        "web worker": [], "web master": [], "control worker": [], "inference worker": [],
        "engine core": [], "broker": [],
    }
    try:
        supervisor = psutil.Process(server.process.pid)
        children = supervisor.children(recursive=False)
    except psutil.NoSuchProcess:
        return roles
    for child in children:
        try:
            cmdline = " ".join(child.cmdline())
            if "redis-server" in cmdline:
                roles["broker"].append(child)
            elif "gunicorn" in cmdline:
                roles["web master"].append(child)
                roles["web worker"].extend(child.children(recursive=False))
            elif "-Q control" in cmdline:
                roles["control worker"].append(child)
            elif "-Q inference" in cmdline:
                roles["inference worker"].append(child)
                roles["engine core"].extend(child.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return roles


@dataclass
class RssSampler:
    """Samples the RSS of named groups of processes every `interval` seconds in a
    thread. `targets()` is called again every second, so restarted or late-forked
    processes (a gunicorn worker, the engine core) are picked up.

    Per role it keeps the largest RSS of any single process in it, per phase."""

    targets: Callable[[], dict[str, list[psutil.Process]]]
    interval: float = 0.05
    phase: str = "start"
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)
    series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = field(default_factory=time.monotonic)
    _procs: dict[str, list[psutil.Process]] = field(default_factory=dict)

    def start(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def current(self) -> dict[str, int]:
        if not self._procs:
            self._procs = self.targets()
        return {role: max(values) for role, values in self._measure().items() if values}

    def _measure(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for role, processes in self._procs.items():
            values = []
            for proc in processes:
                with contextlib.suppress(psutil.Error):
                    values.append(proc.memory_info().rss)
            found[role] = values
        return found

    def _run(self) -> None:
        self._procs = self.targets()
        refreshed = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - refreshed >= 1.0:
                self._procs = self.targets()
                refreshed = now
            for role, values in self._measure().items():
                if not values:
                    continue
                rss = max(values)
                self.series.setdefault(role, []).append((round(now - self._t0, 3), rss))
                phase = self.peaks.setdefault(self.phase, {})
                phase[role] = max(phase.get(role, 0), rss)
            self.samples += 1
            self._stop.wait(self.interval)

    def peak(self, role: str, phases: list[str] | None = None) -> int:
        return max((p.get(role, 0) for name, p in self.peaks.items()
                    if phases is None or name in phases), default=0)


def server_cpu_seconds(server: Server) -> dict[str, float]:
    """CPU seconds (user + system) so far of each role's processes, and of the
    supervisor itself; subtract two readings for a phase."""
    found: dict[str, float] = {}
    for role, processes in server_processes(server).items():
        found[role] = sum(_cpu_of(proc) for proc in processes)
    found["supervisor"] = _cpu_of(psutil.Process(server.process.pid))
    return found


def _cpu_of(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:  # gone since it was listed
        return 0.0
    return times.user + times.system


def mib(value: float) -> float:
    return round(value / MiB, 1)


# --- profiling (optional: py-spy is not a project dependency) -----------------------


def profiled_workers(server: Server, profile: Path | None) -> contextlib.ExitStack:
    """py-spy on the server's inference and control workers for the block (the
    scripts' --profile), each to PROFILE.inference.txt and PROFILE.control.txt; a
    block that profiles nothing when `profile` is None."""
    stack = contextlib.ExitStack()
    if profile is not None:
        roles = server_processes(server)
        for role in ("inference worker", "control worker"):
            stack.enter_context(PySpy(roles[role][0].pid,
                                      profile.with_suffix(f".{role.split()[0]}.txt")))
    return stack


class PySpy:
    """`py-spy record` attached to one process for as long as the block runs, in raw
    (collapsed stack) format, summarised by function. Install it into the venv with
    `.venv/bin/pip install py-spy` to use the scripts' --profile flags."""

    def __init__(self, pid: int, out: Path, *, rate: int = 100, gil: bool = False) -> None:
        self.pid, self.out, self.rate, self.gil = pid, out, rate, gil
        self.process: subprocess.Popen | None = None

    @staticmethod
    def available() -> str | None:
        exe = Path(sys.executable).with_name("py-spy")
        return str(exe) if exe.exists() else shutil.which("py-spy")

    def __enter__(self) -> PySpy:
        exe = self.available()
        if exe is None:
            raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
        argv = [exe, "record", "-p", str(self.pid), "-f", "raw", "-o", str(self.out),
                "-r", str(self.rate), "--nolineno", "--nonblocking"]
        if self.gil:
            argv.append("--gil")
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def summary(self, top: int = 15) -> dict:
        """Share of samples per function: `self` where the sample's innermost frame
        is, `inclusive` anywhere on the stack."""
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        if not self.out.exists():
            return {"samples": 0, "self": [], "inclusive": []}
        for line in self.out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + n

        def ranked(table: dict[str, int]) -> list[list]:
            best = sorted(table.items(), key=lambda kv: -kv[1])[:top]
            return [[name, round(100 * n / max(total, 1), 1)] for name, n in best]

        return {"samples": total, "self": ranked(own), "inclusive": ranked(inclusive)}
