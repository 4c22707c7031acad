"""What the files app asks the rest of the server, without importing it.

`file_in_use_asked` is sent when a file is about to be deleted (files.services.
file_delete, under the file's row lock): a receiver returns True when something it
owns reads or writes the file now (the batches app: an active batch's input or
output). Any True refuses the deletion. A plain Django signal, so the app that knows
connects its receiver and this package names no one above it."""

from __future__ import annotations

from django.dispatch import Signal

file_in_use_asked = Signal()  # kwargs: file_id: str; a receiver returns a bool


def file_in_use(*, file_id: str) -> bool:
    """Whether any receiver says the file is in use (no receiver: it is not)."""
    return any(answer for _, answer in file_in_use_asked.send(sender=None, file_id=file_id))
