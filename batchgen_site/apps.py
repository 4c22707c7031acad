from django.apps import AppConfig


class BatchgenSiteConfig(AppConfig):
    """The project shell: settings, URLs, the admin's key pages, the web server and
    `manage.py serve`. It holds no models (API keys are core's)."""

    name = "batchgen_site"
    verbose_name = "BatchGen"
