from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The batch machinery announces terminal transitions by a signal (it never
        # imports this app); the receiver writes the outbox in that transaction.
        from batches.signals import batch_finished
        from webhooks.receivers import record_batch_event

        batch_finished.connect(record_batch_event, dispatch_uid="webhooks.batch_finished")
