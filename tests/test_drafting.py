"""Greedy decoding with the frozen backbone drafting ahead (``Sampling.draft``): the backbone proposes a few tokens,
the model reads them in one pass and keeps those it would have chosen. The tokens must be those of decoding one step
at a time, in every family and dtype, through the window's overflow into memory; drafts the model rejects leave no
trace in the window's caches or in what memory retrieval counted."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import random_ids, small_config, tiny_backbone
from tiny import VOCAB, char_tokenizer
from transformers import MistralConfig, MistralForCausalLM

import longmem.model.lm as lm
from longmem.memory.view import MemoryView
from longmem.model.backbone import Backbone
from longmem.model.lm import Sampling, Window
from longmem.model.longmem import LongMemModel

DTYPES = [torch.float32, torch.bfloat16]
BF16_TIE = 0.05  # a logit gap that bfloat16's rounding (8 bits of mantissa) can reverse in these tiny models
GREEDY = Sampling(max_new_tokens=32, temperature=0, side_weight=0.25, no_repeat=4, stop_ids=(5,), backbone_stops=True)


def opened(family: str, dtype: torch.dtype, segment_len: int) -> LongMemModel:
    """A tiny LongMem whose side branches are open and whose side layers differ from the backbone's, so that its
    tokens often are not the backbone's (drafts get rejected)."""
    model = LongMemModel(tiny_backbone(family, dtype),
                         small_config(segment_len=segment_len, dtype=str(dtype).removeprefix("torch."))).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.sidenet.layers:
            layer.alpha_attn.fill_(1.0)
            layer.alpha_mlp.fill_(1.0)
            for w in layer.block.parameters():
                w.add_(torch.randn(w.shape, generator=g).to(w.dtype) * w.float().std().to(w.dtype))
    return model


def decode(model: LongMemModel, sampling: Sampling) -> tuple[list[int], MemoryView, int]:
    """Tokens, the memory view (its retrieval counts) and the memory's length after generating from a fresh memory."""
    memory = model.new_memory()
    model.memorize(random_ids(64, seed=3), memory)
    view = MemoryView(memory)
    out = list(model.generate(random_ids(10, seed=4), view, sampling))
    return out, view, len(memory)


def greedy_margins(monkeypatch) -> list[float]:
    """The gap between the best and second-best logit (after the no-repeat ban) of each greedy choice made."""
    margins: list[float] = []
    real = lm._sample

    def sample(logits, sampling, gen, banned=()):
        scores = logits.float().clone()
        scores[list(banned)] = float("-inf")
        best = scores.topk(2).values
        margins.append(float(best[0] - best[1]))
        return real(logits, sampling, gen, banned)

    monkeypatch.setattr(lm, "_sample", sample)
    return margins


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("segment_len", [16, 64])  # 16: the window overflows into memory while it decodes
def test_drafting_ahead_gives_the_tokens_of_one_step_at_a_time(family, dtype, segment_len, monkeypatch):
    model = opened(family, dtype, segment_len)
    margins = greedy_margins(monkeypatch)
    plain, plain_view, plain_len = decode(model, replace(GREEDY, draft=0))
    plain_margins = list(margins)
    reads, crops = [], []
    real_read, real_crop = model.read_passes, Window.crop
    monkeypatch.setattr(model, "read_passes", lambda passes, *a: reads.append(len(passes)) or real_read(passes, *a))
    monkeypatch.setattr(Window, "crop", lambda self, n: crops.append(self.length - n) or real_crop(self, n))
    for draft in (4, 2):
        reads.clear()
        out, view, length = decode(model, replace(GREEDY, draft=draft))
        assert max(reads) == draft  # it did read drafts in one pass
        if out != plain:  # drafts are read as a batch, which rounds otherwise: only a near tie may go the other way
            first = next(i for i, (a, b) in enumerate(zip(out, plain)) if a != b)
            assert dtype == torch.bfloat16 and plain_margins[first] < BF16_TIE, (draft, first, plain_margins[first])
            continue
        assert length == plain_len  # the same tokens moved into memory as the window filled
        assert sum(view.hits.values()) == sum(plain_view.hits.values())  # no count from a rejected draft
    if family == "qwen2":  # here the model often rejects a draft before the last one: the window drops the rest
        assert crops, "no read draft was dropped: that path went untested"


@pytest.mark.parametrize("dtype", DTYPES)
def test_drafting_is_off_where_it_could_change_the_tokens(dtype, monkeypatch):
    model = opened("llama", dtype, 64)
    reads = []
    real_read = model.read_passes
    monkeypatch.setattr(model, "read_passes", lambda passes, *a: reads.append(len(passes)) or real_read(passes, *a))
    for sampling in (replace(GREEDY, temperature=0.7, seed=0), replace(GREEDY, side_weight=1.0),
                     replace(GREEDY, draft=0)):
        reads.clear()
        decode(model, sampling)
        assert max(reads) == 1, sampling  # one token per pass after the prompt


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sliding_window_backbone_decodes_one_step_at_a_time(dtype, monkeypatch):
    """Mistral's sliding-window cache cannot drop tokens once its window is full: no drafting there, no error."""
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                        num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                        sliding_window=8)
    backbone = Backbone(MistralForCausalLM(cfg).float().to(dtype), tokenizer=char_tokenizer(), name="tiny-mistral")
    model = LongMemModel(backbone, small_config(segment_len=64, dtype=str(dtype).removeprefix("torch."))).eval()
    reads = []
    real_read = model.read_passes
    monkeypatch.setattr(model, "read_passes", lambda passes, *a: reads.append(len(passes)) or real_read(passes, *a))
    assert decode(model, GREEDY)[0] == decode(model, replace(GREEDY, draft=0))[0]
    assert max(reads) == 1


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_a_cropped_window_reads_on_as_if_the_dropped_tokens_never_came(family):
    model = opened(family, torch.float32, 64)
    ids = random_ids(14, seed=5)
    memory = model.new_memory()
    model.memorize(random_ids(32, seed=6), memory)
    with torch.no_grad():
        cropped, fresh = Window(), Window()
        model.step(ids[:, :10], memory, cropped)
        model.step(ids[:, 10:13], memory, cropped)  # three tokens, then dropped
        cropped.crop(10)
        assert cropped.length == 10 and cropped.mem_k.shape[2] == 10
        model.step(ids[:, :10], memory, fresh)
        after = [model.step(ids[:, 13:], memory, w).hidden for w in (cropped, fresh)]
    torch.testing.assert_close(after[0], after[1])
    assert torch.equal(cropped.ids, fresh.ids)


def test_forget_uncounts_what_a_search_counted():
    view = MemoryView(None)
    view.hits = {3: 2, 7: 1}
    view.forget(torch.tensor([[[[3, 7, -1]]]]))  # (B, H, T, n); -1: no chunk
    assert view.hits == {3: 1}


def test_a_negative_draft_is_refused():
    with pytest.raises(ValueError, match="draft"):
        Sampling(draft=-1)
