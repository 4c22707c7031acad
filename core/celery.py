"""The Celery app: the IntakePool is its `inference` queue, the control tasks run on
`control`. Settings come from Django's, prefixed CELERY_."""

from __future__ import annotations

import enum
import os

from celery import Celery
from celery.app.amqp import AMQP
from kombu import Connection, Exchange, Queue

from core.config import value

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchgen_site.settings")


class QueueName(enum.StrEnum):
    INFERENCE = "inference"  # chunks of requests, by reference: the IntakePool
    CONTROL = "control"  # validate, finalize, expire, recover, webhooks


def inference_queue(model_id: str) -> str:
    """The queue of one served model's chunks, `inference.<model id>`: only the
    workers that hold that model consume it (docs/models.md). Declared by the first
    worker or publisher that names it (Celery's task_create_missing_queues)."""
    return f"{QueueName.INFERENCE.value}.{model_id}"


def is_inference_queue(name: str) -> bool:
    return name == QueueName.INFERENCE.value or name.startswith(f"{QueueName.INFERENCE.value}.")


# After a broker outage every worker (and beat) reconnects within this long of its
# return: Celery's own schedule waits 2, 4, 6... up to 30 s between attempts, so a
# worker could sleep through the first 10 s of a broker that is back.
RECONNECT_SECONDS = 1.0


class QuickReconnect(Connection):
    def ensure_connection(self, errback=None, max_retries=None,
                          interval_start=RECONNECT_SECONDS, interval_step=0,
                          interval_max=RECONNECT_SECONDS, **kwargs):
        return super().ensure_connection(errback, max_retries, interval_start, interval_step,
                                         interval_max, **kwargs)


class BatchGenAMQP(AMQP):
    Connection = QuickReconnect


# Every task's base: an outage of the database or the broker skips a task quietly
# (said once per process), it does not log a traceback at every tick.
app = Celery("batchgen", amqp=BatchGenAMQP,
             task_cls="core.outage:OutageTolerantTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
# RabbitMQ confirms each publish (core.publishing): a message written into
# a connection the broker already dropped raises instead of vanishing. Redis's
# transport ignores the option (its LPUSH is answered anyway).
app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                     "confirm_publish": True}
app.conf.task_queues = [
    Queue(name.value, Exchange(name.value, type="direct"), routing_key=name.value)
    for name in QueueName
]
app.conf.task_default_queue = QueueName.CONTROL.value
app.conf.task_default_exchange = QueueName.CONTROL.value
app.conf.task_default_routing_key = QueueName.CONTROL.value
# Every task's queue, by name: inference.* runs on GPU workers, the rest on control.
# inference.run_chunk is published to its chunk's model queue (batches/dispatch.py).
app.conf.task_routes = {
    "inference.*": {"queue": QueueName.INFERENCE.value},
    "batches.*": {"queue": QueueName.CONTROL.value},
    "files.*": {"queue": QueueName.CONTROL.value},
    "webhooks.*": {"queue": QueueName.CONTROL.value},
    "residency.*": {"queue": QueueName.CONTROL.value},
}
WEBHOOK_SWEEP_SECONDS = value("BATCHGEN_WEBHOOK_SWEEP_SECONDS")
ESTIMATES_SECONDS = 5.0  # the ETAs' refresh tick (batches/estimates.py)
app.conf.beat_schedule = {
    # Chunks are dispatched as workers free up; this tick only covers lost events.
    "dispatch-chunks": {"task": "batches.dispatch_chunks", "schedule": 1.0},
    "expire-batches": {"task": "batches.expire_batches", "schedule": 60.0},
    "recover-chunks": {"task": "batches.recover_chunks", "schedule": 15.0},
    # Each running batch's ETA and at_risk, cached on its row (batches/estimates.py).
    "refresh-estimates": {"task": "batches.refresh_estimates", "schedule": ESTIMATES_SECONDS,
                          "options": {"expires": 2 * ESTIMATES_SECONDS}},
    # Running batches waiting for a model that no ready worker holds: said on the
    # batch, failed after BATCHGEN_MODEL_UNAVAILABLE_SECONDS (batches/availability.py).
    # Two reads a tick while every model runs.
    "watch-models": {"task": "batches.watch_models", "schedule": 10.0},
    # Model multiplexing: which model each multiplexing worker holds. One read a tick
    # while no worker multiplexes (batches/residency.py).
    "decide-residency": {"task": "residency.decide", "schedule": 1.0,
                         "options": {"expires": 5}},
    "purge-expired-files": {"task": "files.purge_expired_files", "schedule": 3600.0},
    # Webhook retries that are due (first attempts go out on commit). A tick not run
    # within its interval is dropped: the next one covers the same rows.
    "send-webhooks": {"task": "webhooks.sweep_deliveries", "schedule": WEBHOOK_SWEEP_SECONDS,
                      "options": {"expires": WEBHOOK_SWEEP_SECONDS}},
}
app.autodiscover_tasks(["batches", "files", "fleet", "inference", "webhooks"])
