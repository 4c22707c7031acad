"""`manage.py recover`: put right what a crash left half-way (batches.recovery), the
same pass the control worker runs every few seconds."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from batches.recovery import recover


class Command(BaseCommand):
    help = ("Requeue and republish chunks whose worker died (lease expired), restart lost "
            "validations, repair torn last lines of incremental files, and finalize batches "
            "whose chunks are all done. Safe to run at any time, as often as you like.")

    def handle(self, *args, **options):
        report = recover()
        self.stdout.write(f"recovery: {report}")
