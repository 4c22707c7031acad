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


class HandedBackWithoutTraceback(logging.Filter):
    """A task that hands its message back to the broker unrun (raises Celery's
    Reject with requeue: an inference worker stopping, paused by a full disk, or no
    longer holding the message's model after a swap) did nothing wrong, and another
    worker takes the message. Celery logs it as a WARNING with the Reject's
    traceback, which says nothing and reads as a crash in the log (the fleet tests
    hold every log to having none): it stays one WARNING line, without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "celery.app.trace" or not record.exc_info:
            return True  # every other record, the web process's included: no import
        from celery.exceptions import Reject

        if isinstance(record.exc_info[1], Reject):
            record.exc_info, record.exc_text = None, None
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


def _is_broker_fault(record: logging.LogRecord) -> bool:
    """Whether a Celery line says the broker cannot be reached (lost, refused, a
    publish or an ack that failed with the connection), not that something broke."""
    message = record.getMessage()
    if record.name == "batchgen.broker":  # core.publishing holding messages
        return True
    if record.name == "celery.worker.consumer.consumer":
        return message.startswith(("consumer: Cannot connect to",
                                   "consumer: Connection to broker lost"))
    if record.name == "celery.beat":
        return message.startswith(("beat: Connection error", "Message Error")) and (
            record.exc_info is None or _connection_error(record.exc_info[1]))
    if record.name == "celery.worker.loops":  # closing the dropped connection's loop
        return message.startswith("Error cleaning up after") and _connection_error(
            record.exc_info[1] if record.exc_info else None)
    return False


def _is_broker_aftermath(record: logging.LogRecord) -> bool:
    """Celery lines that follow a lost connection and need no one's attention.
    Acking a finished task on the connection the broker dropped fails: RabbitMQ
    delivers the message again, and the task's claim (a conditional update) makes
    the copy a no-op. And each lost connection warns that Celery 6 will cancel the
    late-acked tasks then: BatchGen keeps them running, for the same reason."""
    if record.name == "py.warnings":
        return "worker_cancel_long_running_tasks_on_connection_loss" in record.getMessage()
    return str(record.msg).startswith("Couldn't ack") and _connection_error(
        record.exc_info[1] if record.exc_info else None)


def _connection_error(exc: BaseException | None) -> bool:
    from amqp.exceptions import RecoverableConnectionError
    from kombu.exceptions import OperationalError

    while exc is not None:
        if isinstance(exc, OperationalError | RecoverableConnectionError | OSError | EOFError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class BrokerOutageOnce(logging.Filter):
    """A broker outage is one WARNING per process, not an ERROR a second: Celery
    logs each reconnection attempt of a worker and each tick beat could not send at
    ERROR (with a traceback), and RabbitMQ's return as "Connected to" at INFO;
    core.publishing says when it starts holding messages and when the
    broker took them. The
    first broker fault of an outage is kept as a WARNING without its traceback; the
    rest are DEBUG until Celery says it is connected again; what follows from the lost
    connection and needs no one is INFO or dropped. Nothing is lost meanwhile:
    beat's ticks run again, unacked messages are delivered again, and what BatchGen
    publishes is held until the broker takes it (core.publishing)."""

    def __init__(self, show: bool = False) -> None:
        super().__init__()
        self.show = show
        self.down = False

    def filter(self, record: logging.LogRecord) -> bool:
        if ((record.name == "celery.worker.consumer.connection"
             and str(record.msg).startswith("Connected to"))
                or (record.name == "batchgen.broker" and record.levelno == logging.INFO)):
            self.down = False  # the broker answers again
            return True
        if record.levelno < logging.WARNING:
            return True
        if _is_broker_aftermath(record):
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
            return record.name != "py.warnings"
        if not _is_broker_fault(record):
            return True
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        if not self.down:
            self.down = True
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            if record.name == "celery.beat":  # its format carries a stack dump
                record.msg, record.args = "beat: cannot send to the broker: %s", (
                    record.args[0] if record.args else "",)
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.show


class DependencyOutageOnce(logging.Filter):
    """Django logs a robust `on_commit` callback that raised at ERROR, with its
    traceback. When what it raised is a dependency's outage (the database or the
    broker unreachable: core.outage), the record is dropped and the outage
    said once instead; recovery and the ticks cover what the callback did not do.
    Any other error is logged as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        from core.outage import dependency_down, outage_began

        dependency = dependency_down(error)
        if dependency is None:
            return True
        outage_began(dependency, error)
        return False
