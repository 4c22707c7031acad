"""Logging filters of the LOGGING setting."""

from __future__ import annotations

import logging


class ClientFaultsAsWarnings(logging.Filter):
    """Django logs a request it finds suspicious (a `/static/..` path traversal, a
    forged Host, too many form fields) on `django.security.*` at ERROR, with the
    traceback of the refusal. Any client can send such a request, as often as it
    likes, so an ERROR would page someone at an attacker's will and its traceback
    says nothing about the server: it is logged as one WARNING line instead. The
    client still gets its 400.


    A 503 is BatchGen's own answer, never a crash: /health saying why it is not
    healthy (starting, no worker), `database_busy`, `server_busy`. Django logs every
    5xx at ERROR; those are logged as warnings, so an ERROR line always means a bug
    or a failure someone must look at (the fleet tests hold every log to that)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.name == "django.request" and getattr(record, "status_code", None) == 503
                and record.levelno > logging.WARNING):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        if record.name.startswith("django.security.") and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True
