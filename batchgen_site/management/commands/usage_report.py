"""`manage.py usage_report --since YYYY-MM-DD [--until YYYY-MM-DD] [--key NAME]
[--format table|csv|json]`: what each API key used per UTC day (requests completed
and failed, input, cached and output tokens), from the KeyUsage table the workers'
progress flushes keep. Keys are named by their name, never their secret.

    manage.py usage_report --since 2026-12-01 --until 2026-12-31 --key team-a --format csv
"""

from __future__ import annotations

import csv
import json
from datetime import date

from django.core.management.base import BaseCommand, CommandError

from batches.selectors import key_usage_report

COLUMNS = ("day", "key", "requests", "requests_completed", "requests_failed",
           "input_tokens", "cached_tokens", "output_tokens", "total_tokens")
TOTALLED = COLUMNS[2:]


def day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not a date (YYYY-MM-DD): {value!r}") from None


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--since", type=day, required=True, metavar="YYYY-MM-DD",
                            help="first UTC day of the report")
        parser.add_argument("--until", type=day, metavar="YYYY-MM-DD",
                            help="last UTC day of the report, included (default: today)")
        parser.add_argument("--key", metavar="NAME", help="only the key(s) with this name")
        parser.add_argument("--format", choices=["table", "csv", "json"], default="table")

    def handle(self, *args, since: date, until: date | None = None, key: str | None = None,
               format: str = "table", **options):
        if until is not None and until < since:
            raise CommandError(f"--until {until} is before --since {since}")
        rows = key_usage_report(since=since, until=until, key_name=key)
        if format == "json":
            self.stdout.write(json.dumps(rows, indent=2))
        elif format == "csv":
            writer = csv.DictWriter(self.stdout, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        else:
            self._table(rows)

    def _table(self, rows: list[dict]) -> None:
        total = {"day": "total", "key": "", **{c: sum(r[c] for r in rows) for c in TOTALLED}}
        lines = [list(COLUMNS)] + [[str(r[c]) for c in COLUMNS] for r in [*rows, total]]
        widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
        for n, line in enumerate(lines):
            if n == len(lines) - 1:
                self.stdout.write("  ".join("-" * w for w in widths))
            self.stdout.write("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                                        for i, (cell, w) in enumerate(zip(line, widths,
                                                                          strict=True))))
