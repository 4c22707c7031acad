"""BatchGen's server settings: one table, read by the settings module and by the
`serve` command (which turns each into a flag).

Every setting is an environment variable with an embedded default, so the web
process, the control worker and every inference worker agree on them however they
were started (by `make run`, docker-compose or systemd).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    flag: str
    env: str
    default: str
    help: str
    is_bool: bool = False


SERVER_SETTINGS: tuple[Setting, ...] = (
    Setting("--listen-ip", "BATCHGEN_LISTEN_IP", "0.0.0.0", "address the web server binds"),
    Setting("--listen-port", "BATCHGEN_LISTEN_PORT", "10900", "port the web server binds"),
    Setting("--storage-path", "BATCHGEN_STORAGE_PATH", "./storage",
            "uploads, incremental output, the SQLite database, the model and the embedded broker"),
    Setting("--model", "BATCHGEN_MODEL", "",
            "local Hugging Face model folder (default: the bundled SmolLM2-135M-Instruct)"),
    # Several models on one BatchGen (docs/models.md): when set, it replaces --model.
    Setting("--models", "BATCHGEN_MODELS", "",
            "served models, comma-separated name=path[:engine] entries (each name is "
            "the id requests put in body.model) and name=lora:path@base LoRA adapters; "
            "empty: the one model of --model, or without it the bundled "
            "SmolLM2-135M-Instruct and all-MiniLM-L6-v2"),
    # LoRA adapters (docs/models.md): vLLM sizes its adapter buffers by both, in
    # memory, on every worker of a model that has adapters. 4 adapters at once lets a
    # batch mixing a few run without swapping; 16 is vLLM's own default rank.
    Setting("--max-loras", "BATCHGEN_MAX_LORAS", "4",
            "LoRA adapters a worker's engine runs at once (more are swapped in and out)"),
    Setting("--max-lora-rank", "BATCHGEN_MAX_LORA_RANK", "16",
            "the highest LoRA adapter rank served (vLLM: 1, 8, 16, 32, 64, 128, 256, 320, "
            "512)"),
    # The engines and the settings each reads: inference/engines/registry.py.
    Setting("--engine", "BATCHGEN_ENGINE", "vllm",
            "'vllm' (default), 'openai-http' (a remote OpenAI-compatible server, "
            "--engine-url) or 'simulated' (load and fault tests only)"),
    Setting("--max-intake-capacity", "BATCHGEN_MAX_INTAKE_CAPACITY", "1000000",
            "requests admitted and not yet finished, across all batches"),
    Setting("--max-pool-size", "BATCHGEN_MAX_POOL_SIZE", "10240",
            "slots (requests inside the engine at once) per inference worker"),
    Setting("--max-context-length", "BATCHGEN_MAX_CONTEXT_LENGTH", "",
            "prompt + completion token limit (default: the model's)"),
    Setting("--parse-thinking", "BATCHGEN_PARSE_THINKING", "false",
            "fill reasoning_content with vLLM's reasoning parser", is_bool=True),
    Setting("--reasoning-parser", "BATCHGEN_REASONING_PARSER", "deepseek_r1",
            "vLLM reasoning parser name used with --parse-thinking"),
    Setting("--tool-call-parser", "BATCHGEN_TOOL_CALL_PARSER", "",
            "vLLM tool call parser name (e.g. hermes) that fills tool_calls"),
    Setting("--engine-args", "BATCHGEN_ENGINE_ARGS", "{}",
            "JSON passed to vLLM's engine arguments (tensor_parallel_size, "
            "gpu_memory_utilization, max_num_seqs, dtype, quantization, ...); the "
            "simulated engine reads only fail_start ('config' or 'transient')"),
    # Tokens (prompt + output, estimated) a worker admits into its engine at once.
    Setting("--token-budget", "BATCHGEN_TOKEN_BUDGET", "0",
            "tokens a worker admits into its engine at once (0 = none for a vLLM "
            "engine, which admits from its own figures; the KV cache capacity an "
            "engine reports otherwise)"),
    # With a vLLM engine, the worker admits from the scheduler's own figures instead.
    Setting("--engine-queue-depth", "BATCHGEN_ENGINE_QUEUE_DEPTH", "0",
            "requests a worker keeps waiting in its vLLM engine's queue beyond those "
            "it runs (0 = the engine's max_num_seqs)"),
    Setting("--sim-latency-ms", "BATCHGEN_SIM_LATENCY_MS", "0",
            "time per request of the simulated engine"),
    # The openai-http engine (inference/engines/openai_http.py): an OpenAI-compatible
    # server does the inference. Its timeouts are long because a batch request waits
    # in the server's queue behind interactive traffic (the priority below).
    Setting("--engine-url", "BATCHGEN_ENGINE_URL", "",
            "base URL of the OpenAI-compatible server the openai-http engine sends "
            "requests to, e.g. http://gpu-pool:8000/v1"),
    Setting("--engine-api-key", "BATCHGEN_ENGINE_API_KEY", "",
            "bearer token for that server (prefer the variable: a flag shows in ps)"),
    Setting("--engine-timeout", "BATCHGEN_ENGINE_TIMEOUT_SECONDS", "600",
            "seconds the openai-http engine waits for one answer before retrying it"),
    Setting("--engine-retry-seconds", "BATCHGEN_ENGINE_RETRY_SECONDS", "600",
            "seconds a request is retried (connection errors, 429, 502-504, timeouts) "
            "before it fails; an unreachable server then hands the chunks back instead"),
    Setting("--engine-start-timeout", "BATCHGEN_ENGINE_START_TIMEOUT_SECONDS", "900",
            "seconds an openai-http worker waits at start for the server to list its model"),
    # vLLM's `priority` request field: lower is served earlier, interactive requests
    # have 0, so batch requests go behind them where the server runs
    # --scheduling-policy priority (docs/deployment.md).
    Setting("--engine-priority", "BATCHGEN_ENGINE_PRIORITY", "100",
            "priority sent with each openai-http request (vLLM: lower = earlier, "
            "interactive traffic has 0); empty: none sent"),
    Setting("--prefix-grouping", "BATCHGEN_PREFIX_GROUPING", "true",
            "group requests sharing a prompt prefix into the same chunks ('false' to turn off)"),
    Setting("--flower-port", "BATCHGEN_FLOWER_PORT", "5555", "Flower's port (0 = no Flower)"),
    # A client that stalls or trickles must not hold a web thread (issue 13): these
    # bound every read of a request, head and body, in the web worker's event loop
    # (batchgen_site/gunicorn_worker.py).
    # 30 s and 1 KiB/s are far below any working connection, and the attacker of an
    # open port then needs a connection sending 1 KiB/s to hold a thread.
    Setting("--client-timeout", "BATCHGEN_CLIENT_TIMEOUT_SECONDS", "30",
            "seconds a client may send nothing in the middle of a request before the "
            "server closes its connection"),
    Setting("--client-min-rate", "BATCHGEN_CLIENT_MIN_BYTES_PER_SECOND", "1024",
            "average bytes a second a request must arrive at, after its first "
            "client-timeout seconds (0 = no minimum)"),
    # OpenAI's bounds for `expires_after` (files) and `output_expires_after` (batches):
    # an hour to 30 days. A site may narrow them (less disk) or widen them.
    Setting("--min-file-expiry-seconds", "BATCHGEN_MIN_FILE_EXPIRY_SECONDS", "3600",
            "the shortest expires_after / output_expires_after a client may ask for"),
    Setting("--max-file-expiry-seconds", "BATCHGEN_MAX_FILE_EXPIRY_SECONDS", "2592000",
            "the longest expires_after / output_expires_after a client may ask for"),
    # Webhooks (docs/operations.md, "Webhooks"): how long one delivery attempt may
    # take (connect, send, answer: each phase), and how long after its event a
    # delivery is retried before it is given up (OpenAI and Standard Webhooks: a day).
    Setting("--webhook-timeout", "BATCHGEN_WEBHOOK_TIMEOUT_SECONDS", "10",
            "seconds a webhook receiver has to connect, take the event and answer"),
    Setting("--webhook-max-age", "BATCHGEN_WEBHOOK_MAX_AGE_SECONDS", "86400",
            "seconds after its event a webhook delivery is retried before it fails"),
    # The control worker's beat looks for due retries this often (the first attempt
    # of each event is sent at once, on commit, not by this sweep).
    Setting("--webhook-sweep", "BATCHGEN_WEBHOOK_SWEEP_SECONDS", "5",
            "seconds between the control worker's looks for webhook retries that are due"),
    # Any API key registers webhook URLs, so by default they must be https to public
    # addresses only (webhooks/destinations.py). Empty everywhere, `make run` too:
    # the server cannot tell a laptop from a shared host (docs/operations.md).
    Setting("--webhook-allowed-hosts", "BATCHGEN_WEBHOOK_ALLOWED_HOSTS", "",
            "comma-separated host names (*.example.com for subdomains), addresses and "
            "networks (10.0.0.0/8) webhooks may go to although not public, over http "
            "too (e.g. localhost,127.0.0.1 for a receiver on this machine)"),
    # Long enough for a worker host to restart and load its engine (about a minute
    # for vLLM here, several for a large model on GPUs); short enough that a batch
    # whose model cannot run fails within the quarter hour, not after its 24 h window.
    Setting("--model-unavailable-timeout", "BATCHGEN_MODEL_UNAVAILABLE_SECONDS", "900",
            "seconds a running batch waits for a model none of whose inference workers "
            "has its engine ready before it fails with model_unavailable (0: until its "
            "completion window ends)"),
    Setting("--inference-workers", "BATCHGEN_INFERENCE_WORKERS", "1",
            "inference workers started here, one engine each (0: none, they run on GPU hosts)"),
    Setting("--gpus-per-worker", "BATCHGEN_GPUS_PER_WORKER", "0",
            "GPUs each inference worker gets as its own CUDA_VISIBLE_DEVICES slice "
            "(0: no slicing, every worker sees every GPU)"),
)


def setting_default(env: str) -> str:
    """The embedded default of a setting of the table."""
    return next(setting.default for setting in SERVER_SETTINGS if setting.env == env)


def server_setting(env: str) -> str:
    """The value of a setting of the table: its variable, else its default."""
    return os.environ.get(env) or setting_default(env)
