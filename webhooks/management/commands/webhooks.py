"""`manage.py webhooks add|list|remove|test|rotate|deliveries|resend`: webhook
endpoints from the shell. `add URL` makes a server-wide endpoint (every batch's
events) unless `--key PREFIX` names the API key whose batches it hears; the signing
secret is printed once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.errors import BatchGenError
from core.models import ApiKey
from webhooks import services
from webhooks.models import EVENT_TYPES, WebhookDelivery, WebhookEndpoint


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True)
        add = commands.add_parser("add", help="register an endpoint; prints its secret once")
        add.add_argument("url")
        add.add_argument("--name", default="")
        add.add_argument("--events", default=",".join(EVENT_TYPES),
                         help=f"comma-separated, of {', '.join(EVENT_TYPES)} (default: all)")
        add.add_argument("--key", metavar="PREFIX",
                         help="the API key (its prefix) whose batches it hears; "
                              "default: server-wide")
        commands.add_parser("list", help="the endpoints (never their secrets)")
        for name, text in (("remove", "delete an endpoint and its delivery log"),
                           ("rotate", "a new secret, printed once")):
            sub = commands.add_parser(name, help=text)
            sub.add_argument("endpoint_id")
        rotate = commands.choices["rotate"]
        rotate.add_argument("--keep-old", action="store_true",
                            help="the old secret keeps signing beside the new one for 24 h")
        test = commands.add_parser("test", help="send a sample event now, print the answer")
        test.add_argument("endpoint_id")
        test.add_argument("--event", default=EVENT_TYPES[0], choices=EVENT_TYPES)
        deliveries = commands.add_parser("deliveries", help="the latest deliveries")
        deliveries.add_argument("--status", choices=["pending", "delivered", "failed"])
        deliveries.add_argument("--limit", type=int, default=20)
        resend = commands.add_parser("resend", help="send deliveries again now")
        resend.add_argument("delivery_ids", nargs="+", metavar="msg_...")

    def handle(self, *args, action: str, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except BatchGenError as exc:
            raise CommandError(exc.message) from None

    def _add(self, *, url, name, events, key, **_):
        owner = None
        if key:
            owner = ApiKey.objects.filter(prefix=key).first()
            if owner is None:
                raise CommandError(f"no API key with prefix {key!r}")
        endpoint = services.endpoint_create(
            url=url, name=name, owner=owner,
            event_types=[e.strip() for e in events.split(",") if e.strip()])
        self.stderr.write(f"endpoint {endpoint.id} -> {url} "
                          f"({'key ' + key if key else 'server-wide'}); its signing secret, "
                          "shown only now:")
        self.stdout.write(endpoint.secret)

    def _list(self, **_):
        for endpoint in WebhookEndpoint.objects.select_related("owner").order_by("id"):
            owner = endpoint.owner.prefix if endpoint.owner else "server-wide"
            state = "enabled" if endpoint.enabled else f"disabled {endpoint.disabled_reason}"
            self.stdout.write(f"{endpoint.id}  {endpoint.url}  {owner}  "
                              f"{','.join(endpoint.event_types)}  {state}  {endpoint.name}")

    def _remove(self, *, endpoint_id, **_):
        services.endpoint_delete(endpoint_id=endpoint_id)
        self.stdout.write(f"removed {endpoint_id}")

    def _rotate(self, *, endpoint_id, keep_old, **_):
        endpoint = services.endpoint_rotate_secret(endpoint_id=endpoint_id,
                                                   keep_old_secret=keep_old)
        self.stderr.write(f"new signing secret of {endpoint_id}, shown only now:")
        self.stdout.write(endpoint.secret)

    def _test(self, *, endpoint_id, event, **_):
        outcome = services.endpoint_test(endpoint_id=endpoint_id, event_type=event)
        if not outcome.delivered:
            raise CommandError(f"{event} to {endpoint_id}: {outcome.error}")
        self.stdout.write(f"{event} to {endpoint_id}: HTTP {outcome.status_code}")

    def _deliveries(self, *, status, limit, **_):
        rows = WebhookDelivery.objects.order_by("-created_at")
        if status:
            rows = rows.filter(status=status)
        for d in rows[:limit]:
            self.stdout.write(f"{d.id}  {d.event_type}  {d.batch_id}  {d.endpoint_id}  "
                              f"{d.status}  attempts={d.attempts}  "
                              f"last={d.last_status_code or d.last_error[:60] or '-'}")

    def _resend(self, *, delivery_ids, **_):
        count = services.deliveries_resend(delivery_ids=delivery_ids)
        self.stdout.write(f"{count} deliveries will be sent again now")
