"""BatchGen's server settings: one table of every variable the server reads, as
vLLM keeps its variables in one `envs.py`. The settings module takes its typed values
from it (`value`, `read_all`), the `serve` command turns each row with a flag into
that flag, and tests/site/test_settings_table.py holds the README's settings table to
it (`manage.py settings_table` prints that table's rows).

Every setting is an environment variable with an embedded default, so the web
process, the control worker and every inference worker agree on them however they
were started (by `make run`, docker-compose or systemd). A value that cannot be
used (not a number, out of bounds, not a choice) stops the process at start with
one message naming the setting (SettingError).

A new setting: one row here; read it as `settings.NAME` after adding
`NAME = SETTINGS["NAME"]` in settings.py, or with `value("NAME")` outside Django.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from environ import Env


class SettingError(ValueError):
    """A setting's value cannot be used; the message names the setting."""


@dataclass(frozen=True)
class Setting:
    flag: str | None  # the `serve` flag, or None: the variable alone
    env: str
    default: str  # as written in the environment; "" = none
    help: str
    is_bool: bool = False  # the flag is a switch (store_true); the value a bool
    kind: type = str  # str, int, float, bool, list (comma-separated), dict (JSON)
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    # An empty value means None (no value) rather than the default.
    blank_is_none: bool = False
    # The README's words for the default where the table's text is not it (a default
    # computed at start, a secret, a switch).
    shown: str = ""

    def __post_init__(self):
        if self.is_bool:
            object.__setattr__(self, "kind", bool)

    @property
    def readme_default(self) -> str:
        """How the README's settings table starts this setting's default cell."""
        if self.shown:
            return self.shown
        return f"`{self.default}`" if self.default else "none"

    def parse(self, raw: str | None) -> Any:
        """The typed value of `raw` (None: the variable is not set)."""
        text = self.default if raw is None else raw
        if self.kind is str:
            value = text
        elif self.kind is bool:
            value = Env.parse_value(text, bool)
        elif self.kind is list:
            value = [entry for entry in text.split(",") if entry]
        elif self.kind is dict:
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise self.error(text, f"not JSON ({exc})") from None
        else:
            if not text.strip():
                if self.blank_is_none or not self.default:
                    return None
                text = self.default
            try:
                value = self.kind(text)
            except ValueError:
                expected = "an integer" if self.kind is int else "a number"
                raise self.error(text, f"not {expected}") from None
        self.check(text, value)
        return value

    def check(self, text: str, value: Any) -> None:
        if self.minimum is not None and value < self.minimum:
            raise self.error(text, f"must be at least {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise self.error(text, f"must be at most {self.maximum:g}")
        if self.choices and value not in self.choices:
            raise self.error(text, f"must be one of {', '.join(self.choices)}")

    def error(self, text: str, reason: str) -> SettingError:
        where = f" (--{self.flag.lstrip('-')})" if self.flag else ""
        return SettingError(f"{self.env}={text!r}{where}: {reason}; {self.help}")


SERVER_SETTINGS: tuple[Setting, ...] = (
    Setting("--listen-ip", "BATCHGEN_LISTEN_IP", "0.0.0.0", "address the web server binds"),
    Setting("--listen-port", "BATCHGEN_LISTEN_PORT", "10900", "port the web server binds",
            kind=int, minimum=0, maximum=65535),
    Setting("--storage-path", "BATCHGEN_STORAGE_PATH", "./storage",
            "uploads, incremental output, the SQLite database, the model and the embedded "
            "broker (relative: to the folder the server starts in; unset: the project's)"),
    # Object storage (docs/deployment.md): a fleet with no shared file system. The
    # storage path then holds only each process's own scratch files.
    Setting("--storage-url", "BATCHGEN_STORAGE_URL", "",
            "s3://bucket/prefix: uploads and output files on an S3-compatible store "
            "(AWS credentials chain, AWS_REGION, AWS_ENDPOINT_URL for a non-AWS store); "
            "empty: on the storage path",
            shown="none"),
    Setting("--s3-addressing-style", "BATCHGEN_S3_ADDRESSING_STYLE", "auto",
            "how S3 requests name the bucket: 'path' for stores without virtual-host "
            "buckets (MinIO, SeaweedFS, Ceph RGW by IP), 'virtual' or 'auto' (boto's "
            "choice)", choices=("auto", "path", "virtual")),
    Setting("--s3-presigned-downloads", "BATCHGEN_S3_PRESIGNED_DOWNLOADS", "false",
            "on a bucket, GET /v1/files/{id}/content answers 302 to a presigned URL valid "
            "for 5 minutes, so the bytes go from the store to the client without passing "
            "through the web server (the client must reach the store's endpoint)",
            kind=bool),
    Setting("--model", "BATCHGEN_MODEL", "",
            "local Hugging Face model folder (default: the bundled SmolLM2-135M-Instruct)",
            shown="none"),
    # Several models on one BatchGen (docs/models.md): when set, it replaces --model.
    Setting("--models", "BATCHGEN_MODELS", "",
            "served models, comma-separated name=path[:engine] entries (each name is "
            "the id requests put in body.model) and name=lora:path@base LoRA adapters; "
            "empty: the one model of --model, or without it the bundled "
            "SmolLM2-135M-Instruct and all-MiniLM-L6-v2",
            shown="the bundled SmolLM2-135M-Instruct and all-MiniLM-L6-v2"),
    # LoRA adapters (docs/models.md): vLLM sizes its adapter buffers by both, in
    # memory, on every worker of a model that has adapters. 4 adapters at once lets a
    # batch mixing a few run without swapping; 16 is vLLM's own default rank.
    Setting("--max-loras", "BATCHGEN_MAX_LORAS", "4",
            "LoRA adapters a worker's engine runs at once (more are swapped in and out)",
            kind=int, minimum=1),
    Setting("--max-lora-rank", "BATCHGEN_MAX_LORA_RANK", "16",
            "the highest LoRA adapter rank served (vLLM: 1, 8, 16, 32, 64, 128, 256, 320, "
            "512)",
            kind=int, minimum=1),
    # The engines and the settings each reads: serving/engines/registry.py.
    Setting("--engine", "BATCHGEN_ENGINE", "vllm",
            "'vllm' (default), 'openai-http' (a remote OpenAI-compatible server, "
            "--engine-url) or 'simulated' (load and fault tests only)"),
    Setting("--max-intake-capacity", "BATCHGEN_MAX_INTAKE_CAPACITY", "1000000",
            "requests admitted and not yet finished, across all batches",
            kind=int, minimum=1),
    Setting("--max-pool-size", "BATCHGEN_MAX_POOL_SIZE", "10240",
            "slots (requests inside the engine at once) per inference worker",
            kind=int, minimum=1),
    Setting("--max-context-length", "BATCHGEN_MAX_CONTEXT_LENGTH", "",
            "prompt + completion token limit (default: the model's)",
            kind=int, minimum=0, shown="the model's"),
    Setting("--parse-thinking", "BATCHGEN_PARSE_THINKING", "false",
            "fill reasoning_content with vLLM's reasoning parser", is_bool=True,
            shown="off"),
    Setting("--reasoning-parser", "BATCHGEN_REASONING_PARSER", "deepseek_r1",
            "vLLM reasoning parser name used with --parse-thinking"),
    Setting("--tool-call-parser", "BATCHGEN_TOOL_CALL_PARSER", "",
            "vLLM tool call parser name (e.g. hermes) that fills tool_calls"),
    Setting("--engine-args", "BATCHGEN_ENGINE_ARGS", "{}",
            "JSON passed to vLLM's engine arguments (tensor_parallel_size, "
            "gpu_memory_utilization, max_num_seqs, dtype, quantization, ...); the "
            "simulated engine reads its test knobs (fail_start, start_seconds, answer_tokens)",
            kind=dict),
    # Tokens (prompt + output, estimated) a worker admits into its engine at once.
    Setting("--token-budget", "BATCHGEN_TOKEN_BUDGET", "0",
            "tokens a worker admits into its engine at once (0 = none for a vLLM "
            "engine, which admits from its own figures; the KV cache capacity an "
            "engine reports otherwise)",
            kind=int, minimum=0),
    # With a vLLM engine, the worker admits from the scheduler's own figures instead.
    Setting("--engine-queue-depth", "BATCHGEN_ENGINE_QUEUE_DEPTH", "0",
            "requests a worker keeps waiting in its vLLM engine's queue beyond those "
            "it runs (0 = the engine's max_num_seqs)",
            kind=int, minimum=0),
    Setting("--sim-latency-ms", "BATCHGEN_SIM_LATENCY_MS", "0",
            "time per request of the simulated engine",
            kind=float, minimum=0),
    # Beside it, a time per token, so a batch of varied lengths takes varied time
    # (benchmarks/eta.py): each output token costs this, each prompt token a
    # twentieth of it (prefill is cheaper than decoding, as on a real engine).
    Setting("--sim-token-latency-ms", "BATCHGEN_SIM_TOKEN_LATENCY_MS", "0",
            "time per output token of the simulated engine (a prompt token: 1/20 of it)",
            kind=float, minimum=0),
    # The openai-http engine (inference/engines/openai_http.py): an OpenAI-compatible
    # server does the inference. Its timeouts are long because a batch request waits
    # in the server's queue behind interactive traffic (the priority below).
    Setting("--engine-url", "BATCHGEN_ENGINE_URL", "",
            "base URL of the OpenAI-compatible server the openai-http engine sends "
            "requests to, e.g. http://gpu-pool:8000/v1"),
    Setting("--engine-api-key", "BATCHGEN_ENGINE_API_KEY", "",
            "bearer token for that server (prefer the variable: a flag shows in ps)"),
    Setting("--engine-timeout", "BATCHGEN_ENGINE_TIMEOUT_SECONDS", "600",
            "seconds the openai-http engine waits for one answer before retrying it",
            kind=float, minimum=0),
    Setting("--engine-retry-seconds", "BATCHGEN_ENGINE_RETRY_SECONDS", "600",
            "seconds a request is retried (connection errors, 429, 502-504, timeouts) "
            "before it fails; an unreachable server then hands the chunks back instead",
            kind=float, minimum=0),
    Setting("--engine-start-timeout", "BATCHGEN_ENGINE_START_TIMEOUT_SECONDS", "900",
            "seconds an openai-http worker waits at start for the server to list its model",
            kind=float, minimum=0),
    # vLLM's `priority` request field: lower is served earlier, interactive requests
    # have 0, so batch requests go behind them where the server runs
    # --scheduling-policy priority (docs/deployment.md).
    Setting("--engine-priority", "BATCHGEN_ENGINE_PRIORITY", "100",
            "priority sent with each openai-http request (vLLM: lower = earlier, "
            "interactive traffic has 0); empty: none sent",
            kind=int, blank_is_none=True),
    # Adaptive concurrency (inference/adaptive.py, issue 34): priority orders only the
    # server's queue, while every step carries every sequence it runs; so the batch
    # requests at the server follow its load. 1.5: interactive TTFT p99 within 1.5x
    # its value alone was the goal measured in docs/benchmarks.md.
    Setting("--adaptive-concurrency", "BATCHGEN_ADAPTIVE_CONCURRENCY", "true",
            "openai-http: the batch requests in flight at the server follow its load "
            "(other traffic, its queue, its inter-token latency) between the floor and "
            "the ceiling ('false': as many as the worker has slots)",
            kind=bool),
    Setting("--adaptive-target", "BATCHGEN_ADAPTIVE_TARGET", "1.5",
            "while other traffic shares the server, the server's inter-token latency may "
            "reach this many times its unloaded value before the batch backs off",
            kind=float, minimum=1.05, maximum=100),
    # One request keeps the batch progressing under any interactive load.
    Setting("--adaptive-floor", "BATCHGEN_ADAPTIVE_FLOOR", "1",
            "batch requests a worker keeps at the server whatever its load",
            kind=int, minimum=1, maximum=100_000),
    # vLLM's default max_num_seqs on a GPU: more than it runs only wait in its queue.
    Setting("--adaptive-ceiling", "BATCHGEN_ADAPTIVE_CEILING", "256",
            "batch requests a worker sends the server at most while nothing else uses it",
            kind=int, minimum=1, maximum=100_000),
    Setting("--prefix-grouping", "BATCHGEN_PREFIX_GROUPING", "true",
            "group requests sharing a prompt prefix into the same chunks ('false' to turn off)",
            kind=bool),
    Setting("--flower-port", "BATCHGEN_FLOWER_PORT", "5555", "Flower's port (0 = no Flower)",
            kind=int, minimum=0, maximum=65535, blank_is_none=True),
    # A client that stalls or trickles must not hold a web thread (issue 13): these
    # bound every read of a request, head and body, in the web worker's event loop
    # (batchgen_site/gunicorn_worker.py).
    # 30 s and 1 KiB/s are far below any working connection, and the attacker of an
    # open port then needs a connection sending 1 KiB/s to hold a thread.
    Setting("--client-timeout", "BATCHGEN_CLIENT_TIMEOUT_SECONDS", "30",
            "seconds a client may send nothing in the middle of a request before the "
            "server closes its connection",
            kind=float, minimum=0),
    Setting("--client-min-rate", "BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND", "1024",
            "average bytes a second a request must arrive at, after its first "
            "client-timeout seconds (0 = no minimum)",
            kind=float, minimum=0),
    # OpenAI's bounds for `expires_after` (files) and `output_expires_after` (batches):
    # an hour to 30 days. A site may narrow them (less disk) or widen them.
    Setting("--min-file-expiry-seconds", "BATCHGEN_MIN_FILE_EXPIRY_SECONDS", "3600",
            "the shortest expires_after / output_expires_after a client may ask for",
            kind=int, minimum=1),
    Setting("--max-file-expiry-seconds", "BATCHGEN_MAX_FILE_EXPIRY_SECONDS", "2592000",
            "the longest expires_after / output_expires_after a client may ask for",
            kind=int, minimum=1),
    # A batch's completion_window (batches/windows.py): OpenAI's `24h` is always
    # taken; other windows within these bounds are an extension. An hour is about the
    # shortest a shared server can plan for; a week keeps expiry meaningful.
    Setting("--min-completion-window", "BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS", "3600",
            "the shortest completion_window a batch may ask for, in seconds",
            kind=int, minimum=1),
    Setting("--max-completion-window", "BATCHGEN_MAX_COMPLETION_WINDOW_SECONDS", "604800",
            "the longest completion_window a batch may ask for, in seconds",
            kind=int, minimum=1),
    # The deadline policy (batches/deadlines.py): off, dispatch is fair share alone.
    Setting(None, "BATCHGEN_DEADLINE_POLICY", "true",
            "give batches that would miss their completion window more share, least "
            "slack first ('false': fair share alone)", kind=bool),
    # A diagnostic: each refresh's chunk play, inputs and result, appended to this
    # file (batches/eta_record.py) for benchmarks/eta_replay.py to play again.
    Setting(None, "BATCHGEN_ETA_RECORD", "",
            "append each ETA refresh's play, inputs and result, to this file as JSON "
            "lines, for benchmarks/eta_replay.py (a diagnostic; empty: off)"),
    # OpenAI answers 200 to any window; a site that would rather refuse a window its
    # ETA cannot keep says so here (400 completion_window_infeasible).
    Setting("--strict-completion-window", "BATCHGEN_STRICT_COMPLETION_WINDOW", "false",
            "refuse a batch whose ETA lies past its completion window", is_bool=True),
    # Webhooks (docs/operations.md, "Webhooks"): how long one delivery attempt may
    # take (connect, send, answer: each phase), and how long after its event a
    # delivery is retried before it is given up (OpenAI and Standard Webhooks: a day).
    Setting("--webhook-timeout", "BATCHGEN_WEBHOOK_TIMEOUT_SECONDS", "10",
            "seconds a webhook receiver has to connect, take the event and answer",
            kind=float, minimum=0),
    Setting("--webhook-max-age", "BATCHGEN_WEBHOOK_MAX_AGE_SECONDS", "86400",
            "seconds after its event a webhook delivery is retried before it fails",
            kind=float, minimum=0),
    # The control worker's beat looks for due retries this often (the first attempt
    # of each event is sent at once, on commit, not by this sweep).
    Setting("--webhook-sweep", "BATCHGEN_WEBHOOK_SWEEP_SECONDS", "5",
            "seconds between the control worker's looks for webhook retries that are due",
            kind=float, minimum=0),
    # Any API key registers webhook URLs, so by default they must be https to public
    # addresses only (webhooks/destinations.py). Empty everywhere, `make run` too:
    # the server cannot tell a laptop from a shared host (docs/operations.md).
    Setting("--webhook-allowed-hosts", "BATCHGEN_WEBHOOK_ALLOWED_HOSTS", "",
            "comma-separated host names (*.example.com for subdomains), addresses and "
            "networks (10.0.0.0/8) webhooks may go to although not public, over http "
            "too (e.g. localhost,127.0.0.1 for a receiver on this machine)",
            kind=list, shown="empty"),
    # Long enough for a worker host to restart and load its engine (about a minute
    # for vLLM here, several for a large model on GPUs); short enough that a batch
    # whose model cannot run fails within the quarter hour, not after its 24 h window.
    Setting("--model-unavailable-timeout", "BATCHGEN_MODEL_UNAVAILABLE_SECONDS", "900",
            "seconds a running batch waits for a model none of whose inference workers "
            "has its engine ready before it fails with model_unavailable (0: until its "
            "completion window ends)",
            kind=float, minimum=0),
    Setting("--inference-workers", "BATCHGEN_INFERENCE_WORKERS", "1",
            "inference workers started here, one engine each (0: none, they run on GPU hosts)",
            kind=int, minimum=0),
    # Model multiplexing (fleet/residency.py, docs/models.md): workers not pinned
    # to a model; one scheduler decides which model each holds. Off by default: the
    # fixed layout (each model its own workers) never swaps.
    Setting("--multiplex", "BATCHGEN_MULTIPLEX", "false",
            "inference workers are not pinned to a model: --inference-workers N in all, "
            "each holding whichever model the residency scheduler gives it", is_bool=True),
    # The bound a batch waits for its model to be resident somewhere, and how long a
    # resident model keeps its worker while another waits: a swap costs a model load
    # (half a minute for SmolLM2 on this CPU), so a stretch a few times that keeps the
    # time spent swapping small (docs/architecture.md, "Model multiplexing").
    Setting("--max-model-wait", "BATCHGEN_MAX_MODEL_WAIT_SECONDS", "900",
            "multiplexing: the longest a batch waits before its model is resident on a "
            "worker, whatever else is queued", kind=float, minimum=1),
    Setting("--model-stretch", "BATCHGEN_MODEL_STRETCH_SECONDS", "300",
            "multiplexing: how long a resident model keeps its worker while another model "
            "waits (it keeps it longer while nothing else waits)", kind=float, minimum=0),
    Setting("--gpus-per-worker", "BATCHGEN_GPUS_PER_WORKER", "0",
            "GPUs each inference worker gets as its own CUDA_VISIBLE_DEVICES slice "
            "(0: no slicing, every worker sees every GPU)",
            kind=int, minimum=0),
    # The web server's processes and threads (`serve`): processes, not threads, carry
    # the polling load; threads of one process share its GIL, so beyond a few they
    # queue for it (benchmarks/load.py, docs/benchmarks.md). Empty: twice the cores,
    # 2 to 8 (serve.DEFAULT_WEB_WORKERS).
    # A bounded stop (issue 35): docker gives a container 10 s between SIGTERM and
    # SIGKILL; 5 s lets an idle or simulated server stop cleanly (about 2 s measured)
    # and leaves the rest of the grace to spare. A worker still handing chunks back
    # at the deadline is killed: its chunks go back when their lease runs out.
    Setting("--stop-timeout", "BATCHGEN_STOP_TIMEOUT_SECONDS", "5",
            "seconds `serve` waits for its programs to stop on SIGINT or SIGTERM before "
            "it kills what is left", kind=float, minimum=0.5, maximum=3600),
    Setting("--web-workers", "BATCHGEN_WEB_WORKERS", "",
            "gunicorn worker processes", kind=int, minimum=1,
            shown="twice the cores, 2 to 8"),
    Setting("--web-threads", "BATCHGEN_WEB_THREADS", "4", "threads per gunicorn worker",
            kind=int, minimum=1),
    Setting("--access-log", "BATCHGEN_ACCESS_LOG", "except-polls",
            "which HTTP requests to log: all, all but successful polls (except-polls), none",
            choices=("all", "except-polls", "none")),
    # --- Variables without a flag ------------------------------------------------------
    # Where the state lives: empty means SQLite under the storage path and the
    # embedded broker (a private redis-server on a Unix socket there).
    Setting(None, "DATABASE_URL", "", "the database (postgres://... in production)",
            shown="SQLite under the storage path"),
    # Django's persistent connections; empty: 600 s for SQLite (opening one and its
    # PRAGMAs costs ~1.5 ms), 60 s for a server database.
    Setting(None, "DATABASE_CONN_MAX_AGE", "",
            "seconds a database connection is kept open for reuse", kind=int, minimum=0,
            shown="600 with SQLite, 60 otherwise"),
    Setting(None, "BATCHGEN_BROKER_URL", "",
            "the Celery broker (amqp://... RabbitMQ or redis://... in production)",
            shown="the embedded broker"),
    # Production deployments set it; the embedded default is for a single machine,
    # where the key only signs admin sessions.
    Setting(None, "DJANGO_SECRET_KEY", "batchgen-embedded-insecure-key-set-DJANGO_SECRET_KEY",
            "signs the admin's sessions; set one in production", shown="an embedded key"),
    Setting(None, "DJANGO_ALLOWED_HOSTS", "*",
            "comma-separated host names the web server answers to", kind=list),
    Setting(None, "DJANGO_CSRF_TRUSTED_ORIGINS", "",
            "comma-separated origins trusted for the admin's forms behind a proxy", kind=list),
    Setting(None, "BATCHGEN_DEBUG", "false", "Django's debug mode (never in production)",
            kind=bool),
    Setting(None, "BATCHGEN_LOG_LEVEL", "INFO",
            "the processes' log level (DEBUG also shows the routine beat ticks)"),
    # Require an API key on /v1/ even before any key exists (keys: manage.py createapikey).
    Setting(None, "BATCHGEN_REQUIRE_AUTH", "false",
            "require an API key on /v1/ even while no key exists", kind=bool),
    # Flower can revoke tasks and shut workers down: `serve` exposes it beyond
    # loopback only with a password (Flower reads the variable itself).
    Setting(None, "FLOWER_BASIC_AUTH", "",
            "user:password for Flower; without it Flower listens on 127.0.0.1 only"),
    # Size limits (tests/site/test_limits.py): going over one is refused with a message
    # naming it. OpenAI bounds a batch's metadata to 16 keys of up to 64 characters,
    # values of up to 512; a batch create is a few hundred bytes, so 2 MiB of request
    # body (JSON, form fields; files stream to disk) is generous.
    Setting(None, "BATCHGEN_MAX_UPLOAD_BYTES", "10737418240",
            "the largest uploaded file (10 GiB)", kind=int, minimum=1),
    Setting(None, "BATCHGEN_MAX_LINE_BYTES", "16777216",
            "the longest input line (16 MiB)", kind=int, minimum=1),
    Setting(None, "BATCHGEN_MAX_REQUESTS_PER_BATCH", "1000000",
            "requests in one batch", kind=int, minimum=1),
    Setting(None, "BATCHGEN_MAX_METADATA_KEYS", "16", "keys of a batch's metadata",
            kind=int, minimum=0),
    Setting(None, "BATCHGEN_MAX_METADATA_KEY_CHARS", "64",
            "characters of a metadata key", kind=int, minimum=1),
    Setting(None, "BATCHGEN_MAX_METADATA_VALUE_CHARS", "512",
            "characters of a metadata value", kind=int, minimum=1),
    Setting(None, "BATCHGEN_MAX_REQUEST_BODY_BYTES", "2097152",
            "a request body other than an uploaded file (JSON, form fields; 2 MiB)",
            kind=int, minimum=1),
    # Requests per chunk (one broker message). Small enough that request_counts and the
    # intake figure move often and a crashed chunk redoes little; large enough that a
    # million-request batch is a few thousand messages and rows.
    Setting(None, "BATCHGEN_CHUNK_SIZE", "200", "requests per chunk", kind=int, minimum=1),
    Setting(None, "BATCHGEN_CHUNK_LEASE_SECONDS", "60",
            "a chunk whose worker stops renewing its lease this long is requeued",
            kind=int, minimum=1),
    # Generous: a 10 GiB input takes minutes to validate. With the restarts below a
    # validation must finish within an hour, ample for a 10 GiB input.
    Setting(None, "BATCHGEN_VALIDATION_TIMEOUT_SECONDS", "600",
            "a validation not finished after this long is run again by recovery",
            kind=int, minimum=1),
    Setting(None, "BATCHGEN_VALIDATION_MAX_RESTARTS", "5",
            "after this many restarts a lost validation fails its batch (validation_failed)",
            kind=int, minimum=0),
    Setting(None, "BATCHGEN_WORKER_TTL_SECONDS", "30",
            "a worker is alive while its heartbeat is younger than this", kind=int, minimum=1),
    Setting(None, "BATCHGEN_HEARTBEAT_SECONDS", "2", "seconds between a worker's heartbeats",
            kind=float, minimum=0),
    # The progress figures' freshness against the control plane's load, which stays
    # per worker, not per chunk or request; a large fleet may raise it
    # (docs/deployment.md, "How far one database goes").
    Setting(None, "BATCHGEN_PROGRESS_FLUSH_SECONDS", "0.5",
            "how often a worker sends what all its chunks did, in one transaction",
            kind=float, minimum=0),
    # Its slot figures change only with the workers' heartbeats anyway, and hundreds
    # of pollers then cost a few aggregate queries a second instead of four each.
    Setting(None, "BATCHGEN_POOL_STATUS_CACHE_SECONDS", "1",
            "/v1/pool/status is answered from a per-process cache this young (0: none)",
            kind=float, minimum=0),
    Setting(None, "BATCHGEN_RETRY_AFTER_SECONDS", "30",
            "the Retry-After a client is told when the intake pool is full", kind=int,
            minimum=0),
    Setting(None, "BATCHGEN_FILE_EXPIRY_DAYS", "30",
            "expiry of a file whose client gave none (0: such files never expire)",
            kind=int, minimum=0),
    # Retries back off exponentially with jitter from the first delay, doubling up to
    # the longest (5 s, 10 s, ... 1 h: about 30 attempts in a day).
    Setting(None, "BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS", "5",
            "the first webhook retry's delay, doubling (plus up to this much jitter) ...",
            kind=float, minimum=0),
    Setting(None, "BATCHGEN_WEBHOOK_RETRY_MAX_SECONDS", "3600",
            "... up to this delay between retries", kind=float, minimum=0),
    # On a host whose vLLM engines run on the CPU, `serve` keeps its other processes
    # (and vLLM's scheduler) off the CPUs vLLM computes on (batchgen_site/cpu_placement.py).
    Setting(None, "BATCHGEN_ENGINE_CPU_ISOLATION", "true",
            "where vLLM runs on the CPU, keep serve's other processes and vLLM's scheduler "
            "off the CPUs vLLM computes on ('false': they may run anywhere)", kind=bool),
    # Set by `serve` for each inference worker it starts (and its queue,
    # inference.<model id>); empty means the default model.
    Setting(None, "BATCHGEN_WORKER_MODEL", "",
            "the served model an inference worker holds (serve sets it for each worker)"),
)


SETTINGS_BY_ENV: dict[str, Setting] = {setting.env: setting for setting in SERVER_SETTINGS}


def setting_default(env: str) -> str:
    """The embedded default of a setting of the table, as text."""
    return SETTINGS_BY_ENV[env].default


def server_setting(env: str) -> str:
    """The text of a setting of the table: its variable, else its default."""
    return os.environ.get(env) or setting_default(env)


def value(env: str, environ: Mapping[str, str] | None = None) -> Any:
    """The typed value of a setting of the table, from `environ` (the process's
    environment by default); SettingError names it when it cannot be used."""
    return SETTINGS_BY_ENV[env].parse((os.environ if environ is None else environ).get(env))


def read_all(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every setting's typed value, checked at once: all that cannot be used are
    named in one SettingError, so a misconfiguration is said once, at start."""
    environ = os.environ if environ is None else environ
    values, errors = {}, []
    for setting in SERVER_SETTINGS:
        try:
            values[setting.env] = setting.parse(environ.get(setting.env))
        except SettingError as exc:
            errors.append(str(exc))
    low, high = (values.get(f"BATCHGEN_{end}_FILE_EXPIRY_SECONDS") for end in ("MIN", "MAX"))
    if low is not None and high is not None and low > high:
        errors.append(f"BATCHGEN_MIN_FILE_EXPIRY_SECONDS={low} is above "
                      f"BATCHGEN_MAX_FILE_EXPIRY_SECONDS={high}")
    low, high = (values.get(f"BATCHGEN_{end}_COMPLETION_WINDOW_SECONDS") for end in ("MIN", "MAX"))
    if low is not None and high is not None and low > high:
        errors.append(f"BATCHGEN_MIN_COMPLETION_WINDOW_SECONDS={low} is above "
                      f"BATCHGEN_MAX_COMPLETION_WINDOW_SECONDS={high}")
    floor, ceiling = values.get("BATCHGEN_ADAPTIVE_FLOOR"), values.get("BATCHGEN_ADAPTIVE_CEILING")
    if floor is not None and ceiling is not None and floor > ceiling:
        errors.append(f"BATCHGEN_ADAPTIVE_FLOOR={floor} is above "
                      f"BATCHGEN_ADAPTIVE_CEILING={ceiling}")
    if errors:
        raise SettingError("\n".join(errors))
    return values


def readme_rows() -> list[str]:
    """The README's settings table rows, one per setting: flag, variable, the default
    and the help (`manage.py settings_table` prints them)."""
    return [f"|{f' `{s.flag}` ' if s.flag else ' '}| `{s.env}` | {s.readme_default}: {s.help} |"
            for s in SERVER_SETTINGS]
