from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from batches.selectors import file_in_active_use
        from files import services

        # Deleting a file asks whether an active batch uses it.
        services.in_active_use = file_in_active_use
