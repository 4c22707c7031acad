from __future__ import annotations

from celery import shared_task

from files import services


@shared_task(name="files.purge_expired_files", time_limit=3600)
def purge_expired_files() -> int:
    return services.files_purge()
