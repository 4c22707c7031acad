"""The batch machinery's answers to what lower apps ask by signal, connected in
BatchesConfig.ready."""

from __future__ import annotations

from django.dispatch import receiver

from batches.selectors import file_in_active_use
from files.signals import file_in_use_asked


@receiver(file_in_use_asked, dispatch_uid="batches.file_in_active_use")
def active_batch_uses_file(sender, *, file_id: str, **kwargs) -> bool:
    """A file an active batch reads (its input) or writes (its output) is not deleted."""
    return file_in_active_use(file_id=file_id)
