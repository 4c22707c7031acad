"""The control plane's lock order, and the helpers that keep to it.

Every transaction that locks more than one row takes its locks in this order, so no
two transactions can wait on each other in a cycle (PostgreSQL would abort one with
"deadlock detected"; SQLite serialises writers and would hide the bug):

1. a `ControlLock` row (`admission`, `dispatch` or `residency`; never two in one
   transaction; the residency scheduler then writes only inference's Residency and
   ModelSwap rows);
2. `File` rows;
3. `Worker` rows;
4. `Chunk` rows, in ascending id;
5. `Batch` rows, in ascending id;
6. `KeyUsage` rows, in ascending (key, day) (batches.quotas.key_usage_add).
7. `WebhookEndpoint` rows, then 8. `WebhookDelivery` rows (the webhooks app: a
   terminal transition inserts deliveries; claims take only delivery rows).

A statement that updates several rows locks them in whatever order its plan visits
them, so a multi-row change first locks its rows with `lock_ids` (SELECT ... ORDER BY
id FOR UPDATE) and then updates. Single-row statements need no care beyond the order
of the tables. The rationale and the measurements are in docs/architecture.md.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from batches.models import ControlLock


def lock_control(name: str, *, wait: bool = True) -> bool:
    """Take a ControlLock for the rest of the transaction. With wait=False, return
    False at once if another transaction holds it (SKIP LOCKED)."""
    assert transaction.get_connection().in_atomic_block
    rows = ControlLock.objects.select_for_update(skip_locked=not wait).filter(name=name)
    if list(rows.values_list("name", flat=True)):
        return True
    # Missing (a flushed test database): create it; the new row is ours until commit.
    _, created = ControlLock.objects.get_or_create(name=name)
    return created or bool(list(rows.values_list("name", flat=True)))


def lock_ids(queryset: QuerySet) -> list:
    """Lock the rows of `queryset` in ascending primary key; returns their keys."""
    assert transaction.get_connection().in_atomic_block
    return list(queryset.select_for_update().order_by("pk").values_list("pk", flat=True))
