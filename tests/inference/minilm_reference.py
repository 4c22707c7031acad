"""An independent computation of what an embedding model's score is: Hugging Face
transformers in the test process (not vLLM), mean pooling over the attention mask
as the model's sentence-transformers pooling config says, then cosine. The score
and rerank tests hold vLLM's answers to it."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def _model(model_dir: str):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    return tokenizer, model


def embed(model_dir: Path, texts: list[str], *, threads: int = 1):
    """Unit vectors of `texts` (mean pooling, as all-MiniLM-L6-v2's 1_Pooling says).
    One thread unless told: the engine under test runs on the machine's cores."""
    import torch

    tokenizer, model = _model(str(model_dir))
    torch.set_num_threads(threads)
    vectors = []
    with torch.inference_mode():
        for start in range(0, len(texts), 64):
            batch = tokenizer(texts[start:start + 64], padding=True, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            vectors.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(vectors).double().numpy()


_VECTORS: dict[tuple[str, str], object] = {}


def warm(model_dir: Path, texts: list[str], *, threads: int = 1) -> None:
    """Embed the texts not embedded yet, in batches (a test warms with all its texts
    while the engine is idle, on `threads` threads). Sorted by length, so a batch
    pads little."""
    missing = sorted({text for text in texts if (str(model_dir), text) not in _VECTORS},
                     key=len)
    if missing:
        vectors = embed(model_dir, missing, threads=threads)
        for text, vector in zip(missing, vectors, strict=True):
            _VECTORS[str(model_dir), text] = vector


def scores(model_dir: Path, queries: list[str], documents: list[str]) -> list[float]:
    """The cosine of each (query, document) pair; one query scores every document."""
    if len(queries) == 1:
        queries = queries * len(documents)
    warm(model_dir, [*queries, *documents])
    return [float(_VECTORS[str(model_dir), query] @ _VECTORS[str(model_dir), document])
            for query, document in zip(queries, documents, strict=True)]
