from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from inference import signals  # noqa: F401 - connects the worker hooks
