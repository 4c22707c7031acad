"""Control tasks: thin wrappers that call services. All run on the `control` queue.
Producers publish them by name (batches.dispatch.send_*), so only this module
imports them. The services retry transient database errors themselves
(core.transient)."""

from __future__ import annotations

from celery import shared_task

from batches import availability, dispatch, estimates, recovery, residency, services


# Validation streams the whole input once: a million lines take seconds, a 10 GiB
# file minutes; the limit only stops a runaway.
@shared_task(name="batches.validate_batch", acks_late=True,
             reject_on_worker_lost=True, retry_in_outage=True, time_limit=3 * 3600)
def validate_batch(batch_id: str) -> str:
    return services.batch_validate(batch_id=batch_id).status


# Finalization reads the output file once for its checksum and exact usage: 2.4 s
# for a million 785-byte lines (0.4 s of it the hash), measured.
@shared_task(name="batches.finalize_batch", acks_late=True,
             reject_on_worker_lost=True, retry_in_outage=True, time_limit=3600)
def finalize_batch(batch_id: str) -> str:
    return services.batch_finalize(batch_id=batch_id).status


@shared_task(name="batches.expire_batches", time_limit=600)
def expire_batches() -> int:
    return services.batches_expire()


@shared_task(name="batches.recover_chunks", time_limit=600)
def recover_chunks() -> str:
    return str(recovery.recover())


@shared_task(name="batches.dispatch_chunks", time_limit=300)
def dispatch_chunks() -> int:
    # The tick only covers what workers' own dispatches skipped: never queue for it.
    return dispatch.dispatch(wait=False)


# A handful of queries plus a row per moved estimate (batches/estimates.py); a
# refresh not run within its interval is covered by the next. The beat's tick
# without arguments; with one, an admission's or a cancel's (dispatch.send_refresh).
@shared_task(name="batches.refresh_estimates", time_limit=60, expires=10)
def refresh_estimates(after: float | None = None) -> int:
    if after is None:
        return estimates.estimates_refresh()
    return estimates.estimates_refresh_after(after)


@shared_task(name="batches.watch_models", time_limit=60)
def watch_models() -> int:
    return availability.batches_watch_models()


# The residency scheduler's turn (batches/residency.py): on the control queue (its
# name is routed there, core/celery.py), every second from the beat. A turn
# that finds another deciding skips; the next one sees what it decided.
@shared_task(name="residency.decide", expires=5)
def decide_residency() -> str:
    decisions = residency.residency_decide()
    return "; ".join(f"{d.worker} -> {d.model} ({d.reason})" for d in decisions) or "no change"
