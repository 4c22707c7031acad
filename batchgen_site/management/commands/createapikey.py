"""`manage.py createapikey NAME`: create an API key and print it once. From then on
every /v1/ endpoint needs a key, and each key sees only its own files and batches.
`--revoke PREFIX` revokes a key; `--list` shows them (never the keys themselves).

Quotas and fair-share weight (batches.quotas, batches.dispatch), at creation or later
with `--update PREFIX`:

    manage.py createapikey team-a --max-intake-requests 50000 --tokens-per-day 20000000 \\
        --weight 2
    manage.py createapikey --update bg-AbCdEfG --tokens-per-day none
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.auth import apikey_create, apikey_revoke, apikey_set_quotas
from core.models import ApiKey

QUOTA_OPTIONS = ("max_intake_requests", "tokens_per_day", "weight")
UNSET = object()  # an option not given (`none` is given: no limit)


def limit(value: str) -> int | None:
    """A quota: a non-negative integer, or `none` for no limit."""
    if value.lower() in ("none", "unlimited"):
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"not an integer or 'none': {value!r}") from None
    if number < 0:
        raise ValueError(f"must not be negative: {value!r}")
    return number


def show(value) -> str:
    return "-" if value is None else str(value)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="who or what the key is for")
        parser.add_argument("--revoke", metavar="PREFIX", help="revoke the key with this prefix")
        parser.add_argument("--update", metavar="PREFIX",
                            help="change the quotas or weight of the key with this prefix")
        parser.add_argument("--list", action="store_true",
                            help="list keys (prefix, name, state, quotas, weight)")
        parser.add_argument("--max-intake-requests", type=limit, default=UNSET, metavar="N|none",
                            help="most requests the key's batches may hold in the intake "
                                 "pool at once (default: no limit)")
        parser.add_argument("--tokens-per-day", type=limit, default=UNSET, metavar="N|none",
                            help="input plus output tokens per UTC day (default: no limit)")
        parser.add_argument("--weight", type=int, default=UNSET, metavar="N",
                            help="fair-share weight against other keys, 1 to 1000 (default 1)")

    def handle(self, *args, name=None, revoke=None, update=None, list=False, **options):
        quotas = {option: options[option] for option in QUOTA_OPTIONS
                  if options.get(option, UNSET) is not UNSET}
        if list:
            self.stdout.write("prefix  name  state  max_intake_requests  tokens_per_day  weight")
            for key in ApiKey.objects.order_by("created_at"):
                state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"
                self.stdout.write(f"{key.prefix}  {key.name}  {state}  "
                                  f"{show(key.max_intake_requests)}  "
                                  f"{show(key.tokens_per_day)}  {key.weight}")
            return
        if revoke:
            if not apikey_revoke(prefix=revoke):
                raise CommandError(f"no active key with prefix {revoke!r}")
            self.stdout.write(f"revoked {revoke}")
            return
        try:
            if update:
                if not quotas:
                    raise CommandError("--update needs --max-intake-requests, "
                                       "--tokens-per-day or --weight")
                key = apikey_set_quotas(prefix=update, **quotas)
                self.stdout.write(f"updated {key.prefix} ({key.name}): max_intake_requests="
                                  f"{show(key.max_intake_requests)} tokens_per_day="
                                  f"{show(key.tokens_per_day)} weight={key.weight}")
                return
            if not name:
                raise CommandError("give the key a name: manage.py createapikey NAME")
            key, raw = apikey_create(name=name, **quotas)
        except ApiKey.DoesNotExist:
            raise CommandError(f"no key with prefix {update!r}") from None
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(errors)}"
                                         for field, errors in exc.message_dict.items())) from None
        self.stderr.write(f"API key {key.prefix}… for {name!r} created; it is shown only now:")
        self.stdout.write(raw)
