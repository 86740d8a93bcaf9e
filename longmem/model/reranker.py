"""A passage reranker: all-MiniLM-L6-v2 reading a question and a passage together, scoring how well the passage
answers it (issue 70).

A finder ranks a bank's passages for a question cheaply (BM25 with sections, ``tasks.reading``); the reranker reads
its best few again, each with the question in one sequence (a *cross-encoder*: every question token attends to every
passage token, so "Who shot Gatsby?" can meet "the gardener saw Wilson's body" through the model's layers rather than
through shared words), and orders them by its score. It costs nothing at ingestion; at question time one forward pass
over ``depth`` pairs of up to ``MAX_LENGTH`` tokens.

The model is the installed sentence embedder (``model.embedder``) with LoRA factors on its layers' projections
(``model.lora``), its token-type table (which marks the passage's tokens) and a linear score over the mean of the
last hidden states. A checkpoint is a folder: ``adapter.safetensors`` (factors, token-type table and head, float32, a
few MB) and ``config.json`` (rank, the base weights' SHA-256, how it was trained); loading checks the installed
embedder's weights are the ones it was trained over.

    reranker = Reranker.load("runs/rerank-a/reranker")
    scores = reranker.score("Who shot Gatsby?", [passage_a, passage_b])   # (2,) float32, higher is better
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from longmem.model.embedder import Embedder, default_model_dir
from longmem.model.lora import add_lora
from longmem.model.question_encoder import weights_sha256

CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "reranker-minilm"  # the shipped reranker
ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "config.json"
MAX_LENGTH = 256  # tokens of one (question, passage) pair, [CLS] and both [SEP]s included; the passage is cut
TYPE_TABLE = "embeddings.token_type_embeddings.weight"  # trained beside the factors: it tells passage from question
HEAD = "head"  # the score's parameters in a checkpoint: head.weight (1, dim), head.bias (1,)


class RerankerError(RuntimeError):
    """A reranker checkpoint that is missing, malformed, or trained over other base weights."""


class Reranker(nn.Module):
    """Scores (question, passage) pairs (see the module doc). Build it with ``Reranker.load`` or ``Reranker.new``."""

    def __init__(self, encoder: nn.Module, tokenizer, config: dict, max_length: int = MAX_LENGTH):
        super().__init__()
        self.encoder = encoder  # the embedder's model, its projections carrying LoRA factors
        self.head = nn.Linear(encoder.config.hidden_size, 1)
        self.tokenizer = tokenizer
        self.config = config
        self.max_length = max_length

    @classmethod
    def new(cls, embedder: Embedder, rank: int, seed: int = 0, max_length: int = MAX_LENGTH) -> Reranker:
        """An untrained reranker over a copy of ``embedder``'s model (``embedder`` is not changed): zero-initialised
        factors of ``rank``, a small random head."""
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if not 8 <= max_length <= embedder.model.config.max_position_embeddings:
            raise ValueError(f"max_length must be in 8..{embedder.model.config.max_position_embeddings}, "
                             f"got {max_length}")
        encoder = copy.deepcopy(embedder.model)
        gen = torch.Generator().manual_seed(seed)
        add_lora(getattr(encoder, "encoder", encoder), rank)  # the layers; the BERT pooler is not read
        for name, p in encoder.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("lora_a"):
                with torch.no_grad():  # seeded, so that two runs of one seed train the same
                    bound = 1.0 / p.shape[1] ** 0.5
                    p.copy_(torch.rand(p.shape, generator=gen) * 2 * bound - bound)
        base = Path(embedder.model.config.name_or_path)
        base = base if (base / "model.safetensors").is_file() else default_model_dir()
        config = {"base": base.parent.name if base.name == "model" else base.name, "base_sha256": weights_sha256(base),
                  "rank": rank, "max_length": max_length}
        out = cls(encoder, embedder.tokenizer, config, max_length)
        with torch.no_grad():
            out.head.weight.copy_(torch.randn(out.head.weight.shape, generator=gen) * 0.02)
            out.head.bias.zero_()
        out.trainable()
        return out

    def trainable(self) -> list[nn.Parameter]:
        """Freeze the base weights; the factors, the token-type table and the head learn. Returns those."""
        keep = []
        for name, p in self.named_parameters():
            learns = (name.rsplit(".", 1)[-1].startswith("lora_") or name.startswith(HEAD + ".")
                      or name == f"encoder.{TYPE_TABLE}")
            p.requires_grad_(learns)
            if learns:
                keep.append(p)
        return keep

    def batch(self, questions: list[str], passages: list[str]) -> dict[str, torch.Tensor]:
        """The tokenised pairs, padded: the passage is cut to fit ``max_length`` (the question is kept whole)."""
        return self.tokenizer(questions, passages, padding=True, truncation="only_second",
                              max_length=self.max_length, return_tensors="pt")

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Scores (b,) float32 of tokenised pairs (``batch``)."""
        hidden = self.encoder(**batch).last_hidden_state  # (b, t, dim)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, t, 1)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (b, dim)
        return self.head(mean).squeeze(-1)

    @torch.inference_mode()
    def score(self, question: str, passages: list[str], batch_size: int = 16,
              dtype: torch.dtype = torch.float32) -> np.ndarray:
        """How well each of ``passages`` answers ``question``: (len(passages),) float32, higher better. Scores of one
        question compare with each other; a pair's score does not depend on the others in its batch. ``dtype``: what
        the products compute in (bfloat16: autocast, about twice as fast where the CPU multiplies it natively; the
        weights stay float32)."""
        if isinstance(passages, str):
            raise TypeError("score takes a list of passages, not one string")
        if self.training:
            raise RuntimeError("Reranker.score in training mode: call eval() first")
        out = np.empty(len(passages), dtype=np.float32)
        order = sorted(range(len(passages)), key=lambda i: -len(passages[i]))  # pad little
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                out[rows] = self(self.batch([question] * len(rows), [passages[i] for i in rows])).float().numpy()
        return out

    def weights(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds, by name: the factors, the token-type table and the head."""
        state = self.state_dict()
        return {k: v.detach().contiguous() for k, v in state.items()
                if k.rsplit(".", 1)[-1].startswith("lora_") or k.startswith(HEAD + ".") or k == f"encoder.{TYPE_TABLE}"}

    def save(self, folder: Path, provenance: dict | None = None) -> None:
        """Write the checkpoint (``ADAPTER_FILE`` and ``CONFIG_FILE``) into ``folder``, each file atomically."""
        from safetensors.torch import save

        from longmem.util.files import write_file_atomic

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {**self.config, **({"provenance": provenance} if provenance else {})}
        write_file_atomic(folder / ADAPTER_FILE, save(self.weights()))
        write_file_atomic(folder / CONFIG_FILE, (json.dumps(config, indent=1) + "\n").encode())
        self.config = config

    @classmethod
    def load(cls, folder: str | Path | None = None, embedder: Embedder | None = None) -> Reranker:
        """The reranker of checkpoint ``folder`` (None: the shipped one, ``CHECKPOINT``) over ``embedder`` (None: the
        installed all-MiniLM-L6-v2), in eval mode. Raises ``RerankerError`` when the checkpoint is missing or
        malformed, or was trained over other base weights than the embedder's."""
        from safetensors.torch import load_file

        folder = Path(folder) if folder is not None else CHECKPOINT
        if not (folder / CONFIG_FILE).is_file() or not (folder / ADAPTER_FILE).is_file():
            raise RerankerError(f"{folder}: not a reranker checkpoint (needs {CONFIG_FILE} and {ADAPTER_FILE})")
        try:
            config = json.loads((folder / CONFIG_FILE).read_text())
            rank, max_length = int(config["rank"]), int(config.get("max_length", MAX_LENGTH))
        except (ValueError, KeyError, TypeError) as e:
            raise RerankerError(f"{folder / CONFIG_FILE}: not a reranker config ({e})") from None
        embedder = embedder if embedder is not None else Embedder.load()
        out = cls.new(embedder, rank, max_length=max_length)
        if config.get("base_sha256") != out.config["base_sha256"]:
            raise RerankerError(f"{folder}: trained over other base weights than the installed embedder's "
                                f"(SHA-256 {str(config.get('base_sha256', '?'))[:12]}...)")
        got, want = load_file(str(folder / ADAPTER_FILE)), out.weights()
        if set(got) != set(want) or any(got[k].shape != want[k].shape for k in want):
            raise RerankerError(f"{folder / ADAPTER_FILE}: its weights do not fit a rank-{rank} reranker")
        out.load_state_dict(got, strict=False)
        out.config = config
        out.requires_grad_(False)
        return out.eval()
