"""`manage.py pingworkers`: whether every inference worker that `serve
--inference-only` starts on this host answers, by its node name. docker-compose's
inference service uses it as its health check: healthy only when each of the
host's workers (BATCHGEN_INFERENCE_WORKERS per served model) answers a ping."""

from __future__ import annotations

from celery.utils.nodenames import host_format
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from batchgen_site.management.commands.serve import inference_node_names
from core.celery import app
from serving.model_info import served_models


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=10.0,
                            help="seconds to wait for the answers (default 10)")

    def handle(self, *args, **options):
        # %h as the worker expanded it in its own -n (the host's name).
        names = [host_format(name) for name in inference_node_names(
            workers=settings.BATCHGEN_INFERENCE_WORKERS,
            # Multiplexing: that many workers in all, not per model.
            models=None if settings.BATCHGEN_MULTIPLEX else [m.id for m in served_models()])]
        if not names:
            raise CommandError("no inference worker is started here (BATCHGEN_INFERENCE_WORKERS=0)")
        replies = app.control.ping(destination=names, timeout=options["timeout"]) or []
        answered = {name for reply in replies for name in reply}
        missing = [name for name in names if name not in answered]
        if missing:
            raise CommandError(f"{len(missing)} of {len(names)} inference workers did not "
                               f"answer: {', '.join(missing)}")
        self.stdout.write(f"{len(names)} inference workers answered: {', '.join(names)}")
