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


# Celery's loggers of its INFO lines about a task: beat sending it, a worker receiving
# it, the task succeeding.
_TASK_LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})


def _task_named(args) -> str | None:
    """The task a Celery line is about: the worker's and the tracer's lines format a
    dict with its name; beat's, the tuple (entry name, task name)."""
    if isinstance(args, dict):
        return args.get("name")
    if isinstance(args, tuple) and len(args) == 2:
        return args[1]
    return None


class RoutineTicksAtDebug(logging.Filter):
    """The control worker's beat sends `tasks` every few seconds whether or not there
    is anything to do (the dispatch tick every second): Celery would log three INFO
    lines for each (sent, received, succeeded), some 260,000 a day, which bury what
    an operator reads the log for and cost the worker CPU beside a CPU engine. Those
    lines are DEBUG: shown with BATCHGEN_LOG_LEVEL=DEBUG, dropped otherwise. A tick
    that fails is still logged at ERROR, and every other task as before."""

    def __init__(self, tasks: list[str] | tuple[str, ...] = (), show: bool = False) -> None:
        super().__init__()
        self.tasks, self.show = frozenset(tasks), show

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno != logging.INFO or record.name not in _TASK_LOGGERS
                or _task_named(record.args) not in self.tasks):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        # `show` comes from BATCHGEN_LOG_LEVEL (settings): no logger's level tells it
        # in a worker, where Celery sets its loggers' and the root's to --loglevel.
        return self.show
