"""Shared fixtures: tiny random llama (RoPE, GQA), Qwen2 (q/k/v biases, untied head) and GPT-2 backbones built in
code, float32 for exact checks; banks holding a text (``bank_of``), the story's bank (``loaded``), a saved chat
checkpoint. Plain helpers are in ``helpers.py``, the tiny models in ``tiny.py``."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import story
from tiny import VOCAB, chat_model, small_config, tiny_backbone, tiny_gpt2, tiny_llama

from longmem.ingest.pipeline import ingest
from longmem.model.backbone import Backbone
from longmem.model.longmem import LongMemModel
from longmem.storage import BankDirectory

__all__ = ["VOCAB", "small_config", "tiny_backbone", "tiny_gpt2", "tiny_llama", "random_ids"]
pytest_plugins = ["data_guard", "pytester"]  # every test as on a fresh clone, but those marked shared_data


def pytest_configure(config) -> None:
    """A reader fetched on this machine (``longmem models get``) never answers in a test: "auto" means the embedded
    135M here, in this process and in the commands it starts (tests that choose a reader name it)."""
    from longmem.model.readers import READER_ENV

    os.environ[READER_ENV] = "default"


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
def bank_of(tmp_path):
    """``bank_of(model, text)``: a bank ``b`` under ``tmp_path/banks`` holding ``text``, written to
    ``tmp_path/story.txt`` (or ``filename``) and ingested through ``model``; closed after the test."""
    made = []

    def make(model: LongMemModel, text: str, name: str = "b", filename: str = "story.txt"):
        book = tmp_path / filename
        book.write_text(text)
        bank = BankDirectory(tmp_path / "banks").create(name, model)
        made.append(bank)
        ingest(bank, model, book)
        return bank

    yield make
    for bank in made:
        bank.close()


@pytest.fixture
def loaded(bank_of):
    """A tiny chat llama with a 512-token window (room to read a passage), a bank of the story
    (``helpers.story``) and its memory."""
    model = chat_model(segment_len=512)
    bank = bank_of(model, story())
    return model, bank, bank.load_memory(model)


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
