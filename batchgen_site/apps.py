from django.apps import AppConfig


class BatchgenSiteConfig(AppConfig):
    name = "batchgen_site"
    verbose_name = "BatchGen"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from batchgen_site.outage import database_connected

        # A database outage ends, for this process, when a connection opens again.
        connection_created.connect(database_connected, dispatch_uid="batchgen_outage")
