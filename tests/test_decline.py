"""A reply the model gives only when it is sure of it (``Sampling.decline``: "The book does not say."): its
probability is read right after the prompt, the reply is the decline when that is above ``decline_above``, and
otherwise the model answers with its likeliest reply that does not begin with it. Reading the decline must leave the
generation as it would have been (its tokens cut from the window, its searches from memory's counts), in every family
and dtype; ``Reading.decline`` puts it behind the book-or-not prompt's words."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from conftest import random_ids
from test_drafting import DTYPES, GREEDY, opened
from tiny import VOCAB, char_tokenizer
from transformers import MistralConfig, MistralForCausalLM

from longmem.memory.view import MemoryView
from longmem.model.backbone import Backbone
from longmem.model.baselines import BackboneLM
from longmem.model.lm import Sampling, Trace
from longmem.tasks.reading import DECLINE, PROMPTS, Reading

PROMPT = random_ids(10, seed=4)[0]
FAMILIES = ["llama", "qwen2", "gpt2"]


def bank(model):
    memory = model.new_memory()
    model.memorize(random_ids(64, seed=3), memory)
    return memory


def bank_view(model) -> MemoryView:
    return MemoryView(bank(model))


def generated(model, sampling: Sampling, memory=None, trace: Trace | None = None) -> list[int]:
    return list(model.generate(PROMPT, memory, sampling, trace=trace))


def beside_plain(family: str, dtype: torch.dtype):
    """A tiny LongMem, its greedy tokens with a view of a bank, that view, and a second view of the same bank (for a
    generation that must leave both the same)."""
    model = opened(family, dtype, 64)
    plain_view, view = bank_view(model), bank_view(model)
    return model, generated(model, GREEDY, plain_view), plain_view, view


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_decline_s_traced_probability_is_the_model_s_own(family, dtype):
    model = opened(family, dtype, 64)
    decline = (7, 12, 40)
    trace = Trace()
    # the model's own logits (side_weight 1), so that ``score`` (one pass, every token searching) reads the same
    generated(model, replace(GREEDY, side_weight=1.0, decline=decline, decline_above=1.0), bank_view(model), trace)
    expected = model.score(PROMPT, torch.tensor(decline), bank(model))
    assert trace.decline is not None and not trace.declined
    tol = 1e-3 if dtype == torch.float32 else 0.15  # bfloat16: one pass against the decode's incremental ones
    assert math.log(trace.decline) == pytest.approx(expected, abs=tol * max(1.0, abs(expected)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_decline_not_taken_leaves_the_generation_and_memory_s_counts_as_they_were(family, dtype):
    model, plain, plain_view, view = beside_plain(family, dtype)
    decline = tuple(t for t in (9, 30, 61) if t != plain[0])[:2]  # not the first token made: no ban applies
    trace = Trace()
    out = generated(model, replace(GREEDY, decline=decline, decline_above=1.0), view, trace)
    assert out == plain
    assert view.hits == plain_view.hits  # the decline's own searches were uncounted
    assert 0.0 < trace.decline < 1.0 and len(trace.probs) == len(out)
    assert all(0.0 < p <= 1.0 for p in trace.probs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_decline_the_model_is_sure_of_is_the_reply(dtype):
    model = opened("llama", dtype, 64)
    trace = Trace()
    out = generated(model, replace(GREEDY, decline=(7, 12, 40), decline_above=0.0), bank_view(model), trace)
    assert out == [7, 12, 40] and trace.declined
    assert len(trace.probs) == 3 and math.prod(trace.probs) == pytest.approx(trace.decline, rel=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_decline_the_model_is_not_sure_of_is_not_begun(family, dtype):
    """The model's own first two tokens as the decline, at a threshold above their probability: the reply starts as
    the model would, but its second token is another."""
    backbone = opened(family, dtype, 64).backbone
    model = BackboneLM(backbone, 64)
    sampling = Sampling(max_new_tokens=8, temperature=0.0)
    plain = generated(model, sampling)
    trace = Trace()
    out = generated(model, replace(sampling, decline=tuple(plain[:2]), decline_above=1.0), None, trace)
    assert out[0] == plain[0] and out[1] != plain[1]
    assert 0.0 < trace.decline < 1.0 and not trace.declined
    sure = generated(model, replace(sampling, decline=tuple(plain[:2]), decline_above=trace.decline / 2))
    assert sure == plain[:2]


def tiny_mistral(dtype: torch.dtype) -> BackboneLM:
    """A tiny Mistral alone, with a sliding window of 8 tokens (a cache that cannot be cut back), a 64-token window."""
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                        sliding_window=8)
    return BackboneLM(Backbone(MistralForCausalLM(cfg).float().to(dtype), tokenizer=char_tokenizer(),
                               name="tiny-mistral"), 64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cache_that_cannot_be_cut_back_generates_as_without_a_decline(dtype):
    """Mistral's sliding-window cache keeps too little to go back: the decline is not read, and no error."""
    model = tiny_mistral(dtype)
    sampling = Sampling(max_new_tokens=8, temperature=0.0)
    plain = generated(model, sampling)
    trace = Trace()
    assert generated(model, replace(sampling, decline=tuple(plain[:2]), decline_above=1.0), None, trace) == plain
    assert trace.decline is None


def test_sampling_refuses_a_decline_threshold_outside_0_1():
    with pytest.raises(ValueError, match="decline_above"):
        Sampling(decline=(1, 2), decline_above=1.5)


def test_the_reading_weighs_the_decline_only_with_the_prompt_that_names_it():
    assert DECLINE in PROMPTS["book-or-not"] and DECLINE not in PROMPTS["book"]
    assert Reading(prompt="book-or-not", decline=0.6).declines
    assert not Reading(prompt="book", decline=0.6).declines
    assert not Reading(prompt="book-or-not").declines  # 0: as the reader generates
    with pytest.raises(ValueError, match="decline"):
        Reading(decline=1.2)
