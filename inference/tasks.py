from __future__ import annotations

from celery import shared_task

from inference.runtime import get_runtime


# A chunk holds a few hundred requests; on a slow CPU engine that can take long,
# but never hours: the limit frees a wedged thread, and the lease requeues the chunk.
@shared_task(name="inference.run_chunk", acks_late=True, bind=True,
             reject_on_worker_lost=True, time_limit=4 * 3600)
def run_chunk(self, batch_id: str, chunk_id: int) -> str:
    runtime = get_runtime()
    if runtime is None:
        raise RuntimeError("run_chunk reached a worker that does not consume the "
                           "'inference' queue; start inference workers with -Q inference")
    # The queue it came from: a multiplexing worker answers only its model's.
    queue = (self.request.delivery_info or {}).get("routing_key")
    return runtime.run_chunk(chunk_id, queue=queue)
