from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from batches import dispatch
        from inference import signals  # noqa: F401 - connects the worker hooks
        from inference.selectors import dispatch_window

        # The dispatcher asks the SchedulingPool how many chunks its workers can hold.
        dispatch.window_source = dispatch_window
