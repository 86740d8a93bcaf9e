"""The retrieval probe: chunk ranks by hand, and the untrained memory layer searching exactly as its cached layer."""

import numpy as np
import pytest
import torch
from tiny import small_config, tiny_llama

from longmem.eval.datasets.recall import recall_documents
from longmem.model.longmem import LongMemModel
from training.studies.probe import (
    answer_ranks,
    copy_heads,
    copy_heads_markdown,
    main,
    markdown,
    probe_backbone,
    probe_model,
)

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
    r = answer_ranks(q, keys, chunk_size=4, answer=range(9, 11), sinks=sinks, max_sinks=1, top=2)
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
    model = LongMemModel(backbone, small_config(segment_len=128, chunk_size=4, topk=8, memory_layer=1))
    assert model.cached_layer == 2
    tok = backbone.tokenizer
    filler = np.asarray(tok(TEXT * 12, add_special_tokens=False)["input_ids"], dtype=np.int32)
    items = recall_documents(tok, [filler], n=3, distance=300, total=512, seed=0)
    mine = probe_model(model, items, log=lambda m: None)
    layers = probe_backbone(backbone, items, segment_len=128, chunk_size=4, top=2, max_sinks=1, log=lambda m: None)
    assert len(layers) == 4 and all(0 <= r["hit"] <= 1 for r in layers)
    assert mine["best_ranks"] == layers[2]["best_ranks"]
    assert mine["median_rank_limited"] == layers[2]["median_rank_limited"]
    assert 0 <= mine["retrieved"] <= 1
    table = markdown(layers, 2)
    assert table.count("\n") == 5 and "| 2 |" in table


def test_copy_heads_match_the_backbones_own_attention():
    """The copy-head probe's attention is the backbone's causal attention from the query onto the answer token."""
    backbone = tiny_llama(n_layers=2)
    tok = backbone.tokenizer
    filler = np.asarray(tok(TEXT * 12, add_special_tokens=False)["input_ids"], dtype=np.int32)
    items = recall_documents(tok, [filler], n=2, distance=60, total=256, seed=0)
    result = copy_heads(backbone, items)
    backbone.model.config._attn_implementation = "eager"  # Hugging Face returns attention weights only in eager
    expected = np.zeros((2, backbone.spec.n_heads))
    with torch.no_grad():
        for item in items:
            out = backbone.model(torch.as_tensor(item.ids, dtype=torch.long)[None], output_attentions=True)
            for layer in range(2):
                expected[layer] += out.attentions[layer][0, :, item.answer_start - 1, item.answer_pos].float().numpy()
    # the tiny model attends almost uniformly, so only a tight tolerance tells positions apart
    assert np.allclose(np.array(result["attention"]), expected / len(items), rtol=1e-3, atol=1e-7)
    ranks = np.array(result["rank"])
    assert ranks.shape == (2, backbone.spec.n_heads) and (ranks >= 0).all() and (ranks < 256).all()
    assert copy_heads_markdown(result, n=3).count("\n") == 6


def test_readout_heads_read_memory_and_no_heads_is_the_backbone():
    from longmem.eval.measures import recalled
    from longmem.model.baselines import BackboneLM
    from training.studies.probe import readout

    backbone = tiny_llama(n_layers=2)
    tok = backbone.tokenizer
    filler = np.asarray(tok(TEXT * 12, add_special_tokens=False)["input_ids"], dtype=np.int32)
    items = recall_documents(tok, [filler], n=2, distance=300, total=512, seed=0)
    plain = readout(backbone, items, layer=1, heads=[], segment_len=128, chunk_size=4, topk=8, max_sinks=0)
    ref = [recalled(BackboneLM(backbone, 128), item) for item in items]
    assert plain["answer_nll"] == pytest.approx(sum(r[1] for r in ref) / sum(r[2] for r in ref), rel=1e-4)
    reading = readout(backbone, items, layer=1, heads=[0, 3], segment_len=128, chunk_size=4, topk=8, max_sinks=0)
    assert reading["answer_nll"] != pytest.approx(plain["answer_nll"], rel=1e-4)  # memory reached the answer
    assert reading["heads"] == [0, 3] and len(reading["recalled"]) == 2


@pytest.mark.parametrize("argv, message", [(["--copy-heads", "--readout", "18", "--heads", "6"], "separate probes"),
                                           (["--readout", "18"], "needs --heads"),
                                           (["--answers"], "give --checkpoint DIR or --untrained"),
                                           (["--values", "1", "--copy-heads"], "separate probes")])
def test_probe_refuses_options_that_do_not_go_together(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_answer_probe_attention_is_the_memory_layers_softmax_over_memory():
    """With K covering all of memory, each head's attention on the token to copy is a softmax of its query against
    every stored key, computed here from the bank's own rows; predictions and NLL are those of ``recalled``."""
    from longmem.eval.measures import recalled
    from training.studies.probe import _Recorder, _split, answers_markdown, probe_answers

    backbone = tiny_llama(n_layers=2)
    model = LongMemModel(backbone, small_config(segment_len=128, chunk_size=4, topk=384, memory_layer=0,
                                                max_sinks=None))
    tok = backbone.tokenizer
    filler = np.asarray(tok(TEXT * 12, add_special_tokens=False)["input_ids"], dtype=np.int32)
    items = recall_documents(tok, [filler], n=2, distance=300, total=512, seed=0)
    result = probe_answers(model.eval(), items, log=lambda m: None)
    hq, hkv, d = backbone.spec.n_heads, backbone.spec.n_kv_heads, backbone.spec.head_dim
    for item, got in zip(items, result["items"]):
        past, window, qpos, answer = _split(item, 128)
        memory = model.new_memory(capacity=None)
        model.memorize(past, memory)
        rec = _Recorder(memory)
        model.step(window[None], rec)
        q = torch.cat(rec.queries, dim=2)[0].float()  # (Hq, T, d)
        row = memory.rows[0]
        keys = row.k[:, : row.n].reshape(hkv, -1, d).float()[torch.arange(hq) // (hq // hkv)]  # (Hq, 384, d)
        for j, pos in enumerate(answer):
            probs = torch.softmax(torch.einsum("hd,hnd->hn", q[:, qpos + j], keys) / d ** 0.5, dim=-1)
            assert got["copy_attention"][j] == pytest.approx(probs[:, pos].tolist(), abs=1e-4)
        ok, nll, n = recalled(model, item)
        assert sum(got["nll"]) == pytest.approx(nll, rel=1e-4) and len(got["tokens"]) == n
        assert ok == (got["predicted"] == got["tokens"])
    assert result["tokens"] == sum(len(it["tokens"]) for it in result["items"])
    assert 0 <= result["attended_but_wrong"] <= result["attended"] <= result["tokens"]
    assert answers_markdown(result).count("\n") == len(items) + 3


@pytest.mark.heavy
def test_linear_readout_names_unseen_tokens_only_when_the_features_carry_them():
    from training.studies.probe import fit_readout, readout_accuracy

    g = torch.Generator().manual_seed(0)
    vocab, width = 97, 24
    unembed = 3 * torch.nn.functional.normalize(torch.randn(vocab, width, generator=g), dim=1)  # each row its own best
    y = torch.randint(vocab, (3000,), generator=g)
    fit_type = torch.arange(vocab) % 3 != 0  # a third of the token types are never fit on
    fit, unseen = fit_type[y], ~fit_type[y]
    carried = unembed[y] @ torch.randn(width, width, generator=g)  # identity in a rotated, mixed basis
    noise = torch.randn(len(y), width, generator=g)  # nothing about the token
    for x, lo, hi in ((carried, 0.9, 1.0), (noise, 0.0, 0.1)):
        x = (x - x[fit].mean(0)) / x[fit].std(0)
        w = fit_readout(x[fit], y[fit], unembed, steps=300, batch=256, lr=1e-2)
        acc = readout_accuracy(w, x[unseen], y[unseen], unembed)
        assert acc["tokens"] == int(unseen.sum()) and lo <= acc["top1"] <= hi, acc


def test_value_probe_reads_every_kv_head_of_the_layer():
    from training.studies.probe import value_readout, values_markdown

    backbone = tiny_llama()
    ids = torch.as_tensor([[backbone.tokenizer.convert_tokens_to_ids(c) for c in TEXT[i:i + 32]] for i in (0, 40)])
    result = value_readout(backbone, ids, layer=1, steps=20, log=lambda m: None)
    assert [r["values"] for r in result["rows"]] == ["KV head 0", "KV head 1", "all KV heads"]
    assert [r["dims"] for r in result["rows"]] == [8, 8, 16]
    for r in result["rows"]:
        assert r["fit"]["tokens"] + r["unseen"]["tokens"] == ids.numel() - 2  # every token but the segments' first
        assert all(0.0 <= r[k][t] <= 1.0 for k in ("fit", "unseen", "unseen_words") for t in ("top1", "top5"))
    assert values_markdown(result).count("\n") == 4
