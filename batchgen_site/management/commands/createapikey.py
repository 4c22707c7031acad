"""`manage.py createapikey NAME`: create an API key and print it once. From then on
every /v1/ endpoint needs a key, and each key sees only its own files and batches.
`--revoke PREFIX` revokes a key; `--list` shows them (never the keys themselves)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from batchgen_site.auth import apikey_create, apikey_revoke
from batchgen_site.models import ApiKey


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="who or what the key is for")
        parser.add_argument("--revoke", metavar="PREFIX", help="revoke the key with this prefix")
        parser.add_argument("--list", action="store_true", help="list keys (prefix, name, state)")

    def handle(self, *args, name=None, revoke=None, list=False, **options):
        if list:
            for key in ApiKey.objects.order_by("created_at"):
                state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"
                self.stdout.write(f"{key.prefix}  {key.name}  {state}")
            return
        if revoke:
            if not apikey_revoke(prefix=revoke):
                raise CommandError(f"no active key with prefix {revoke!r}")
            self.stdout.write(f"revoked {revoke}")
            return
        if not name:
            raise CommandError("give the key a name: manage.py createapikey NAME")
        key, raw = apikey_create(name=name)
        self.stderr.write(f"API key {key.prefix}… for {name!r} created; it is shown only now:")
        self.stdout.write(raw)
