"""`manage.py pool_status`: the IntakePool and SchedulingPool figures, the same as
GET /v1/pool/status answers (batches.selectors.pool_status)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from batches.selectors import pool_status
from batches.serializers import PoolStatusSerializer


class Command(BaseCommand):
    help = ("Print the intake and scheduling pool figures of GET /v1/pool/status: requests "
            "waiting, slots busy and free across live workers, active batches.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true",
                            help="print the exact JSON object the API answers")

    def handle(self, *args, **options):
        figures = PoolStatusSerializer(pool_status()).data
        if options["json"]:
            self.stdout.write(json.dumps(figures))
            return
        width = max(map(len, figures))
        for key, value in figures.items():
            self.stdout.write(f"{key:<{width}}  {json.dumps(value)}")
