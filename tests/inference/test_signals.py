"""An inference worker started with the bare `-Q inference` consumes its model's queue."""

from __future__ import annotations

from types import SimpleNamespace

from core.celery import app
from inference.signals import _consume_own_model_queue, consumes_inference


def test_a_worker_on_the_bare_inference_queue_consumes_its_models_queue(settings):
    settings.BATCHGEN_WORKER_MODEL = "m"
    queues = app.amqp.Queues(app.conf.task_queues)
    queues.select(["inference"])
    worker_app = SimpleNamespace(amqp=SimpleNamespace(queues=queues))

    _consume_own_model_queue(worker_app)

    assert set(queues.consume_from) == {"inference.m"}
    # Declared as the dispatcher publishes to it: an exchange and routing key of its name
    queue = queues.consume_from["inference.m"]
    assert (queue.exchange.name, queue.routing_key) == ("inference.m", "inference.m")
    assert consumes_inference(worker_app)
