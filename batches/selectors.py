from __future__ import annotations

from datetime import date

from django.db.models import QuerySet, Sum

from batches.models import ACTIVE_STATUSES, Batch, LineError
from core.models import KeyUsage
from core.pagination import newest_first


def batch_list(*, after: str | None, owner=None) -> QuerySet[Batch]:
    # Batches are never deleted, so a cursor an earlier page gave stays valid.
    return newest_first(Batch.objects.all(), after=after, owner=owner, kind="batch")


def batch_line_errors(*, batch: Batch, limit: int, after: int | None = None) -> dict:
    """One page of a batch's bad input lines, by line number: every one validation
    kept, where the batch object shows only the first few."""
    errors = LineError.objects.filter(batch_id=batch.id).order_by("line")
    if after is not None:
        errors = errors.filter(line__gt=after)
    rows = list(errors.values("code", "message", "line", "param")[:limit + 1])
    return {"object": "list", "data": rows[:limit], "has_more": len(rows) > limit,
            "total": batch.line_errors_total}


def file_in_active_use(*, file_id: str) -> bool:
    return Batch.objects.filter(status__in=ACTIVE_STATUSES, input_file_id=file_id).exists() or \
        Batch.objects.filter(status__in=ACTIVE_STATUSES, output_file_id=file_id).exists()


def key_usage_report(*, since: date, until: date | None = None,
                     key_name: str | None = None) -> list[dict]:
    """Per UTC day and API key name (keys sharing a name are summed), from `since` to
    `until` inclusive: requests completed and failed, and tokens. Ordered by day,
    then name."""
    rows = KeyUsage.objects.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    if key_name is not None:
        rows = rows.filter(key__name=key_name)
    figures = ("requests_completed", "requests_failed", "input_tokens", "cached_tokens",
               "output_tokens")
    report = []
    for row in (rows.order_by().values("day", "key__name")
                .annotate(**{f"sum_{f}": Sum(f) for f in figures})
                .order_by("day", "key__name")):
        entry = {"day": row["day"].isoformat(), "key": row["key__name"]}
        entry.update({f: row[f"sum_{f}"] or 0 for f in figures})
        entry["requests"] = entry["requests_completed"] + entry["requests_failed"]
        entry["total_tokens"] = entry["input_tokens"] + entry["output_tokens"]
        report.append(entry)
    return report
