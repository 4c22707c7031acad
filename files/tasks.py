from __future__ import annotations

from celery import shared_task

from batchgen_site.celery import QueueName
from files import services


@shared_task(name="files.purge_expired_files", queue=QueueName.CONTROL.value, time_limit=3600)
def purge_expired_files() -> int:
    return services.files_purge()
