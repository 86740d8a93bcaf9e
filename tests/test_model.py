"""LongMemModel and the baselines on tiny configs: reproduction at init, memory causality, cached decoding,
the gate, checkpoints."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import random_ids, small_config, tiny_backbone, tiny_llama

from longmem.memory.memory import Memory
from longmem.model import sidenet
from longmem.model.baselines import BackboneLM, MemTRM
from longmem.model.lm import Sampling, Window
from longmem.model.longmem import CheckpointError, LongMemConfig, LongMemModel
from longmem.model.sidenet import MemoryAugmentedLayer, dense_memory_attention, local_attention, memory_attention


def test_shapes_and_layout(model):
    spec = model.backbone.spec
    assert len(model.sidenet.layers) == spec.n_layers // 2
    assert isinstance(model.sidenet.layers[model.config.memory_layer], MemoryAugmentedLayer)
    mem = model.new_memory(batch_size=2)
    out = model(random_ids(16, batch=2), mem, labels=random_ids(16, batch=2))
    assert out.logits.shape == (2, 16, spec.vocab_size)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert mem.sizes() == [16, 16]


def test_default_depths():
    """24-layer backbone (the paper's GPT-2*): memory in side layer 9 (1-based); keys from backbone layer 16 (0-based),
    whose input H_llm[16] the memory layer reads at init (the paper: layer 18, 1-based; see training.studies.probe)."""
    cfg = LongMemConfig(segment_len=256).resolved(tiny_llama(n_layers=24).spec)
    assert (cfg.memory_layer, cfg.cached_layer) == (8, 16)
    spec = tiny_llama(n_layers=24).spec
    mem = lambda **kw: LongMemConfig(segment_len=256, **kw).resolved(spec).memory_layer  # noqa: E731
    assert mem(cached_layer=14) == mem(cached_layer=15) == 7  # the side layer whose input lines up with it
    assert mem(cached_layer=23) == 11  # the last side layer at most
    assert mem(cached_layer=14, memory_layer=3) == 3  # an explicit memory layer wins


def test_untrained_sidenet_reproduces_backbone(backbone):
    ids = random_ids(16)
    model = LongMemModel(backbone, small_config())
    mem = model.new_memory()
    model(random_ids(16, seed=1), mem)  # memory is not empty, yet closed branches ignore it
    ref = backbone.model(ids).logits
    torch.testing.assert_close(model(ids, mem).logits, ref, atol=1e-5, rtol=1e-5)


def test_paper_plain_init_does_not_reproduce_backbone():
    bb = tiny_llama()
    ids = random_ids(16)
    plain = LongMemModel(bb, small_config(side_init="plain"))
    assert (plain(ids).logits - bb.model(ids).logits).abs().max() > 1e-2


def test_odd_depth_residuals_reach_the_top():
    bb = tiny_llama(n_layers=5)  # 5 // 2 = 2 side layers; the last residual spans backbone layers 3..5
    model = LongMemModel(bb, small_config())
    assert model.sidenet.boundaries == [0, 2, 5]
    ids = random_ids(8)
    torch.testing.assert_close(model(ids).logits, bb.model(ids).logits, atol=1e-5, rtol=1e-5)


def test_gate_at_init_mixes_fifty_fifty():
    bb = tiny_llama()
    model = LongMemModel(bb, small_config())
    layer = model.sidenet.layers[model.config.memory_layer]
    assert torch.all(torch.sigmoid(layer.gate) == 0.5)
    mem = model.new_memory()
    model.memorize(random_ids(32, seed=3), mem)
    q, k, v = torch.randn(1, 6, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    q_raw = torch.randn(1, 6, 5, 8)
    a = local_attention(q, k, v)
    r = mem.search(q_raw, layer.topk // mem.chunk_size)
    m, found = memory_attention(q_raw, r.keys, r.values, r.mask)
    assert found.all()
    mixed = layer._attend(q, k, v, q_raw, mem, None)
    torch.testing.assert_close(mixed, 0.5 * a + 0.5 * m)
    assert not torch.allclose(mixed, a)


def test_masked_dense_memory_attention_equals_the_gathered_one():
    g = torch.Generator().manual_seed(0)
    mem = Memory(2, 8, chunk_size=2, capacity=None, batch_size=2, dtype=torch.float32)
    mem.add(torch.randn(2, 2, 20, 8, generator=g), torch.randn(2, 2, 20, 8, generator=g))
    mem.clear([1])  # row 1 holds nothing: its queries find nothing and give zeros, on both paths
    q = torch.randn(2, 6, 5, 8, generator=g, requires_grad=True)
    r, s = mem.search(q, 3), mem.select(q, 3)
    gathered, found_g = memory_attention(q, r.keys, r.values, r.mask)
    dense, found_d = dense_memory_attention(q, s.keys, s.values, s.mask)
    torch.testing.assert_close(dense, gathered)
    assert torch.equal(found_d, found_g) and found_d[0].all() and not found_d[1].any()
    assert dense[1].abs().sum() == 0
    grad_g, = torch.autograd.grad(gathered.square().sum(), q)
    grad_d, = torch.autograd.grad(dense.square().sum(), q)
    torch.testing.assert_close(grad_d, grad_g)  # training reads memory through the query too


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_memory_layer_gives_the_same_output_on_either_path(family, monkeypatch):
    bb = tiny_backbone(family)
    model = LongMemModel(bb, small_config())
    for layer in model.sidenet.layers:  # open the ReZero branches so the memory layer's output reaches the logits
        layer.alpha_attn.data.fill_(0.7)
    mem = model.new_memory()
    model.memorize(random_ids(48, seed=3), mem)
    ids = random_ids(16, seed=4)
    monkeypatch.setattr(sidenet, "DENSE_MEMORY_RATIO", 0)  # always gather
    gathered = model(ids, mem, update_memory=False).logits
    monkeypatch.setattr(sidenet, "DENSE_MEMORY_RATIO", 10 ** 9)  # always masked dense
    dense = model(ids, mem, update_memory=False).logits
    torch.testing.assert_close(dense, gathered, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model(ids, model.new_memory(), update_memory=False).logits, dense)  # memory matters


@pytest.mark.parametrize("kind", ["longmem", "memtrm"])
def test_no_token_retrieves_its_own_or_a_later_segment(kind):
    bb = tiny_llama()
    model = LongMemModel(bb, small_config()) if kind == "longmem" else \
        MemTRM(bb, chunk_size=2, topk=8, capacity=None, segment_len=16)
    mem = model.new_memory()
    ids = random_ids(64)
    for s in range(0, 64, 16):
        out = model.step(ids[:, s:s + 16], mem)
        if s == 0:
            assert not (out.chunk_ids[0] >= 0).any()  # nothing in memory before the first segment
        else:
            hits = out.chunk_ids[0][out.chunk_ids[0] >= 0]
            assert hits.numel() > 0 and hits.max() < s // 2  # chunks of chunk_size=2 tokens, all before this segment
        mem.add(out.k, out.v, tokens=ids[:, s:s + 16])
    # stored chunks hold exactly the text in order
    assert torch.equal(mem.rows[0].tokens[:32].flatten(), ids[0])


@pytest.mark.parametrize("kind", ["longmem", "backbone", "memtrm"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_cached_decoding_equals_uncached(kind, family):
    bb = tiny_backbone(family)
    if kind == "longmem":
        model = LongMemModel(bb, small_config())
        for layer in model.sidenet.layers:  # open the branches so the SideNet's own cache matters
            layer.alpha_attn.data.fill_(0.7)
            layer.alpha_mlp.data.fill_(0.7)
    elif kind == "backbone":
        model = BackboneLM(bb, 16)
    else:
        model = MemTRM(bb, cached_layer=1, chunk_size=2, topk=8, capacity=None, segment_len=16)
    mem = model.new_memory() if model.uses_memory else None
    if mem is not None:
        model.memorize(random_ids(32, seed=5), mem)
    ids = random_ids(12)
    with torch.no_grad():
        full = model.step(ids, mem).hidden
        window = Window()
        parts = [model.step(ids[:, :7], mem, window).hidden]
        parts += [model.step(ids[:, t:t + 1], mem, window).hidden for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-4, rtol=1e-4)
    assert window.length == 12


def test_generation_moves_old_tokens_into_memory(llama):
    model = LongMemModel(llama, small_config())
    mem = model.new_memory()
    prompt = random_ids(20)  # longer than the 16-token window: its head goes to memory first
    out = list(model.generate(prompt, mem, Sampling(max_new_tokens=30, temperature=0)))
    assert len(out) == 30
    stored = mem.rows[0].tokens[: mem.rows[0].n].flatten()
    assert torch.equal(stored[:12], prompt[0, :12])  # head of the prompt (20 - 8 kept) in order
    assert len(mem) > 12  # and generated context moved in as the window filled


def test_greedy_generation_with_empty_memory_matches_backbone(llama):
    model = LongMemModel(llama, small_config())
    base = BackboneLM(llama, 16)
    prompt = random_ids(6)
    s = Sampling(max_new_tokens=12, temperature=0)
    assert list(model.generate(prompt, model.new_memory(), s)) == list(base.generate(prompt, None, s))


def test_prompt_tokens_before_search_from_read_the_window_alone(llama, searched_queries):
    model = LongMemModel(llama, small_config())
    for layer in model.sidenet.layers:  # open the branches so that memory reaches the logits
        layer.alpha_attn.data.fill_(0.7)
    mem = model.new_memory()
    model.memorize(random_ids(48, seed=3), mem)
    prompt = random_ids(12, seed=4)
    with torch.no_grad():
        alone, searching = (model.backbone.logits(model.step(prompt, m).hidden[:, -1:])[0, -1] for m in (None, mem))
    assert not torch.allclose(alone, searching)  # memory matters here
    searched = searched_queries
    s = Sampling(max_new_tokens=3, temperature=0)
    for start, first in [(0, searching), (5, None), (12, alone), (40, alone)]:
        searched.clear()
        out = list(model.generate(prompt, mem, s, search_from=start))
        assert sum(searched) == max(0, 12 - start) + 2, start  # the prompt's searching tokens, then each new token
        #                                                         but the last, which no token comes after
        if first is not None:
            assert out[0] == int(first.argmax()), start
    assert list(model.generate(prompt, mem, s, search_from=0)) == list(model.generate(prompt, mem, s))
    with pytest.raises(ValueError, match="search_from"):
        list(model.generate(prompt, mem, s, search_from=-1))


def test_an_answer_ends_where_the_frozen_backbone_would_end_it(llama):
    model = LongMemModel(llama, small_config())
    for layer in model.sidenet.layers:  # open the branches: the SideNet's predictions differ from the backbone's
        layer.alpha_attn.data.fill_(0.7)
    prompt, n = random_ids(6, seed=1), 8
    greedy = Sampling(max_new_tokens=n, temperature=0)
    own = list(model.generate(prompt, model.new_memory(), greedy))
    with torch.no_grad():  # the backbone's own next token after each prefix of LongMem's answer
        step = model.step(torch.cat([prompt, torch.tensor([own])], dim=1), None)
        theirs = model.backbone.logits(step.reference)[0, prompt.shape[1] - 1:].argmax(-1).tolist()
        assert model.backbone.logits(step.hidden)[0, prompt.shape[1] - 1:-1].argmax(-1).tolist() == own
    assert theirs[0] != own[0]  # on this prompt the backbone would start otherwise
    unused = next(t for t in range(100) if t not in own + theirs)
    for stop in (theirs[0], own[0], unused):
        expected = []
        for mine, backbone_next in zip(own, theirs):  # the first stop id either model would emit ends the answer
            if backbone_next == stop:
                expected.append(backbone_next)
                break
            expected.append(mine)
            if mine == stop:
                break
        s = Sampling(max_new_tokens=n, temperature=0, stop_ids=(stop,), backbone_stops=True)
        assert list(model.generate(prompt, model.new_memory(), s)) == expected, stop
        plain = list(model.generate(prompt, model.new_memory(), replace(s, backbone_stops=False)))
        assert plain == (own[: own.index(stop) + 1] if stop in own else own), stop
    s = Sampling(max_new_tokens=n, temperature=0, stop_ids=(theirs[0],), backbone_stops=True)
    assert list(model.generate(prompt, model.new_memory(), s)) == [theirs[0]]  # ended by the backbone alone
    assert list(model.generate(prompt, None, replace(greedy, backbone_stops=True))) == own  # no stop ids: no stop
    base = BackboneLM(llama, 16)  # a model with no reference beside it: the rule changes nothing
    assert list(base.generate(prompt, None, s)) == list(base.generate(prompt, None, replace(s, backbone_stops=False)))


def test_sampling_is_reproducible_with_a_seed(llama):
    model = BackboneLM(llama, 16)
    s = Sampling(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    assert list(model.generate(random_ids(4), None, s)) == list(model.generate(random_ids(4), None, s))


def test_score_and_nll_agree(llama):
    model = LongMemModel(llama, small_config())
    ids = random_ids(12)
    nll, n = model.nll(ids)
    assert n == 11
    assert model.score(ids[:, :1], ids[:, 1:]) == pytest.approx(-nll, rel=1e-4)


def test_nll_over_segments_counts_every_token(llama):
    model = LongMemModel(llama, small_config())
    nll, n = model.nll(random_ids(40), model.new_memory())
    assert n == 39 and nll > 0


def test_training_signal_reaches_scales_and_gate(llama):
    model = LongMemModel(llama, small_config())
    mem = model.new_memory()
    model.memorize(random_ids(32, seed=2), mem)
    ids = random_ids(16)
    model(ids, mem, labels=ids).loss.backward()
    layer = model.sidenet.layers[model.config.memory_layer]
    assert layer.alpha_attn.grad.abs() > 0 and layer.alpha_mlp.grad.abs() > 0
    assert all(p.grad is None for p in llama.parameters())


def test_memtrm_trains_only_its_memory_layer_and_starts_as_backbone(llama):
    model = MemTRM(llama, cached_layer=2, chunk_size=2, topk=8, capacity=None, segment_len=16)
    ids = random_ids(16)
    torch.testing.assert_close(model(ids, model.new_memory()).logits, llama.model(ids).logits,
                               atol=1e-5, rtol=1e-5)  # empty memory: local attention only
    mem = model.new_memory()
    model.memorize(random_ids(32, seed=4), mem)
    model(ids, mem, labels=ids).loss.backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("memory_layer.") for n in trainable)
    assert model.memory_layer.gate.grad is not None


def test_save_load_round_trip_is_bit_identical(tmp_path, llama):
    model = LongMemModel(llama, small_config())
    with torch.no_grad():
        for p in model.sidenet.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    path = model.save(tmp_path / "ckpt", provenance={"note": "test"})
    again = LongMemModel.load(path, backbone=llama)
    a, b = model.trainable_state(), again.trainable_state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    meta = json.loads((path / "config.json").read_text())
    assert meta["backbone"]["sha256"] == llama.fingerprint() and meta["provenance"]["note"] == "test"
    ids = random_ids(16)
    assert torch.equal(model(ids).logits, again(ids).logits)


def test_a_checkpoint_saved_with_the_old_chunk_size_name_loads(tmp_path, llama):
    """Checkpoints written before ``csz`` was renamed ``chunk_size`` load with the same settings."""
    model = LongMemModel(llama, small_config(chunk_size=2, topk=8))
    path = model.save(tmp_path / "ckpt")
    meta = json.loads((path / "config.json").read_text())
    meta["config"]["csz"] = meta["config"].pop("chunk_size")
    (path / "config.json").write_text(json.dumps(meta))
    again = LongMemModel.load(path, backbone=llama)
    assert again.chunk_size == again.config.chunk_size == 2 and again.config.topk == 8


def test_load_refuses_another_backbone(tmp_path, llama):
    path = LongMemModel(llama, small_config()).save(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="trained for backbone"):
        LongMemModel.load(path, backbone=tiny_llama(seed=1))


def test_load_reports_missing_or_broken_checkpoint(tmp_path, llama):
    with pytest.raises(CheckpointError, match="not a LongMem checkpoint"):
        LongMemModel.load(tmp_path, backbone=llama)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        LongMemModel.load(tmp_path, backbone=llama)


def test_config_errors_name_the_problem(llama):
    with pytest.raises(ValueError, match="multiple of the chunk size"):
        LongMemModel(llama, small_config(topk=7))
    with pytest.raises(ValueError, match="exceeds the backbone"):
        LongMemModel(llama, small_config(segment_len=100_000))
    with pytest.raises(ValueError, match="exceeds segment_len"):
        LongMemModel(llama, small_config())(random_ids(17))


def test_batched_memorize_equals_segment_by_segment(llama):
    model = LongMemModel(llama, small_config())
    ids = random_ids(16 * 5 + 6)
    a, b = model.new_memory(), model.new_memory()
    model.memorize(ids, a, batch_segments=4)
    model.memorize(ids, b, batch_segments=1)
    ra, rb = a.rows[0], b.rows[0]
    assert ra.n == rb.n == 43
    assert torch.equal(ra.tokens[:43], rb.tokens[:43]) and torch.equal(ra.tokens[:43].flatten(), ids[0])
    torch.testing.assert_close(ra.k[:, :43], rb.k[:, :43])
    torch.testing.assert_close(ra.v[:, :43], rb.v[:, :43])
    # every segment was encoded from position 0: its first token is an attention sink, and only it
    want = torch.zeros(43 * 2, dtype=torch.bool)
    want[::16] = True
    assert torch.equal(ra.starts[:43].flatten(), want) and torch.equal(rb.starts[:43].flatten(), want)


def test_forward_and_generation_mark_sinks(llama):
    model = LongMemModel(llama, small_config())
    mem = model.new_memory(batch_size=2)
    model(random_ids(16, batch=2), mem)
    model(random_ids(16, batch=2, seed=1), mem)
    for row in mem.rows:
        assert row.starts[: row.n].flatten().nonzero().flatten().tolist() == [0, 16]
    mem = model.new_memory()
    list(model.generate(random_ids(20), mem, Sampling(max_new_tokens=30, temperature=0)))
    row = mem.rows[0]
    first = row.starts[: row.n].flatten().nonzero().flatten().tolist()
    assert first[0] == 0 and len(first) >= 2  # the prompt's head, then each window moved into memory


def test_blockwise_retrieval_equals_one_block(llama, monkeypatch):
    import longmem.model.sidenet as sidenet

    model = LongMemModel(llama, small_config())
    for layer in model.sidenet.layers:
        layer.alpha_attn.data.fill_(0.5)
    mem = model.new_memory()
    model.memorize(random_ids(48, seed=9), mem)
    ids = random_ids(16)
    whole = model.step(ids, mem)
    monkeypatch.setattr(sidenet, "RETRIEVAL_BLOCK", 5)
    blocks = model.step(ids, mem)
    torch.testing.assert_close(blocks.hidden, whole.hidden)
    assert torch.equal(blocks.chunk_ids[0], whole.chunk_ids[0])


def test_from_config_uses_the_shipped_checkpoint_unless_untrained(tmp_path, llama, monkeypatch):
    import longmem.model.longmem as lm_model

    llama.model.save_pretrained(tmp_path / "bb")
    llama.tokenizer.save_pretrained(tmp_path / "bb")
    trained = LongMemModel(llama, small_config(backbone=str(tmp_path / "bb"), train_scope="compact", lora_rank=2))
    with torch.no_grad():
        for p in trained.trainable_state().values():
            p.add_(0.01)  # "trained" weights, different from the init
    trained.save(tmp_path / "shipped")
    monkeypatch.setattr(lm_model, "SHIPPED", {str(tmp_path / "bb"): "shipped"})
    monkeypatch.setattr(lm_model, "SHIPPED_DIR", tmp_path)
    cfg = small_config(backbone=str(tmp_path / "bb"), segment_len=48)
    model = LongMemModel.from_config(cfg)
    assert model.config.train_scope == "compact" and model.segment_len == 48  # structure shipped, runtime asked
    got, want = model.trainable_state(), trained.trainable_state()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    plain = LongMemModel.from_config(cfg, pretrained=False)
    assert plain.config.train_scope == "full" and plain.sidenet.layers[0].alpha_attn.detach().item() == 0.0
    # K is what the checkpoint was trained with, unless the config asks for another
    LongMemModel(llama, small_config(backbone=str(tmp_path / "bb"), topk=4)).save(tmp_path / "shipped")
    assert LongMemModel.from_config(small_config(backbone=str(tmp_path / "bb"), topk=None)).config.topk == 4
    assert LongMemModel.from_config(small_config(backbone=str(tmp_path / "bb"), topk=2)).config.topk == 2
    assert LongMemModel.from_config(small_config(backbone=str(tmp_path / "bb"), topk=None),
                                    pretrained=False).config.topk == 64


def test_an_int8_memtrm_checkpoint_loads_back_within_a_row_scale(llama, tmp_path):
    """``MemTRM.save(int8=True)`` (how the shipped baseline fits the repository) stores each matrix as int8 rows
    with a scale: it loads back within half a quantization step of every weight, vectors exactly."""
    from longmem.model.baselines import SCALE, MemTRM, int8_rows

    m = MemTRM(llama, cached_layer=2, chunk_size=2, topk=8, capacity=64, segment_len=16)
    with torch.no_grad():
        for p in m.memory_layer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stored = int8_rows(m.trainable_state())
    assert any(k.endswith(SCALE) for k in stored) and all(t.dtype == torch.int8 for k, t in stored.items()
                                                          if k + SCALE in stored)
    back = MemTRM.load(m.save(tmp_path / "int8", int8=True), backbone=llama).trainable_state()
    for name, w in m.trainable_state().items():
        if w.dim() == 2:
            step = w.abs().amax(dim=1, keepdim=True) / 127
            assert ((back[name] - w).abs() <= 0.5 * step + 1e-7).all(), name
        else:
            assert torch.equal(back[name], w), name
