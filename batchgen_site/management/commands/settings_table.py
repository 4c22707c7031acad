"""`manage.py settings_table`: the rows of the README's settings table, one per
setting of the table in core/config.py (flag, variable, default, help).
tests/site/test_settings_table.py fails while the README disagrees with the table;
paste a new setting's row from here."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from core.config import readme_rows


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args, **options):
        self.stdout.write("| Flag | Variable | Default |\n|---|---|---|")
        for row in readme_rows():
            self.stdout.write(row)
