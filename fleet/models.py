"""The fleet's records. They were inference's until issue 33 and keep its tables
(`db_table`): fleet/migrations/0001 moved them in Django's state only."""

from __future__ import annotations

from django.db import models


class Worker(models.Model):
    """An inference worker's heartbeat: its slots feed /v1/pool/status, its
    liveness /health. One row per worker process, refreshed every few seconds."""

    name = models.CharField(primary_key=True, max_length=255)  # Celery node name + pid
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    engine = models.CharField(max_length=32)
    model = models.CharField(max_length=255)
    slots_capacity = models.IntegerField()
    slots_active = models.IntegerField(default=0)
    # Length-aware admission: estimated tokens inside the engine, and the cap.
    tokens_active = models.BigIntegerField(default=0)
    token_budget = models.BigIntegerField(null=True, blank=True)
    ready = models.BooleanField(default=False)  # engine started
    requests_completed = models.BigIntegerField(default=0)
    requests_failed = models.BigIntegerField(default=0)
    tokens_generated = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Why it cannot write results now (the storage volume full), or empty: shown
    # by /health and /v1/pool/status while its chunks wait for room.
    storage_error = models.TextField(blank=True, default="")
    # The chunks it holds, as of its heartbeat: claimed and running, and queued ones
    # whose message it has taken from the broker but not started (prefetched).
    # Recovery counts these as present, not lost by the broker (batches.recovery).
    held_chunks = models.JSONField(default=list, blank=True)
    # The engine's adaptive concurrency (inference/adaptive.py), as of its heartbeat:
    # the limit of batch requests at the server and the signals it read; null when
    # the engine bounds nothing itself.
    admission = models.JSONField(null=True, blank=True)
    # The context its engine started with (a remote server's max_model_len under
    # BatchGen's cap), as of its heartbeat; 0 before the engine is ready. The web
    # process shows it when it could not ask the server itself (serving.model_info).
    max_context_length = models.IntegerField(default=0)
    # Its engines' work so far, as of its heartbeat, for the ETA's rate and cost of a
    # prompt token (batches/estimates.py): seconds it held at least one request, prompt
    # tokens computed and tokens generated (step by step where the engine tells them,
    # Engine.reports_work, else as each answer came back).
    busy_seconds = models.FloatField(default=0.0)
    prompt_tokens_computed = models.BigIntegerField(default=0)
    tokens_computed = models.BigIntegerField(default=0)
    # A prompt token's cost against an output token's, as its engine's own steps tell
    # (an engine that reports each step's work and time: WorkerState.add_work); None
    # until they do. The ETA's prior for a model whose work it has not fitted yet.
    engine_prompt_weight = models.FloatField(null=True, blank=True)
    # The requests of each chunk it runs that are in its engine now, as of its
    # heartbeat, from an engine that tells each request's tokens (Engine.progress):
    # {"<batch_id>-<index>": [requests, most tokens one may still generate, or null,
    # requests that have generated a token]}. The ETA starts such a chunk where its
    # longest request is (eta.Held.left_steps), and charges the prompts of the
    # requests in its slots that have no token yet (eta.Held.started).
    chunk_tails = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "inference_worker"

    def __str__(self) -> str:
        return self.name


class Residency(models.Model):
    """Which model a multiplexing inference worker is to hold (fleet/residency.py).
    The scheduler writes `model` (a conditional UPDATE on `epoch`, so two schedulers
    never decide one worker twice); the worker obeys and says what it holds through
    its heartbeat (Worker.model). A worker creates its row at start; the scheduler
    deletes the rows of workers that are gone."""

    worker = models.CharField(primary_key=True, max_length=255)  # Worker.name
    model = models.CharField(max_length=255, blank=True, default="")  # "": none yet
    epoch = models.IntegerField(default=0)  # grows by one at every decision
    assigned_at = models.DateTimeField(auto_now_add=True)  # the stretch began
    swap = models.BigIntegerField(null=True, blank=True)  # the ModelSwap of the decision
    # The models whose engine can never start on this worker with its settings (an
    # EngineConfigError: model -> why): the scheduler never gives it them again. They
    # go with the row, when the worker does: a restart (new settings) tries them again.
    cannot_start = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "inference_residency"

    def __str__(self) -> str:
        return f"{self.worker} -> {self.model or '(none)'}"


class ModelSwap(models.Model):
    """One decision to move a worker from a model to another (or to load its first:
    from_model blank), and what it cost once the worker made it: /v1/pool/status and
    /metrics count these."""

    worker = models.CharField(max_length=255)
    from_model = models.CharField(max_length=255, blank=True, default="")
    to_model = models.CharField(max_length=255)
    reason = models.CharField(max_length=32)  # fleet.residency.Reason
    decided_at = models.DateTimeField(db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)  # the old engine stopping
    finished_at = models.DateTimeField(null=True, blank=True)  # the new engine ready
    drain_seconds = models.FloatField(null=True, blank=True)  # chunks handed back
    seconds = models.FloatField(null=True, blank=True)  # stop + start
    error = models.TextField(blank=True, default="")  # why the new engine did not start

    class Meta:
        db_table = "inference_modelswap"

    def __str__(self) -> str:
        return f"{self.worker}: {self.from_model or '(none)'} -> {self.to_model}"
