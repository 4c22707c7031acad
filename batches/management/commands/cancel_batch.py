"""`manage.py cancel_batch ID`: cancel a batch through the API's own service
(batches.services.batch_cancel)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from batches.models import BatchStatus
from batches.services import batch_cancel, batch_get
from core.errors import BatchGenError, NotFound


class Command(BaseCommand):
    help = ("Cancel a validating or in-progress batch, as POST /v1/batches/{id}/cancel does: "
            "queued chunks are skipped at once, running ones stop, the results written so "
            "far become its output. Running it again on a cancelled batch changes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("batch_id", help="the batch's id (batch_...)")

    def handle(self, *args, **options):
        batch_id = options["batch_id"]
        try:
            batch = batch_cancel(batch_id=batch_id)
        except NotFound:
            raise CommandError(f"No such batch: {batch_id}") from None
        except BatchGenError as exc:
            if batch_get(batch_id=batch_id).status == BatchStatus.CANCELLED:
                self.stdout.write(f"{batch_id} is already cancelled")
                return
            raise CommandError(exc.message) from None
        self.stdout.write(f"{batch.id} is {batch.status}")
