from django.apps import AppConfig


class FleetConfig(AppConfig):
    """The fleet's records: the inference workers' heartbeats, which model each
    multiplexing worker is to hold, and the swaps. Below `batches`, so the batch
    machinery reads them plainly; written by the workers and the control plane alike."""

    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"
