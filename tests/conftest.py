"""Shared fixtures: tiny random llama (RoPE, GQA) and GPT-2 backbones built in code, float32 for exact checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py, also for subprocess-based tests

from tiny import VOCAB, small_config, tiny_gpt2, tiny_llama  # noqa: E402

from longmem.model.backbone import Backbone  # noqa: E402
from longmem.model.longmem import LongMemModel  # noqa: E402

__all__ = ["VOCAB", "small_config", "tiny_gpt2", "tiny_llama", "random_ids"]


@pytest.fixture(params=["llama", "gpt2"])
def backbone(request) -> Backbone:
    return tiny_llama() if request.param == "llama" else tiny_gpt2()


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
def searched_queries(monkeypatch) -> list[int]:
    """The query tokens of each memory search a test makes (``Memory.search`` or ``select``), in order."""
    from longmem.memory.memory import Memory

    searched: list[int] = []
    for name in ("search", "select"):
        real = getattr(Memory, name)
        monkeypatch.setattr(Memory, name, lambda self, q, n, real=real: searched.append(q.shape[2]) or real(self, q, n))
    return searched
