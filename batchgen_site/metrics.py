"""GET /metrics in Prometheus' text format.

Every figure is read from the database when Prometheus scrapes, so any web process
answers with the same numbers (gunicorn runs several; in-process counters would each
see only their own requests) and nothing is lost when a process restarts. Totals are
sums over rows that only grow (batch counts, worker heartbeats), so they behave as
counters; per-worker series come from live workers only, so restarts do not pile up
stale series.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.db.models import Count, F, Q, Sum
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

WORKER_LABELS = ["worker", "hostname"]
KEY_GAUGES = {  # per API key name: kind -> (metric, help)
    "today": ("tokens_today", "Input plus output tokens this key used today (UTC)"),
    "held": ("intake_held", "Requests this key's batches hold in the intake pool"),
    "intake": ("max_intake_requests", "This key's intake quota (absent: no limit)"),
    "tokens": ("tokens_per_day", "This key's daily token quota (absent: no limit)"),
}
# Each live worker's figures from its heartbeat: (Worker attribute, family, metric
# name, help); a text attribute is a 1/0 flag (set or empty).
WORKER_FIGURES = [
    ("requests_completed", CounterMetricFamily, "requests_completed",
     "Requests this worker completed since it started"),
    ("requests_failed", CounterMetricFamily, "requests_failed",
     "Requests that failed on this worker since it started"),
    ("tokens_generated", CounterMetricFamily, "tokens_generated",
     "Completion tokens this worker generated since it started"),
    ("prompt_tokens_computed", CounterMetricFamily, "prompt_tokens_computed",
     "Prompt tokens this worker's engine computed since it started (prefix-cache hits "
     "left out)"),
    ("busy_seconds", CounterMetricFamily, "busy_seconds",
     "Seconds this worker's engine held at least one request since it started"),
    ("slots_active", GaugeMetricFamily, "slots_active", "Requests inside this worker's engine"),
    ("slots_capacity", GaugeMetricFamily, "slots_capacity",
     "This worker's slots (--max-pool-size)"),
    ("tokens_active", GaugeMetricFamily, "tokens_active",
     "Estimated tokens of the requests inside this worker's engine"),
    ("token_budget", GaugeMetricFamily, "token_budget",
     "This worker's token budget for admission (its KV cache by default)"),
    ("ready", GaugeMetricFamily, "ready", "1 once this worker's engine has started"),
    ("storage_error", GaugeMetricFamily, "storage_full",
     "1 while this worker holds results the full storage volume cannot take"),
]
# Adaptive concurrency: the key in the worker's `admission` (or its signals), the
# metric's name after batchgen_adaptive_, its help.
ADAPTIVE_GAUGES = [
    ("limit", "limit", "Batch requests this worker may have at its engine server now"),
    ("floor", "floor", "The limit's floor (BATCHGEN_ADAPTIVE_FLOOR)"),
    ("ceiling", "ceiling", "The limit's ceiling (BATCHGEN_ADAPTIVE_CEILING)"),
    ("in_flight", "in_flight", "Batch requests this worker has at its engine server"),
    ("waiting_at_gate", "held_back", "Requests this worker holds back under the limit"),
    ("shed_total", "shed", "Requests stopped by cuts of the limit and sent again"),
    ("server_running", "server_running",
     "Requests the engine server runs, everyone's (vllm:num_requests_running)"),
    ("server_waiting", "server_waiting",
     "Requests waiting at the engine server, everyone's (vllm:num_requests_waiting)"),
    ("others", "other_requests", "Requests at the engine server that are not the batch's"),
    ("inter_token_latency", "inter_token_latency_seconds",
     "The engine server's mean inter-token latency at the last look"),
    ("baseline_latency", "baseline_latency_seconds",
     "The engine server's unloaded inter-token latency, as the controller remembers it"),
    ("hold_seconds", "hold_seconds",
     "How long after other traffic was last seen the batch keeps to the shared rule"),
]


class BatchGenCollector(Collector):
    def collect(self):
        yield from self._pool()
        yield from self._batches()
        yield from self._chunks()
        yield from self._workers()
        yield from self._residency()
        yield from self._keys()

    def _pool(self):
        from batches.selectors import pool_status

        pool = pool_status()
        for key, help_text in [
            ("intake_pool_size", "Requests admitted and not yet inside an engine"),
            ("intake_pool_capacity", "Requests the intake pool admits at most"),
            ("scheduling_pool_active", "Requests inside the live workers' engines"),
            ("scheduling_pool_free", "Free slots across the live workers"),
            ("scheduling_pool_capacity", "Slots across the live workers"),
            ("active_batches", "Batches validating, in progress, finalizing or cancelling"),
            ("scheduling_pool_tokens_active",
             "Estimated tokens (prompt + completion) of the requests inside the engines"),
            ("scheduling_pool_token_budget",
             "Token budget of length-aware admission across the live workers"),
        ]:
            if pool.get(key) is not None:  # no budget: the series is absent, not zero
                yield GaugeMetricFamily(f"batchgen_{key}", help_text, value=pool[key])

    def _batches(self):
        from batches.estimates import at_risk_count
        from batches.models import Batch, BatchStatus

        by_status = dict(Batch.objects.order_by().values_list("status")
                         .annotate(n=Count("id")).values_list("status", "n"))
        batches = GaugeMetricFamily("batchgen_batches", "Batches by status", labels=["status"])
        for status in BatchStatus.values:
            batches.add_metric([status], by_status.get(status, 0))
        yield batches
        sums = Batch.objects.aggregate(
            total=Sum("total", filter=Q(in_progress_at__isnull=False)),  # enqueued ones
            completed=Sum("completed"), failed=Sum("failed"))
        yield GaugeMetricFamily(
            "batchgen_batches_at_risk",
            "Running batches that cannot finish inside their completion window even with "
            "every worker of their model (batches/estimates.py)", value=at_risk_count())
        yield CounterMetricFamily("batchgen_requests_completed",
                                  "Requests completed, summed over all batches",
                                  value=sums["completed"] or 0)
        yield CounterMetricFamily("batchgen_requests_failed",
                                  "Requests failed, summed over all batches",
                                  value=sums["failed"] or 0)
        yield CounterMetricFamily("batchgen_requests_admitted",
                                  "Requests of every batch that was enqueued",
                                  value=sums["total"] or 0)

    def _chunks(self):
        from batches.models import Chunk, ChunkStatus

        # Only open chunks: closed ones pile up forever and their count says nothing.
        closed = [ChunkStatus.DONE, ChunkStatus.SKIPPED]
        open_statuses = [s for s in ChunkStatus.values if s not in closed]
        by_status = dict(Chunk.objects.filter(status__in=open_statuses).order_by()
                         .values_list("status").annotate(n=Count("id"))
                         .values_list("status", "n"))
        chunks = GaugeMetricFamily("batchgen_chunks_open", "Chunks not yet closed, by status",
                                   labels=["status"])
        for status in open_statuses:
            chunks.add_metric([status], by_status.get(status, 0))
        yield chunks

    def _workers(self):
        from fleet.models import Worker
        from fleet.selectors import live_workers

        totals = Worker.objects.aggregate(tokens=Sum("tokens_generated"))
        yield CounterMetricFamily("batchgen_tokens_generated",
                                  "Completion tokens generated by every worker there was",
                                  value=totals["tokens"] or 0)
        workers = list(live_workers().order_by("name"))
        yield GaugeMetricFamily("batchgen_workers_live", "Inference workers alive",
                                value=len(workers))
        families = {attribute: kind(f"batchgen_worker_{name}", help_text, labels=WORKER_LABELS)
                    for attribute, kind, name, help_text in WORKER_FIGURES}
        for worker in workers:
            labels = [worker.name, worker.hostname]
            for attribute, family in families.items():
                value = getattr(worker, attribute)
                if value is not None:  # a worker without a token budget: absent
                    family.add_metric(labels, value if not isinstance(value, str)
                                      else int(bool(value)))
        yield from families.values()
        yield from self._adaptive(workers)

    def _adaptive(self, workers):
        """Adaptive concurrency (inference/adaptive.py): present for the workers that
        have it. A signal the server did not give is absent, not zero."""
        families = {key: GaugeMetricFamily(f"batchgen_adaptive_{name}", help_text,
                                           labels=WORKER_LABELS)
                    for key, name, help_text in ADAPTIVE_GAUGES}
        for worker in workers:
            admission = worker.admission
            if not admission:
                continue
            figures = {**(admission.get("signals") or {}), **admission}
            for key, family in families.items():
                if isinstance(figures.get(key), int | float):
                    family.add_metric([worker.name, worker.hostname], figures[key])
        yield from families.values()

    def _residency(self):
        """Model multiplexing (fleet/residency.py): absent while no worker does."""
        from batches.selectors import residency_figures
        from fleet.models import ModelSwap, Residency

        if not Residency.objects.exists() and not ModelSwap.objects.exists():
            return
        figures = residency_figures()
        yield CounterMetricFamily("batchgen_model_swaps",
                                  "Swaps decided from one model to another on a worker",
                                  value=figures["swaps"])
        yield CounterMetricFamily("batchgen_model_loads",
                                  "First models loaded by multiplexing workers",
                                  value=figures["loads"])
        yield CounterMetricFamily("batchgen_model_swap_seconds",
                                  "Seconds spent stopping and starting engines in swaps and "
                                  "loads", value=figures["swap_seconds"])
        resident = GaugeMetricFamily("batchgen_model_resident_workers",
                                     "Live workers a model is resident on", labels=["model"])
        open_requests = GaugeMetricFamily("batchgen_model_requests_open",
                                          "A model's requests not yet finished",
                                          labels=["model"])
        waiting = GaugeMetricFamily("batchgen_model_wait_seconds",
                                    "How long a model with open requests has waited for a "
                                    "worker (0 while resident)", labels=["model"])
        for model, row in figures["models"].items():
            resident.add_metric([model], len(row["resident_on"]))
            open_requests.add_metric([model], row["requests_open"])
            waiting.add_metric([model], row["waiting_seconds"] or 0)
        yield from (resident, open_requests, waiting)

    def _keys(self):

        """Per API key, labelled by the key's name (never its secret or prefix); keys
        that share a name are summed. Usage counters cover every day there was."""
        from batches.models import Batch
        from batches.quotas import utc_today
        from core.models import ApiKey, KeyUsage

        names = dict(ApiKey.objects.values_list("id", "name"))
        if not names:
            return
        figures = ("requests_completed", "requests_failed", "input_tokens", "cached_tokens",
                   "output_tokens")
        totals = KeyUsage.objects.order_by().values("key__name").annotate(
            **{f: Sum(f) for f in figures})
        today = dict(KeyUsage.objects.filter(day=utc_today()).order_by()
                     .values_list("key__name").annotate(n=Sum(F("input_tokens")
                                                              + F("output_tokens"))))
        held = dict(Batch.objects.filter(intake_reserved__gt=0, owner__isnull=False)
                    .order_by().values_list("owner__name").annotate(n=Sum("intake_reserved")))
        limits = ApiKey.objects.filter(revoked_at__isnull=True).order_by().values("name")
        limits = limits.annotate(intake=Sum("max_intake_requests"), tokens=Sum("tokens_per_day"))

        requests = CounterMetricFamily("batchgen_key_requests",
                                       "Requests of this key's batches that finished, by outcome",
                                       labels=["key", "outcome"])
        tokens = {kind: CounterMetricFamily(f"batchgen_key_{kind}_tokens",
                                            f"{kind.capitalize()} tokens of this key's batches",
                                            labels=["key"])
                  for kind in ("input", "cached", "output")}
        for row in totals:
            name = row["key__name"]
            requests.add_metric([name, "completed"], row["requests_completed"] or 0)
            requests.add_metric([name, "failed"], row["requests_failed"] or 0)
            for kind, family in tokens.items():
                family.add_metric([name], row[f"{kind}_tokens"] or 0)
        yield requests
        yield from tokens.values()
        gauges = {kind: GaugeMetricFamily(f"batchgen_key_{metric}", help_text, labels=["key"])
                  for kind, (metric, help_text) in KEY_GAUGES.items()}
        for name in sorted(set(names.values())):
            gauges["today"].add_metric([name], today.get(name) or 0)
            gauges["held"].add_metric([name], held.get(name) or 0)
        for row in limits:
            for kind in ("intake", "tokens"):
                if row[kind] is not None:
                    gauges[kind].add_metric([row["name"]], row[kind])
        yield from gauges.values()


registry = CollectorRegistry(auto_describe=False)
registry.register(BatchGenCollector())


@require_GET
def metrics_view(request):
    try:
        body = generate_latest(registry)
    except DatabaseError as exc:
        logger.warning("metrics: database unreachable: %s", exc)
        return HttpResponse(f"# database unreachable: {exc}\n", status=503,
                            content_type="text/plain; charset=utf-8")
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
