"""Shared fixtures: tiny random llama (RoPE, GQA), Qwen2 (q/k/v biases, untied head) and GPT-2 backbones built in
code, float32 for exact checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py, also for subprocess-based tests

from tiny import VOCAB, small_config, tiny_backbone, tiny_gpt2, tiny_llama  # noqa: E402

from longmem.model.backbone import Backbone  # noqa: E402
from longmem.model.longmem import LongMemModel  # noqa: E402

__all__ = ["VOCAB", "small_config", "tiny_backbone", "tiny_gpt2", "tiny_llama", "random_ids"]


@pytest.fixture(params=["llama", "qwen2", "gpt2"])
def backbone(request) -> Backbone:
    return tiny_backbone(request.param)


@pytest.fixture
def llama() -> Backbone:
    return tiny_llama()


@pytest.fixture
def model(backbone) -> LongMemModel:
    return LongMemModel(backbone, small_config())


def random_ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, n), generator=g)


@pytest.fixture
def loaded(tmp_path):
    """A tiny chat llama with a 512-token window (room to read a passage), a bank of the story
    (``test_passages.story``) and its memory."""
    from test_passages import story
    from tiny import chat_model

    from longmem.ingest.pipeline import ingest
    from longmem.storage import BankDirectory

    model = chat_model(segment_len=512)
    book = tmp_path / "story.txt"
    book.write_text(story())
    bank = BankDirectory(tmp_path / "banks").create("b", model)
    ingest(bank, model, book)
    memory = bank.load_memory(model)
    yield model, bank, memory
    bank.close()


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory) -> str:
    """A tiny llama with a chat template and a window big enough to read passages, saved as a Hugging Face
    directory, and an (untrained) LongMem checkpoint that names it."""
    from tiny import CHAT_TEMPLATE

    root = tmp_path_factory.mktemp("tiny-chat")
    backbone = tiny_llama()
    backbone.tokenizer.chat_template = CHAT_TEMPLATE
    backbone.model.save_pretrained(root / "backbone")
    backbone.tokenizer.save_pretrained(root / "backbone")
    model = LongMemModel(backbone, small_config(backbone=str(root / "backbone"), segment_len=512))
    return str(model.save(root / "ckpt"))


@pytest.fixture
def searched_queries(monkeypatch) -> list[int]:
    """The query tokens of each memory search a test makes (``Memory.search`` or ``select``), in order."""
    from longmem.memory.memory import Memory

    searched: list[int] = []
    for name in ("search", "select"):
        real = getattr(Memory, name)
        monkeypatch.setattr(Memory, name, lambda self, q, n, real=real: searched.append(q.shape[2]) or real(self, q, n))
    return searched
