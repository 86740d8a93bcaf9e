"""A question encoder for finding passages: all-MiniLM-L6-v2 with low-rank updates trained on readers' questions
(issue 70), beside the stock model that embeds the passages.

The pair is asymmetric. Passages are embedded by the embedder as it ships (``model.embedder.Embedder``), so a bank's
passage vectors never change when the finder is trained again, and the embedding-RAG baseline reads the same vectors.
Questions are embedded by a copy of it whose linear projections carry LoRA factors (``model.lora``), trained to put a
question near the passage that answers it in words other than its own ("Who shot Gatsby?" near "the gardener saw
Wilson's body"). Encoding is the embedder's: mean pooling over the question's tokens, L2 normalised, so a score is the
inner product of a question vector and a stock passage vector.

A checkpoint is a folder: ``adapter.safetensors`` (the factors, float32, a few MB) and ``config.json`` (rank, the base
weights' SHA-256, how it was trained). Loading checks that the installed embedder's weights are the ones the factors
were trained over; the factors mean nothing over others.

    encoder = QuestionEncoder.load()                 # the shipped one, over the installed embedder
    vectors = encoder.encode(["Who shot Gatsby?"])   # (1, 384) float32, unit norm
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from longmem.model.embedder import Embedder, default_model_dir
from longmem.model.lora import add_lora

CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "finder-minilm"  # the shipped encoder
ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "config.json"
QUESTION_TOKENS = 64  # a question is read up to this many tokens (readers' questions are 8-40)


class QuestionEncoderError(RuntimeError):
    """A question-encoder checkpoint that is missing, malformed, or trained over other base weights."""


def weights_sha256(folder: Path) -> str:
    """SHA-256 of an embedder folder's ``model.safetensors``: which base weights factors were trained over."""
    h = hashlib.sha256()
    with open(Path(folder) / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def with_factors(embedder: Embedder, rank: int, max_length: int = QUESTION_TOKENS) -> Embedder:
    """A copy of ``embedder`` whose linear projections carry zero-initialised LoRA factors of ``rank`` (so it encodes
    as ``embedder`` does until they are trained), reading ``max_length`` tokens; ``embedder`` is not changed."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    model = copy.deepcopy(embedder.model)
    add_lora(getattr(model, "encoder", model), rank)  # the layers; a BERT pooler is not read (mean pooling)
    return Embedder(model, embedder.tokenizer, embedder.device, min(max_length, embedder.max_length))


def factors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA factors of ``model`` by parameter name (what a checkpoint holds)."""
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()
            if k.rsplit(".", 1)[-1].startswith("lora_")}


class QuestionEncoder:
    """Encodes questions for finding passages embedded by the stock embedder (see the module doc). Build it with
    ``load`` or from a trained ``Embedder`` (``with_factors``)."""

    def __init__(self, questions: Embedder, config: dict):
        self.questions = questions  # the embedder with trained factors
        self.config = config

    @property
    def dim(self) -> int:
        return self.questions.dim

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Question vectors (len(texts), dim) float32, unit norm (``Embedder.encode``)."""
        return self.questions.encode(texts, batch_size=batch_size)

    def save(self, folder: Path, provenance: dict | None = None) -> None:
        """Write the checkpoint (``ADAPTER_FILE`` and ``CONFIG_FILE``) into ``folder``, each file atomically."""
        from safetensors.torch import save

        from longmem.util.files import write_file_atomic

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {**self.config, **({"provenance": provenance} if provenance else {})}
        write_file_atomic(folder / ADAPTER_FILE, save(factors(self.questions.model)))
        write_file_atomic(folder / CONFIG_FILE, (json.dumps(config, indent=1) + "\n").encode())
        self.config = config

    @classmethod
    def load(cls, folder: str | Path | None = None, embedder: Embedder | None = None) -> QuestionEncoder:
        """The encoder of checkpoint ``folder`` (None: the shipped one, ``CHECKPOINT``) over ``embedder`` (None: the
        installed all-MiniLM-L6-v2, loaded). Raises ``QuestionEncoderError`` when the checkpoint is missing or
        malformed, or its factors were trained over other base weights than the embedder's."""
        from safetensors.torch import load_file

        folder = Path(folder) if folder is not None else CHECKPOINT
        if not (folder / CONFIG_FILE).is_file() or not (folder / ADAPTER_FILE).is_file():
            raise QuestionEncoderError(f"{folder}: not a question-encoder checkpoint (needs {CONFIG_FILE} and "
                                       f"{ADAPTER_FILE})")
        try:
            config = json.loads((folder / CONFIG_FILE).read_text())
            rank = int(config["rank"])
        except (ValueError, KeyError, TypeError) as e:
            raise QuestionEncoderError(f"{folder / CONFIG_FILE}: not a question-encoder config ({e})") from None
        embedder = embedder if embedder is not None else Embedder.load()
        base = Path(embedder.model.config.name_or_path)
        base = base if (base / "model.safetensors").is_file() else default_model_dir()
        if config.get("base_sha256") != weights_sha256(base):
            raise QuestionEncoderError(f"{folder}: its factors were trained over other base weights than the "
                                       f"embedder's in {base} (SHA-256 {config.get('base_sha256', '?')[:12]}...)")
        questions = with_factors(embedder, rank, int(config.get("max_length", QUESTION_TOKENS)))
        got = load_file(str(folder / ADAPTER_FILE))
        want = factors(questions.model)
        if set(got) != set(want) or any(got[k].shape != want[k].shape for k in want):
            raise QuestionEncoderError(f"{folder / ADAPTER_FILE}: its factors do not fit a rank-{rank} encoder")
        questions.model.load_state_dict(got, strict=False)
        questions.model.eval()
        return cls(questions, config)
