from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    # The admin's heading over API keys and their usage, as before the move.
    verbose_name = "BatchGen"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from core.outage import database_connected

        # A database outage ends, for this process, when a connection opens again.
        connection_created.connect(database_connected, dispatch_uid="batchgen_outage")
