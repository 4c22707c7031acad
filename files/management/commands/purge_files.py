"""`manage.py purge_files`: delete expired files, or all files older than a given age,
that no active batch uses (files.services.files_purge)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from files.services import files_purge

UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_duration(text: str) -> timedelta:
    """'7d', '12h', '30m', '45s', '2w' as a timedelta."""
    match = DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration such as 7d, 12h, 30m, 45s or 2w")
    amount, unit = match.groups()
    return timedelta(**{UNITS[unit.lower()]: float(amount)})


class Command(BaseCommand):
    help = ("Delete files (their rows and bytes) past their expiry date, or with "
            "--older-than every file created longer ago than that; files an active batch "
            "reads or writes are kept. Also removes partial uploads a crash left behind.")

    def add_arguments(self, parser):
        parser.add_argument("--older-than", metavar="DURATION",
                            help="age such as 7d, 12h, 30m, 45s or 2w (default: files past "
                                 "their expires_at)")

    def handle(self, *args, **options):
        older_than = None
        if options["older_than"] is not None:
            try:
                older_than = parse_duration(options["older_than"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        deleted = files_purge(older_than=older_than)
        self.stdout.write(f"{deleted} file(s) deleted")
