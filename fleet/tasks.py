"""The fleet's one task: a swap shown in Flower. Published by name by the worker that
made the swap (inference/swap.py), so only this module imports it."""

from __future__ import annotations

from celery import shared_task

from fleet.selectors import swap_outcome


# A swap, shown in Flower (inference/swap.py publishes one when a worker has made or
# failed one): its kwargs say which worker went from which model to which, its
# result what it cost. The swap itself happened on the worker's swapper thread and
# is in the database already; this only reads it, so a message run twice, or lost,
# changes nothing. On the control queue (residency.* is routed there).
@shared_task(name="residency.swap")
def show_swap(swap_id: int, **shown) -> dict | None:
    return swap_outcome(swap_id)
