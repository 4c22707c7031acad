"""Per-key quotas and the per-key daily usage they are checked against.

Two quotas per API key (core.models.ApiKey; null = no limit):

- `max_intake_requests`: the most requests the key's batches may hold in the
  IntakePool at once (the sum of their `intake_reserved`). Binding at admission,
  under the `admission` ControlLock, so two admissions of one key cannot both pass
  on a sum the other has not yet added to. A batch refused there fails whole with
  `quota_exceeded`; nothing of it is admitted (OpenAI fails a batch over its
  enqueued-token limit the same way, `token_limit_exceeded`).
- `tokens_per_day`: input plus output tokens in the current UTC day, read from
  KeyUsage. It gates new batches (at create and at admission); a batch already
  admitted runs to its end, so a day's usage may pass the quota by what the running
  batches still use. The usage of a batch is not known before it runs.

At create, before validation, only what needs no line count is checked (File rows
do not record one, and create never reads the input): a key already at its intake
quota, or already at its day's tokens, is answered 429 `quota_exceeded` with a
`Retry-After`. The exact fit of a batch is known only after validation.

Accounting: `key_usage_add` is one upsert statement for all the key-days a progress
flush touches (batches.chunks), taken last in the lock order (KeyUsage rows, by key
and day); `batch_finalize` adds what the flushes missed, so the figures end equal to
the sum over the output lines' usage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import F, Sum

from batches.models import Batch
from batches.usage import USAGE_FIELDS, Usage
from core.errors import QuotaExceeded
from core.models import ApiKey, KeyUsage

QUOTA_EXCEEDED = QuotaExceeded.code


def utc_today(now: datetime | None = None) -> date:
    return (now or datetime.now(UTC)).astimezone(UTC).date()


def seconds_until_next_utc_day(now: datetime | None = None) -> int:
    now = (now or datetime.now(UTC)).astimezone(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    return max(1, int((midnight - now).total_seconds() + 0.999))


def key_intake_held(*, key_id: int) -> int:
    """Requests of this key's batches in the IntakePool now (batches.intake)."""
    held = (Batch.objects.filter(owner_id=key_id, intake_reserved__gt=0)
            .aggregate(total=Sum("intake_reserved"))["total"])
    return held or 0


def key_tokens_today(*, key_id: int) -> int:
    """Input plus output tokens the key used in the current UTC day."""
    row = (KeyUsage.objects.filter(key_id=key_id, day=utc_today())
           .values_list(F("input_tokens") + F("output_tokens"), flat=True).first())
    return row or 0


@dataclass(frozen=True)
class QuotaRefusal:
    message: str
    retry_after: int  # seconds

    def error(self) -> QuotaExceeded:
        return QuotaExceeded(self.message, retry_after=self.retry_after)

    def batch_error(self) -> dict:
        return {"code": QUOTA_EXCEEDED, "message": self.message}


def quota_refusal(*, key: ApiKey, requests: int | None = None) -> QuotaRefusal | None:
    """Why the key may not have a batch of `requests` more requests admitted now, or
    None. With `requests` None (at create, before the line count is known), whether
    the key has any room at all."""
    if key.tokens_per_day is not None:
        used = key_tokens_today(key_id=key.pk)
        if used >= key.tokens_per_day:
            wait = seconds_until_next_utc_day()
            return QuotaRefusal(
                f"API key {key.name!r} used {used} of its {key.tokens_per_day} tokens for "
                f"today (UTC); new batches are accepted again in {wait} s, at 00:00 UTC.",
                retry_after=wait)
    limit = key.max_intake_requests
    if limit is not None:
        held = key_intake_held(key_id=key.pk)
        wanted = 1 if requests is None else requests
        if requests is not None and requests > limit:
            return QuotaRefusal(
                f"The batch's {requests} requests exceed API key {key.name!r}'s intake "
                f"quota of {limit} requests at once; split the input into smaller batches.",
                retry_after=settings.BATCHGEN_RETRY_AFTER_SECONDS)
        if held + wanted > limit:
            what = ("has no room left" if requests is None
                    else f"has room for {max(limit - held, 0)}, not {requests}")
            return QuotaRefusal(
                f"API key {key.name!r} holds {held} requests in the intake pool; its quota "
                f"of {limit} {what}. Retry once its batches progress.",
                retry_after=settings.BATCHGEN_RETRY_AFTER_SECONDS)
    return None


def quota_check_create(*, owner: ApiKey | None) -> None:
    """At create: refuse (429 quota_exceeded) a key that has no room at all."""
    if owner is None:
        return
    refusal = quota_refusal(key=owner)
    if refusal is not None:
        raise refusal.error()


def quota_check_admission(*, owner_id: int | None, requests: int) -> QuotaRefusal | None:
    """At admission, under the `admission` ControlLock (the caller's transaction):
    whether this key's batch of `requests` requests must be refused. The key's
    quotas are read fresh, so an edit in the admin applies to the next admission."""
    if owner_id is None:
        return None
    key = ApiKey.objects.filter(id=owner_id).first()
    if key is None:
        return None
    return quota_refusal(key=key, requests=requests)


# --- accounting ----------------------------------------------------------------------


@dataclass
class KeyDayUsage:
    """What to add to one key's row for one day."""

    requests_completed: int = 0
    requests_failed: int = 0
    tokens: Usage = field(default_factory=Usage)

    def __bool__(self) -> bool:
        return bool(self.requests_completed or self.requests_failed or self.tokens)


_COUNTS = ("requests_completed", "requests_failed", *USAGE_FIELDS)


def key_usage_add(additions: dict[tuple[int, date], KeyDayUsage]) -> None:
    """Add to the KeyUsage rows of these (key id, day)s, creating them as needed, in
    one statement (INSERT ... ON CONFLICT DO UPDATE; PostgreSQL and SQLite both have
    it). Rows are written in (key, day) order, the lock order of KeyUsage rows, so
    two flushes touching the same keys never wait on each other in a cycle."""
    rows = [(key_id, day, add) for (key_id, day), add in sorted(additions.items()) if add]
    if not rows:
        return
    quote = connection.ops.quote_name
    table = quote(KeyUsage._meta.db_table)
    columns = [quote(KeyUsage._meta.get_field(name).column) for name in ("key", "day")]
    counts = [quote(name) for name in _COUNTS]
    placeholders = ", ".join(["(" + ", ".join(["%s"] * (2 + len(counts))) + ")"] * len(rows))
    params: list = []
    for key_id, day, add in rows:
        params += [key_id, connection.ops.adapt_datefield_value(day),
                   add.requests_completed, add.requests_failed,
                   *(getattr(add.tokens, name) for name in USAGE_FIELDS)]
    updates = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in counts)
    sql = (f"INSERT INTO {table} ({', '.join(columns + counts)}) VALUES {placeholders} "
           f"ON CONFLICT ({', '.join(columns)}) DO UPDATE SET {updates}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def key_usage_correct(*, owner_id: int | None, running: Usage, final: Usage) -> None:
    """At finalization: add to the key's row for today what the flushes did not count
    (results a dead worker wrote but never flushed), so the key's tokens end equal
    to the sum over its output lines. Runs under the batch's row lock, before the
    batch's figures are replaced by the final ones."""
    if owner_id is None:
        return
    missed = Usage(**{name: getattr(final, name) - getattr(running, name)
                      for name in USAGE_FIELDS})
    key_usage_add({(owner_id, utc_today()): KeyDayUsage(tokens=missed)})
