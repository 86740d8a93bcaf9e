"""Shared fixtures: tiny random llama (RoPE, GQA) and GPT-2 backbones built in code, float32 for exact checks."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from longmem.backbone import Backbone
from longmem.model import LongMemConfig, LongMemModel

VOCAB = 97


def tiny_llama(n_layers: int = 4, seed: int = 0) -> Backbone:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=n_layers,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return Backbone(LlamaForCausalLM(cfg).float(), name=f"tiny-llama-{n_layers}")


def tiny_gpt2(n_layers: int = 4, seed: int = 0) -> Backbone:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=n_layers, n_head=4, n_positions=256,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return Backbone(GPT2LMHeadModel(cfg).float(), name=f"tiny-gpt2-{n_layers}")


@pytest.fixture(params=["llama", "gpt2"])
def backbone(request) -> Backbone:
    return tiny_llama() if request.param == "llama" else tiny_gpt2()


@pytest.fixture
def llama() -> Backbone:
    return tiny_llama()


def small_config(**kw) -> LongMemConfig:
    base = dict(dtype="float32", csz=2, topk=8, capacity=None, segment_len=16)
    base.update(kw)
    return LongMemConfig(**base)


@pytest.fixture
def model(backbone) -> LongMemModel:
    return LongMemModel(backbone, small_config())


def random_ids(n: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, n), generator=g)
