from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Deleting a file asks whether an active batch uses it (files.signals).
        from batches import receivers  # noqa: F401 - connects them
