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


# The residency scheduler's turn (inference/residency.py): on the control queue (its
# name is routed there, core/celery.py), every second from the beat. A turn
# that finds another deciding skips; the next one sees what it decided.
@shared_task(name="residency.decide", expires=5)
def decide_residency() -> str:
    from inference.residency import residency_decide

    decisions = residency_decide()
    return "; ".join(f"{d.worker} -> {d.model} ({d.reason})" for d in decisions) or "no change"


# A swap, shown in Flower (inference/swap.py publishes one when a worker has made or
# failed one): its kwargs say which worker went from which model to which, its
# result what it cost. The swap itself happened on the worker's swapper thread and
# is in the database already; this only reads it, so a message run twice, or lost,
# changes nothing. On the control queue (residency.* is routed there).
@shared_task(name="residency.swap")
def show_swap(swap_id: int, **shown) -> dict | None:
    from inference.residency import swap_outcome

    return swap_outcome(swap_id)
