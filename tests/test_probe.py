"""The retrieval probe: chunk ranks by hand, and the untrained memory layer searching exactly as its cached layer."""

import numpy as np
import torch

from tiny import small_config, tiny_llama
from longmem.model import LongMemModel
from training.probe import answer_ranks, markdown, probe_backbone, probe_model
from training.recall import recall_documents

TEXT = ("The rain had stopped by the time they reached the harbour. Nobody spoke. A gull cried twice! "
        "Was the boat still there? It was, tied where they had left it. ")


def test_answer_ranks_by_hand():
    keys = torch.zeros(1, 16, 2)  # one KV head, 4 chunks of 4 tokens, d=2
    keys[0, 0:4] = torch.tensor([5.0, 0.0])  # chunk 0: a sink, scores 5 on head 0
    keys[0, 4:8] = torch.tensor([1.0, 0.0])  # chunk 1: scores 1
    keys[0, 8:12] = torch.tensor([3.0, 0.0])  # chunk 2: the answer, scores 3
    keys[0, 12:16] = torch.tensor([4.0, 0.0])  # chunk 3: a sink, scores 4
    q = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])  # two query heads sharing the KV head
    sinks = torch.tensor([True, False, False, True])
    r = answer_ranks(q, keys, csz=4, answer=range(9, 11), sinks=sinks, max_sinks=1, top=2)
    assert r["rank"] == [2, 1]  # head 0: both sinks score higher; head 1 (negated): only chunk 1 does
    assert r["limited"] == [1, 1]  # at most one sink ahead of the answer
    assert r["top_sinks"] == [2, 0]
    assert answer_ranks(q, keys, 4, range(9, 11), sinks, None, 2)["limited"] == [2, 1]
    # an answer spanning chunks 1 and 2 ranks by its better chunk: chunk 2 for head 0, chunk 1 for head 1
    assert answer_ranks(q, keys, 4, range(7, 9), sinks, 1, 2)["rank"] == [2, 0]


def test_untrained_memory_layer_queries_match_its_cached_layer():
    """With the default cached layer (the layer whose input the memory layer reads), the untrained memory layer's
    search ranks chunks exactly as the backbone's own layer does."""
    backbone = tiny_llama(n_layers=4)
    model = LongMemModel(backbone, small_config(segment_len=128, csz=4, topk=8, memory_layer=1))
    assert model.cached_layer == 2
    tok = backbone.tokenizer
    filler = np.asarray(tok(TEXT * 12, add_special_tokens=False)["input_ids"], dtype=np.int32)
    items = recall_documents(tok, [filler], n=3, distance=300, total=512, seed=0)
    mine = probe_model(model, items, log=lambda m: None)
    layers = probe_backbone(backbone, items, segment_len=128, csz=4, top=2, max_sinks=1, log=lambda m: None)
    assert len(layers) == 4 and all(0 <= r["hit"] <= 1 for r in layers)
    assert mine["best_ranks"] == layers[2]["best_ranks"]
    assert mine["median_rank_limited"] == layers[2]["median_rank_limited"]
    assert 0 <= mine["retrieved"] <= 1
    table = markdown(layers, 2)
    assert table.count("\n") == 5 and "| 2 |" in table
