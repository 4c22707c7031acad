"""What the batch machinery tells the rest of the server, without importing it.

`batch_finished` is sent inside the transaction that moves a batch to a terminal
status (batches.services.batch_transition), after the row changed: a receiver that
writes rows (the webhooks outbox) commits or rolls back with the transition itself.
Receivers get `batch_id` and `status` and must not publish anything before commit
(transaction.on_commit)."""

from __future__ import annotations

from django.dispatch import Signal

batch_finished = Signal()  # kwargs: batch_id: str, status: str (a terminal status)
