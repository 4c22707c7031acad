from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

# The highest fair-share weight of a key (as metadata.priority is bounded per batch).
MAX_KEY_WEIGHT = 1000


class ApiKey(models.Model):
    """A client's API key. Only its sha256 is stored: keys are long random tokens, so
    a fast hash is safe, and lookup is one indexed equality.

    Quotas (batches.quotas; null = no limit): `max_intake_requests` bounds the
    requests this key's batches hold in the IntakePool at once, `tokens_per_day` the
    input plus output tokens it used in the current UTC day (KeyUsage). `weight` is
    the key's share of the workers against other keys (batches.dispatch)."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)  # shown to operators to tell keys apart
    hashed_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    max_intake_requests = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Most requests this key's batches may hold in the intake pool at once "
                  "(empty: no limit).")
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True,
        help_text="Input plus output tokens per UTC day; new batches are refused once "
                  "today's usage reaches it (empty: no limit).")
    weight = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_KEY_WEIGHT)],
        help_text="Fair-share weight against other keys (1 to 1000); a batch's "
                  "metadata.priority divides the key's share among its batches.")

    class Meta:
        verbose_name = "API key"
        # The table keeps the name it was created with in batchgen_site (the model
        # moved to core without touching the database: core/migrations/0001).
        db_table = "batchgen_site_apikey"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_authenticated(self) -> bool:  # lets DRF treat the key as the request's user
        return True


class KeyUsage(models.Model):
    """What one API key's batches used in one UTC day: requests finished (completed
    or failed) and tokens. Workers add to it with their progress flushes
    (batches.chunks), and finalization corrects it by what the flushes missed, so
    over a batch's life the tokens equal the sum over its output lines' usage."""

    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="usage_days")
    day = models.DateField()  # UTC
    requests_completed = models.BigIntegerField(default=0)
    requests_failed = models.BigIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "API key usage (per day)"
        verbose_name_plural = "API key usage (per day)"
        db_table = "batchgen_site_keyusage"  # as ApiKey's
        ordering = ["-day", "key_id"]
        constraints = [
            models.UniqueConstraint(fields=["key", "day"], name="key_usage_unique_day"),
        ]
        indexes = [models.Index(fields=["day"], name="key_usage_day")]

    def __str__(self) -> str:
        return f"{self.key_id} {self.day}"

    @property
    def requests(self) -> int:
        return self.requests_completed + self.requests_failed

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens
