from __future__ import annotations

from django.db import models
from django.utils import timezone

from serving.endpoints import ENDPOINTS

# The batch endpoints, one member per registered spec (serving/endpoints/).
Endpoint = models.TextChoices("Endpoint", [(spec.member, spec.url) for spec in ENDPOINTS.values()])


class BatchStatus(models.TextChoices):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)
TERMINAL_STATUSES = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.CANCELLED)


class Batch(models.Model):
    id = models.CharField(primary_key=True, max_length=64)
    endpoint = models.CharField(max_length=32, choices=Endpoint.choices)
    model = models.CharField(max_length=255)
    # Plain references (no database constraint) so the ids stay visible on the batch
    # after a file is deleted.
    input_file = models.ForeignKey("files.File", on_delete=models.DO_NOTHING,
                                   db_constraint=False, related_name="+")
    output_file = models.ForeignKey("files.File", on_delete=models.DO_NOTHING,
                                    db_constraint=False, null=True, blank=True,
                                    related_name="+")
    error_file = models.ForeignKey("files.File", on_delete=models.DO_NOTHING,
                                   db_constraint=False, null=True, blank=True,
                                   related_name="+")
    completion_window = models.CharField(max_length=8, default="24h")
    status = models.CharField(max_length=16, choices=BatchStatus.choices,
                              default=BatchStatus.VALIDATING, db_index=True)

    created_at = models.DateTimeField(default=timezone.now)
    validation_started_at = models.DateTimeField(null=True, blank=True)
    # How often recovery ran a lost validation again (bounded by
    # BATCHGEN_VALIDATION_MAX_RESTARTS, then the batch fails).
    validation_restarts = models.PositiveSmallIntegerField(default=0)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    total = models.IntegerField(default=0)
    completed = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    # Intake capacity this batch still holds: reserved at enqueue, returned as its
    # requests finish, fail or are skipped. The IntakePool's size is the sum over
    # active batches (batches.intake): no global counter row to contend on.
    intake_reserved = models.IntegerField(default=0)
    # Token usage (batches.usage): summed by the workers' progress flushes while the
    # batch runs, recomputed from the output file at finalization.
    usage_input_tokens = models.BigIntegerField(default=0)
    usage_cached_tokens = models.BigIntegerField(default=0)
    usage_output_tokens = models.BigIntegerField(default=0)
    usage_reasoning_tokens = models.BigIntegerField(default=0)
    # `output_expires_after.seconds` at create: the output and error files expire this
    # long after they are registered (null: the server's default file expiry).
    output_expires_after_seconds = models.IntegerField(null=True, blank=True)

    error = models.JSONField(null=True, blank=True)  # {"code", "message"}
    # The first ERRORS_SHOWN bad input lines, as the batch object shows them
    # ([{"code","message","line","param"}]); all that are kept are LineError rows.
    errors = models.JSONField(null=True, blank=True)
    line_errors_total = models.IntegerField(default=0)  # every bad line, kept or not
    metadata = models.JSONField(null=True, blank=True)

    max_decoding_length = models.IntegerField(null=True, blank=True)
    max_context_length = models.IntegerField(null=True, blank=True)
    temperature = models.FloatField(null=True, blank=True)
    top_p = models.FloatField(null=True, blank=True)
    top_k = models.IntegerField(null=True, blank=True)

    # Fair sharing (batches.dispatch): a batch's share of the SchedulingPool is
    # proportional to its priority; dispatch_pass is its stride-scheduling position.
    priority = models.PositiveIntegerField(default=1)
    # Chunks are ranges of the order file {storage}/chunks/{id}.order (prefix grouping).
    grouped = models.BooleanField(default=False)
    owner = models.ForeignKey("core.ApiKey", on_delete=models.SET_NULL, null=True,
                              blank=True, related_name="+")
    dispatch_pass = models.FloatField(default=0.0)
    # The ETA model's answer (batches/estimates.py), refreshed by the control worker's
    # tick rather than computed per poll: null while unknown (validating, or no
    # throughput measured yet). at_risk: its window cannot be kept even with every
    # worker of its model (batches/deadlines.py).
    estimated_completion_at = models.DateTimeField(null=True, blank=True)
    at_risk = models.BooleanField(default=False)
    # The mean output token limit of its lines (max_completion_tokens, max_tokens, or
    # the batch's max_decoding_length), set at validation; null when a line has none.
    # The ETA's prior for its answers' length before any of them finished.
    output_limit_mean = models.FloatField(null=True, blank=True)
    # The output token limits of the requests done so far, summed by the workers'
    # flushes (batches.usage.Usage.output_limit): the ETA costs the requests left by
    # the limits left, not by the mean of the answers so far (those of a small limit
    # end first).
    output_limit_done = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "batches"
        indexes = [
            models.Index(fields=["input_file", "status"]),
            # The IntakePool's size sums the few batches holding capacity (batches.intake).
            models.Index(fields=["intake_reserved"], name="batch_intake_holders",
                         condition=models.Q(intake_reserved__gt=0)),
            # A model's last finished batches (the ETA's answer-length prior).
            models.Index(fields=["model", "status", "completed_at"], name="batch_model_finished"),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


# How many line errors the batch object carries: a poll stays small however many
# lines failed (GET /v1/batches/{id}/errors pages through the rest).
ERRORS_SHOWN = 100


class LineError(models.Model):
    """One bad line of a batch's input, as validation found it (at most one per line;
    at most batches.validation.MAX_LISTED_ERRORS per batch)."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="line_errors")
    line = models.IntegerField()  # 1-based
    code = models.CharField(max_length=64)
    message = models.TextField()
    param = models.TextField(null=True, blank=True)  # noqa: DJ001 - null is "no parameter", as in the API

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["batch", "line"], name="line_error_unique_line"),
        ]

    def __str__(self) -> str:
        return f"{self.batch_id} line {self.line}: {self.code}"


class ChunkStatus(models.TextChoices):
    PENDING = "pending"  # in the IntakePool (the database), not yet dispatched
    QUEUED = "queued"  # dispatched to the inference queue, waiting for a worker
    RUNNING = "running"  # claimed by a worker that holds its lease
    DONE = "done"
    SKIPPED = "skipped"  # its batch was cancelled, failed or expired first


class Chunk(models.Model):
    """A contiguous run of input lines, [start_offset, end_offset) in bytes: the unit
    the IntakePool queues and a worker claims. The message carries only its id."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="chunks")
    index = models.IntegerField()
    start_offset = models.BigIntegerField()
    end_offset = models.BigIntegerField()
    first_line = models.IntegerField()  # 1-based line number of the first line
    count = models.IntegerField()
    # The served model whose workers run it (each of its requests names that model
    # or one of the model's LoRA adapters): only that model's workers get it.
    # Blank for chunks made before several models were served (the default model's).
    model = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=8, choices=ChunkStatus.choices,
                              default=ChunkStatus.PENDING)
    attempts = models.IntegerField(default=0)
    worker = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Results written and accounted so far (also while running).
    completed = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    published_at = models.DateTimeField(null=True, blank=True)
    # When a worker last claimed it: [claimed_at, finished_at] is its time in the
    # engine, from which each model's throughput is measured (batches/estimates.py).
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["batch", "index"], name="chunk_unique_index"),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"]),
            models.Index(fields=["batch", "status", "index"]),
            # A model's last finished chunks (its measured throughput).
            models.Index(fields=["model", "status", "finished_at"], name="chunk_model_finished"),
        ]

    def __str__(self) -> str:
        return f"{self.batch_id}#{self.index}"


class ControlLock(models.Model):
    """A named lock of the control plane: a row taken FOR UPDATE by the one kind of
    transaction that must run alone. `admission` serialises intake reservations (so
    the IntakePool never over-admits); `dispatch` serialises the dispatcher. Neither
    is taken on the per-request path: a worker's progress only touches its own chunk
    and batch rows. The lock order is in docs/architecture.md ("Locks")."""

    ADMISSION = "admission"
    DISPATCH = "dispatch"

    name = models.CharField(primary_key=True, max_length=32)

    def __str__(self) -> str:
        return self.name


class ModelThroughput(models.Model):
    """A served model's measured throughput (batches/estimates.py): cost units (a
    request plus its output tokens plus its prompt tokens at prompt_weight) a second
    over all of its workers (one worker's rate from its last finished chunks,
    eta.service_rate, times the live workers). Written by the control worker's
    estimate refresh, read by dispatch's deadline policy and by admission, so none
    measures it twice."""

    model = models.CharField(primary_key=True, max_length=255)
    rate = models.FloatField()
    cost_per_request = models.FloatField(default=1.0)
    # A prompt token's worth in output tokens in those units (estimates.PromptFit).
    prompt_weight = models.FloatField(default=0.0)
    workers = models.IntegerField(default=0)  # the live workers it was scaled to
    measured_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.model}: {self.rate:.1f}/s"
