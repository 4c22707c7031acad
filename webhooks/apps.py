from django.apps import AppConfig
from django.core import checks


def check_allowed_hosts(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A bad BATCHGEN_WEBHOOK_ALLOWED_HOSTS entry is said once, at start (`serve`
    runs the checks), naming the setting, not at the first webhook."""
    from django.conf import settings

    from webhooks.destinations import AllowList

    try:
        AllowList.parse(settings.BATCHGEN_WEBHOOK_ALLOWED_HOSTS)
    except ValueError as exc:
        return [checks.Error(str(exc), id="webhooks.E001")]
    return []


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The batch machinery announces terminal transitions by a signal (it never
        # imports this app); the receiver writes the outbox in that transaction.
        from batches.signals import batch_finished
        from webhooks.receivers import record_batch_event

        batch_finished.connect(record_batch_event, dispatch_uid="webhooks.batch_finished")
        checks.register(check_allowed_hosts)
