"""`manage.py expire_batches`: fail the active batches whose completion window has
passed (batches.services.batches_expire), as the control worker does every minute."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from batches.services import batches_expire


class Command(BaseCommand):
    help = ("Fail every validating or in-progress batch whose completion window (24h) has "
            "passed, keeping the results written so far. Idempotent.")

    def handle(self, *args, **options):
        expired = batches_expire()
        self.stdout.write(f"{expired} batch(es) expired")
