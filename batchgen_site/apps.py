from django.apps import AppConfig


class BatchgenSiteConfig(AppConfig):
    name = "batchgen_site"
    verbose_name = "BatchGen"
