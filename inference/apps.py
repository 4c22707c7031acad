from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from batches import availability, dispatch, recovery
        from inference import signals  # noqa: F401 - connects the worker hooks
        from inference.selectors import (
            chunks_held_by_live_workers,
            dispatch_window,
            models_not_resident,
            models_without_ready_worker,
        )

        # The dispatcher asks the SchedulingPool how many chunks each model's workers
        # can hold.
        dispatch.window_source = dispatch_window
        # Recovery asks which chunks the live workers hold (prefetched ones too).
        recovery.held_source = chunks_held_by_live_workers
        # The model watch asks which served models have no ready worker.
        availability.unavailable_source = models_without_ready_worker
        # ... and, where workers multiplex, which models none of them holds now.
        availability.not_resident_source = models_not_resident
