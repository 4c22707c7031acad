"""Celery worker hooks: a worker that consumes the `inference` queue owns an engine.

It always runs the threads pool, sized so that its chunks in hand can fill every
slot: a chunk's thread waits for slots, so threads are cheap placeholders."""

from __future__ import annotations

import logging

from celery import signals
from django.conf import settings

from core.celery import QueueName, inference_queue, is_inference_queue

logger = logging.getLogger("batchgen.inference")



def inference_concurrency() -> int:
    """This worker's chunk threads, by the rule the dispatcher and the ETA count
    them by (fleet.selectors.chunk_threads)."""
    from fleet.selectors import chunk_threads

    return chunk_threads(settings.BATCHGEN_MAX_POOL_SIZE)


def consumes_inference(app) -> bool:
    """Whether this worker consumes an inference queue (a model's, or the old one)."""
    return any(is_inference_queue(name) for name in app.amqp.queues.consume_from)


@signals.worker_init.connect
def on_worker_init(sender, **kwargs):
    if not consumes_inference(sender.app):
        return
    if QueueName.CONTROL.value in sender.app.amqp.queues.consume_from:
        raise RuntimeError("a worker consumes either 'inference' or 'control', not both")
    _consume_own_model_queue(sender.app)
    from inference.runtime import want_runtime

    want_runtime()
    sender.pool_cls = "threads"
    sender.concurrency = inference_concurrency()
    logger.info("inference worker: threads pool, %s chunk threads", sender.concurrency)


def _consume_own_model_queue(app) -> None:
    """`-Q inference` (as docker-compose and GPU hosts start a worker) means the
    queue of the model this worker holds: chunks are published per model
    (batches/dispatch.py), so the bare queue would never get any."""
    queues = app.amqp.queues
    if QueueName.INFERENCE.value not in queues.consume_from or settings.BATCHGEN_MULTIPLEX:
        return  # a multiplexing worker consumes its model's queue once it holds one
    from serving.model_info import served_model

    model = settings.BATCHGEN_WORKER_MODEL or served_model().id
    # queues[name] declares it as the publisher does (exchange and routing key of its name).
    queues.select_add(queues[inference_queue(model)])
    queues.deselect(QueueName.INFERENCE.value)
    logger.info("inference worker: model %s, queue %s", model, inference_queue(model))


class QueueSwitch:
    """Stops this worker consuming its inference queue while its runtime cannot write
    results (storage full), and consumes it again after: what it has not started goes
    to a worker with room, or waits in the broker, instead of being run into memory.
    A multiplexing worker's queue also changes with the model it holds: none while it
    swaps, then the new model's (inference/swap.py).

    Celery's own cancel_consumer/add_consumer remote-control commands do this through a
    broadcast; here the runtime's thread asks the worker's consumer directly, with
    `call_soon` (thread-safe, it wakes the consumer's loop). The change reads the
    runtime's state when it runs, so a pause and a resume asked for in quick
    succession end as the state is then, whatever order they run in."""

    def __init__(self, consumer, runtime) -> None:
        self.consumer = consumer
        self.runtime = runtime
        self.own = [name for name in consumer.app.amqp.queues.consume_from
                    if is_inference_queue(name)]
        self.queues = list(self.own)  # every inference queue it consumed at some time

    def changed(self) -> None:
        self.consumer.call_soon(self._apply)

    def wanted(self) -> list[str]:
        runtime = self.runtime
        if runtime.storage_error:
            return []
        if not runtime.multiplex:
            return self.own
        model = runtime.config.served_model_name
        if runtime.swapping.is_set() or runtime.engine is None or not model:
            return self.own
        return [*self.own, inference_queue(model)]

    def _apply(self) -> None:
        # Between broker connections there is no task consumer: the next one consumes
        # what the app's queues select, so that is what changes then.
        queues, tasks = self.consumer.app.amqp.queues, self.consumer.task_consumer
        wanted = self.wanted()
        self.queues += [name for name in wanted if name not in self.queues]
        for name in self.queues:
            consuming = tasks is not None and tasks.consuming_from(name)
            if name not in wanted and consuming:
                self.consumer.cancel_task_queue(name)
            elif name in wanted and tasks is not None and not consuming:
                self.consumer.add_task_queue(name)
            elif name not in wanted:
                queues.deselect(name)
            else:
                queues.select_add(queues[name])


@signals.worker_ready.connect
def on_worker_ready(sender, **kwargs):
    if consumes_inference(sender.app):
        from inference.runtime import get_runtime

        runtime = get_runtime()  # start loading the engine now, not on the first chunk
        runtime.queue_switch = QueueSwitch(sender, runtime)
        runtime.start_swapper()


@signals.worker_shutting_down.connect
def on_worker_shutting_down(**kwargs):
    # Sent as a warm shutdown begins, before Celery waits for the running tasks:
    # the chunks in hand are handed back now instead of being run to their end.
    from inference.runtime import drain_runtime

    drain_runtime()


@signals.worker_shutdown.connect
def on_worker_shutdown(sender, **kwargs):
    from inference.runtime import runtime_exit_code, stop_runtime

    stop_runtime()
    code = runtime_exit_code()
    if code is not None:
        # Sent by WorkController.stop() after it set its exit code, which `celery
        # worker` exits with: an engine that can never start must not look like a
        # clean stop (0) that a supervisor restarts.
        sender.exitcode = code
