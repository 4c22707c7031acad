"""Score and rerank on a cross-encoder (a sequence classifier with one label), the
other kind of scoring model vLLM serves: each pair is read together and its logit,
through a sigmoid, is the score. The model is a tiny BERT with random weights built
here (no cross-encoder ships with the bundled models), with all-MiniLM-L6-v2's
tokenizer; transformers in the test process computes the same scores independently."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.engines.base import EngineRequest
from serving.engines.registry import engine_spec
from serving.model_prep import EMBEDDING_MODEL_NAME, prepare_embedding_model
from tests.inference.test_vllm_engine import EngineHarness, running_vllm

pytestmark = pytest.mark.vllm

MODEL = "tiny-cross-encoder"
QUERY = "How do I play the guitar?"
DOCUMENTS = ["A man is playing a guitar.", "The central bank raised interest rates today.",
             "Guitar lessons for beginners: chords first.", "The weather is sunny."]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")


def build_cross_encoder(folder: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(38)
    config = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=128,
                        max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def reference_scores(folder: Path, query: str, documents: list[str]) -> list[float]:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        batch = tokenizer([query] * len(documents), documents, padding=True,
                          return_tensors="pt")
        logits = model(**batch).logits[:, 0]
    return torch.sigmoid(logits).tolist()


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineHarness]:
    models = tmp_path_factory.mktemp("models")
    minilm = prepare_embedding_model(models / EMBEDDING_MODEL_NAME)
    folder = build_cross_encoder(models / MODEL, minilm)
    with running_vllm(folder, MODEL) as harness:
        yield harness


def request(endpoint: str, **body: Any) -> EngineRequest:
    return EngineRequest(request_id=f"x-{time.monotonic_ns()}", custom_id="x",
                         endpoint=endpoint, body={"model": MODEL, **body})


def test_a_cross_encoder_serves_score_and_rerank_only(cross_encoder: EngineHarness) -> None:
    folder = Path(cross_encoder.engine.config.model)
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "BertForSequenceClassification"]
    assert set(engine_spec("vllm").endpoints_for(folder)) == {
        "/v1/score", "/score", "/v1/rerank", "/rerank"}


def test_a_cross_encoder_scores_each_pair_read_together(cross_encoder: EngineHarness) -> None:
    folder = Path(cross_encoder.engine.config.model)
    scored, reranked = cross_encoder.generate_all(
        request("/v1/score", queries=QUERY, documents=DOCUMENTS),
        request("/v1/rerank", query=QUERY, documents=DOCUMENTS, top_n=2))

    expected = reference_scores(folder, QUERY, DOCUMENTS)
    assert scored.error is None, scored.error
    assert np.allclose([item["score"] for item in scored.body["data"]], expected, atol=1e-4)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert [result["index"] for result in reranked.body["results"]] == order[:2]
    assert reranked.body["usage"]["prompt_tokens"] > 0
