"""Adaptation training on a tiny llama: loss goes down, resume is exact, the backbone never changes, DDP agrees."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import child_env
from tiny import tiny_model

from training.data import Document
from training.train import TrainConfig, Trainer, learning_rate


def documents(n: int = 4, length: int = 160) -> list[Document]:
    """Learnable streams: each document repeats its own short pattern of token ids."""
    out = []
    for k in range(n):
        pattern = np.arange(3 + 5 * k, 3 + 5 * k + 7 + k) % 90 + 3
        out.append(Document(f"doc{k}", np.resize(pattern, length).astype(np.int32)))
    return out


def config(tmp_path, **kw) -> TrainConfig:
    base = dict(out=str(tmp_path / "run"), batch_size=2, segment_len=16, memory_tokens=64, steps=8, lr=3e-3,
                eval_every=0, save_every=0, amp="none", train_scope="full")
    base.update(kw)
    return TrainConfig(**base)


def model(scope="full"):
    return tiny_model("llama", segment_len=16, capacity=64, train_scope=scope, lora_rank=4)


def test_polynomial_schedule():
    cfg = TrainConfig(lr=1.0, end_lr=0.0, steps=10, warmup_steps=2)
    assert [round(learning_rate(cfg, s), 3) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]


def test_a_few_steps_reduce_the_loss(tmp_path):
    hist = Trainer(config(tmp_path, steps=40, lr=1e-2), documents(), model=model()).fit(progress=False)
    first, last = np.mean([h["loss"] for h in hist[:5]]), np.mean([h["loss"] for h in hist[-5:]])
    assert last < 0.9 * first, (first, last)
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 40


def test_loss_recomputed_in_backward_equals_the_loss_kept(monkeypatch):
    import training.train as train

    m = model()
    hidden = torch.randn(2, 9, m.backbone.spec.hidden)
    targets = torch.randint(0, m.backbone.spec.vocab_size, (2, 9))
    monkeypatch.setattr(train, "LOSS_CHUNK", 4)  # several chunks, the last one short
    results = []
    for keep in (1 << 30, 0):  # logits kept for backward, then recomputed in it
        monkeypatch.setattr(train, "LOSS_KEEP_BYTES", keep)
        h = hidden.clone().requires_grad_(True)
        nll = train.token_nll(m, h, targets)
        nll.sum().backward()
        results.append((nll.detach(), h.grad))
    want = torch.nn.functional.cross_entropy(m.backbone.logits(hidden).flatten(0, 1), targets.flatten(),
                                             reduction="none").view(2, 9)
    torch.testing.assert_close(results[0][0], want)
    torch.testing.assert_close(results[1][0], want)
    torch.testing.assert_close(results[0][1], results[1][1])


def test_backbone_weights_do_not_change(tmp_path):
    m = model()
    before = {k: v.clone() for k, v in m.backbone.model.state_dict().items()}
    Trainer(config(tmp_path, steps=4, lr=1e-2), documents(), model=m).fit(progress=False)
    after = m.backbone.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(p.abs().sum() > 0 for n, p in m.sidenet.named_parameters() if "alpha" in n)  # the SideNet moved


@pytest.mark.parametrize("scope", ["full", "compact"])
@pytest.mark.heavy
def test_resume_equals_an_uninterrupted_run(tmp_path, scope):
    docs = documents()
    whole = Trainer(config(tmp_path / "a", train_scope=scope), docs, model=model(scope))
    whole.fit(progress=False)
    part = Trainer(config(tmp_path / "b", train_scope=scope), docs, model=model(scope))
    part.fit(progress=False, until=5)  # steps 0-4; memory holds the past of every row
    resumed = Trainer(config(tmp_path / "b", train_scope=scope), docs, model=model(scope), resume=True)
    assert resumed.step == 5
    resumed.fit(progress=False)
    a, b = whole.model.trainable_state(), resumed.model.trainable_state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if scope == "compact":
        ckpt = sum(f.stat().st_size for f in (tmp_path / "b" / "run" / "checkpoint").glob("sidenet.safetensors"))
        full = sum(p.numel() * 4 for p in resumed.model.sidenet.parameters())
        assert ckpt < 0.8 * full  # only what training changes is saved


def test_answer_tokens_weigh_more_in_the_objective(tmp_path):
    from training.train import SegmentLoss

    m = model()
    ids = torch.as_tensor(documents()[1].ids[:32], dtype=torch.long).view(2, 16)
    answers = torch.zeros_like(ids, dtype=torch.bool)
    answers[0, 5:8] = answers[1, 12] = True
    objectives = {}
    for w in (1.0, 10.0):
        objectives[w], nll, _ = SegmentLoss(m, answer_weight=w)(ids, m.new_memory(batch_size=2), answers)
    assert nll.shape == (2, 15) and not nll.requires_grad
    assert objectives[1.0].item() == pytest.approx(nll.mean().item(), rel=1e-5)
    # targets are the next tokens: the answer mark of token t+1 weighs the prediction made at t
    extra = 9.0 * nll[answers[:, 1:]].sum() / nll.numel()
    assert objectives[10.0].item() == pytest.approx((objectives[1.0] + extra).item(), rel=1e-5)
    docs = documents()
    for d in docs:  # docs 1-3 hold digit characters (numbers' answer tokens), every doc other characters
        d.answers = np.arange(len(d.ids)) % 2 == 0
    hist = Trainer(config(tmp_path, steps=3, answer_weight=5.0), docs, model=m).fit(progress=False)
    marked = [h for h in hist if "answer_nll" in h]
    assert marked and all(h["answer_tokens"] > 0 and h["answer_nll"] > 0 for h in marked)
    for h in marked:  # split by kind (digits and blanks: numbers), the parts make up the whole
        parts = [(h[f"answer_nll_{k}"], h[f"answer_tokens_{k}"]) for k in ("numbers", "names")
                 if f"answer_nll_{k}" in h]
        assert sum(n for _, n in parts) == h["answer_tokens"]
        assert sum(x * n for x, n in parts) / h["answer_tokens"] == pytest.approx(h["answer_nll"], rel=1e-5)
    assert any("answer_nll_numbers" in h and "answer_nll_names" in h for h in marked)
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0  # with the answers' panel


def test_number_tokens_are_digits_and_blanks():
    from tiny import char_tokenizer

    from training.train import number_tokens

    tok = char_tokenizer()
    numbers = number_tokens(tok)
    assert numbers.shape == (len(tok),)
    assert sorted(tok.decode([i]) for i in numbers.nonzero().flatten().tolist()) == sorted("0123456789 \n")


@pytest.mark.heavy
def test_scales_get_their_own_learning_rate(tmp_path):
    from training.train import param_groups

    m = model()
    [plain] = param_groups(m, config(tmp_path))
    weights, scales = param_groups(m, config(tmp_path, scale_lr=20.0))
    assert len(plain["params"]) == len(weights["params"]) + len(scales["params"])
    names = {id(p): n for n, p in m.sidenet.named_parameters()}
    assert sorted({names[id(p)].rsplit(".", 1)[-1] for p in scales["params"]}) == ["alpha_attn", "alpha_mlp", "gate"]
    assert (scales["lr_mult"], scales["weight_decay"]) == (20.0, 0.0)
    # one step at the same base LR moves every scale ~20x further (Adam's first step is ~lr * sign)
    moved = {}
    for mult in (1.0, 20.0):
        t = Trainer(config(tmp_path / str(mult), steps=1, lr=1e-3, scale_lr=mult), documents(), model=model())
        before = t.model.sidenet.layers[0].alpha_attn.detach().clone()
        t.fit(progress=False)
        moved[mult] = (t.model.sidenet.layers[0].alpha_attn.detach() - before).abs().item()
    assert moved[20.0] == pytest.approx(20 * moved[1.0], rel=0.05)
    # ... and resuming such a run is still exact
    whole = Trainer(config(tmp_path / "w", scale_lr=20.0), documents(), model=model())
    whole.fit(progress=False)
    Trainer(config(tmp_path / "p", scale_lr=20.0), documents(), model=model()).fit(progress=False, until=3)
    resumed = Trainer(config(tmp_path / "p", scale_lr=20.0), documents(), model=model(), resume=True)
    resumed.fit(progress=False)
    a, b = whole.model.trainable_state(), resumed.model.trainable_state()
    assert all(torch.equal(a[k], b[k]) for k in a)


DDP_WORKER = """
import sys
from test_training import config, documents, model
from pathlib import Path
from training.train import Trainer
Trainer(config(Path(sys.argv[1]), batch_size=1, steps=3), documents(), model=model()).fit(progress=False)
"""


@pytest.mark.heavy
def test_ddp_with_two_gloo_processes_matches_one_process(tmp_path):
    single = Trainer(config(tmp_path / "single", steps=3), documents(), model=model())
    single.fit(progress=False)
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER)
    env = child_env(OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(29500 + os.getpid() % 1000), str(script), str(tmp_path / "ddp")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from longmem.model.longmem import LongMemModel

    ddp = LongMemModel.load(tmp_path / "ddp" / "run" / "checkpoint", model().backbone).trainable_state()
    ref = single.model.trainable_state()
    assert ddp.keys() == ref.keys()
    for k in ref:
        assert torch.allclose(ddp[k], ref[k], atol=1e-5), k
    assert any(not torch.equal(ref[k], model().trainable_state()[k]) for k in ref)  # training changed something


def recall_setup():
    """A tiny llama with a 64-token window, 3 recall items 64+ character tokens back, and their filler text."""
    from tiny import char_tokenizer

    from longmem.eval.datasets.recall import recall_documents

    tok = char_tokenizer()
    text = "The boat drifted past the mill. Nobody in the village had ever seen the sea. " * 40
    filler = np.asarray(tok(text, add_special_tokens=False).input_ids, dtype=np.int32)
    items = recall_documents(tok, [filler], n=3, distance=64, total=320, seed=0)
    return tiny_model("llama", segment_len=64, capacity=None), items, tok, filler


def test_evaluation_table_on_a_tiny_model():
    from longmem.eval.datasets.recall import recall_documents
    from training.evaluate import evaluate, markdown

    m, items, tok, filler = recall_setup()
    in_window = recall_documents(tok, [filler], n=2, distance=30, total=260, seed=0)  # char tokens: long
    result = evaluate(m, [Document("book", filler[:200])], items, long_context=128, log=lambda _: None,
                      in_window=in_window)
    assert set(result["perplexity"]) == {"longmem", "longmem_no_memory", "backbone_local", "backbone_long"}
    assert result["recall"]["longmem"]["items"] == 3 and 0 <= result["recall"]["longmem"]["accuracy"] <= 1
    # untrained: memory changes nothing, so the answer tokens are exactly as (un)likely as for the 1k backbone
    assert result["recall"]["longmem"]["answer_nll"] == pytest.approx(result["recall"]["backbone_local"]["answer_nll"],
                                                                    rel=1e-4)
    assert result["recall"]["longmem"]["answer_nll"] > 0
    # the untrained SideNet reproduces the backbone: same perplexity as the backbone with the same local window
    assert result["ppl_ratio_vs_local"] == pytest.approx(1.0, abs=1e-4)
    assert result["recall"]["backbone_in_window"]["items"] == 2
    rec = result["recall"]["longmem"]  # per item and per kind, adding up to the whole
    assert len(rec["recalled"]) == 3 and rec["accuracy"] == pytest.approx(np.mean(rec["recalled"]))
    assert sum(v["items"] for v in rec["by_kind"].values()) == 3 and set(rec["by_kind"]) <= {"number", "name"}
    assert all(f"{k}s " in markdown(result, 128, 64) for k in rec["by_kind"])
    table = markdown(result, 128, 64)
    assert "LongMem (1k local + memory)" in table and "fact inside its 1k window" in table
    recall_only = evaluate(m, [], items, long_context=128, log=lambda _: None)  # --tokens 0
    assert recall_only["perplexity"] == {} and "ppl_ratio_vs_local" not in recall_only
    assert recall_only["recall"]["longmem"] == result["recall"]["longmem"]
    assert "perplexity:" not in markdown(recall_only, 128, 64) and "| LongMem (1k local + memory) |  |" in markdown(
        recall_only, 128, 64)


def test_recall_sweep_at_the_model_own_setting_equals_the_evaluation():
    from training.evaluate import evaluate, recall_sweep, sweep_markdown

    m, items, _, _ = recall_setup()
    with torch.no_grad():  # side layers that add their attention's output (rezero starts them at 0)
        for layer in m.sidenet.layers:
            layer.alpha_attn.fill_(1.0)
    own = f"{m.chunk_size}:{m.config.topk}"
    settings = [(m.chunk_size, m.config.topk), (1, m.config.topk), (m.chunk_size, 4 * m.config.topk)]
    sweep = recall_sweep(m, items, settings, log=lambda _: None)
    want = evaluate(m, [], items, long_context=128, log=lambda _: None)["recall"]["longmem"]
    assert sweep[own]["recalled"] == want["recalled"]
    assert sweep[own]["answer_nll"] == pytest.approx(want["answer_nll"], rel=1e-6)
    finer = sweep[f"1:{m.config.topk}"]["answer_nll"]  # chunks of 1 retrieve other tokens: another answer NLL
    assert finer != pytest.approx(want["answer_nll"], rel=1e-6)
    assert set(sweep) == {own, f"1:{m.config.topk}", f"{m.chunk_size}:{4 * m.config.topk}"}
    assert f"| {m.chunk_size} | {m.config.topk} | {m.config.topk // m.chunk_size} | " in sweep_markdown(sweep)
    with pytest.raises(ValueError, match="must divide"):
        recall_sweep(m, items, [(3, 9)])


def test_ship_writes_a_small_checkpoint_with_a_model_card(tmp_path):
    from longmem.model.longmem import LongMemModel
    from training.ship import ship

    m = model("compact")
    Trainer(config(tmp_path, steps=3, train_scope="compact"), documents(), model=m).fit(progress=False)
    out = ship(tmp_path / "run", None, name="tiny", dest_root=tmp_path / "shipped", hardware="test CPU")
    assert sorted(f.name for f in out.iterdir()) == ["MODEL_CARD.md", "config.json", "sidenet.safetensors",
                                                     "training.json"]
    card = (out / "MODEL_CARD.md").read_text()
    assert "steps: 3" in card and "tokens seen: 96" in card and "test CPU" in card and "4 documents" in card
    loaded = LongMemModel.load(out, m.backbone).trainable_state()
    assert all(torch.equal(loaded[k], v) for k, v in m.trainable_state().items())
    half = ship(tmp_path / "run", None, name="tiny-bf16", dest_root=tmp_path / "shipped", dtype="bfloat16")
    size = lambda d: (d / "sidenet.safetensors").stat().st_size  # noqa: E731
    assert size(half) < 0.6 * size(out)
    loaded = LongMemModel.load(half, m.backbone).trainable_state()
    assert all(torch.equal(loaded[k], v.bfloat16().float()) for k, v in m.trainable_state().items())


def test_ship_names_the_synthetic_documents_a_run_trained_on(tmp_path):
    from training.ship import ship

    docs = documents()
    docs[1].name, docs[2].name, docs[3].name = "recall-0", "quote-0", "quote-1"
    Trainer(config(tmp_path, steps=2, train_scope="compact"), docs, model=model("compact")).fit(progress=False)
    card = (ship(tmp_path / "run", None, name="tiny", dest_root=tmp_path / "shipped") / "MODEL_CARD.md").read_text()
    assert "4 documents (1 recall, 2 quote)" in card and "quote documents (book passages" in card, card
    assert "reading" not in card
    docs = documents()
    docs[1].name, docs[2].name = "recall-0", "reading-0"
    Trainer(config(tmp_path, out=str(tmp_path / "read"), steps=2, train_scope="compact"), docs,
            model=model("compact")).fit(progress=False)
    card = (ship(tmp_path / "read", None, name="r", dest_root=tmp_path / "shipped") / "MODEL_CARD.md").read_text()
    assert "4 documents (1 recall, 1 reading)" in card and "reading documents (a book in memory" in card, card
    plain = documents()  # a run without quote documents says nothing of them
    Trainer(config(tmp_path, out=str(tmp_path / "plain"), steps=2, train_scope="compact"), plain,
            model=model("compact")).fit(progress=False)
    card = (ship(tmp_path / "plain", None, name="p", dest_root=tmp_path / "shipped") / "MODEL_CARD.md").read_text()
    assert "4 documents (0 recall)" in card and "quote" not in card


def test_ship_sets_the_run_time_k_its_evaluation_used(tmp_path):
    import json

    from longmem.model.longmem import LongMemModel
    from training.evaluate import evaluate
    from training.ship import ship

    m = model("compact")
    Trainer(config(tmp_path, steps=2, train_scope="compact"), documents(), model=m).fit(progress=False)
    trained = m.config.topk
    wider = LongMemModel.load(tmp_path / "run" / "checkpoint", m.backbone, runtime={"topk": 2 * trained})
    result = evaluate(wider, documents(1, 64), [], long_context=32, log=lambda _: None)
    result["args"] = dict(books=1, tokens=64, recall=0, distance=32, seed=0, long_context=32, topk=2 * trained)
    (tmp_path / "eval.json").write_text(json.dumps(result))
    with pytest.raises(SystemExit, match=f"measured K = {2 * trained} .* would ship K = {trained}"):
        ship(tmp_path / "run", tmp_path / "eval.json", name="a", dest_root=tmp_path / "shipped")
    with pytest.raises(SystemExit, match="multiple of the chunk size"):
        ship(tmp_path / "run", None, name="b", dest_root=tmp_path / "shipped", topk=2 * trained + 1)
    out = ship(tmp_path / "run", tmp_path / "eval.json", name="c", dest_root=tmp_path / "shipped", topk=2 * trained)
    assert LongMemModel.load(out, m.backbone).config.topk == 2 * trained
    card = (out / "MODEL_CARD.md").read_text()
    assert f"K = {2 * trained} tokens per query (trained with K = {trained};" in card, card
    assert f"--seed 0 --topk {2 * trained}" in card
    loaded = LongMemModel.load(out, m.backbone).trainable_state()  # the weights are the run's, only K changed
    assert all(torch.equal(loaded[k], v) for k, v in m.trainable_state().items())


def test_ship_counts_the_runs_a_checkpoint_continues(tmp_path):
    import shutil

    from training.ship import ship

    m = model("compact")
    Trainer(config(tmp_path, steps=3, train_scope="compact"), documents(), model=m).fit(progress=False)
    record = tmp_path / "first"  # a committed run record: trainer.json beside the metrics, no checkpoint/
    record.mkdir()
    for f in ("checkpoint/trainer.json", "metrics.jsonl"):
        shutil.copy2(tmp_path / "run" / f, record)
    Trainer(config(tmp_path, out=str(tmp_path / "second"), steps=2, train_scope="compact"), documents(),
            model=m).fit(progress=False)
    out = ship(tmp_path / "second", None, name="tiny", dest_root=tmp_path / "shipped", parents=[record])
    card = (out / "MODEL_CARD.md").read_text()
    assert "steps: 5;" in card and "tokens seen: 160;" in card, card
    assert "`first` (3 steps, 96 tokens" in card and "`second` (2 steps, 64 tokens" in card
    with pytest.raises(SystemExit, match="no trainer.json"):
        ship(tmp_path / "second", None, name="x", dest_root=tmp_path / "shipped", parents=[tmp_path / "none"])


def test_held_out_evaluation_during_training(tmp_path):
    trainer = Trainer(config(tmp_path, eval_segments=2), documents(), held_out=documents(2, 96), model=model())
    ev = trainer.evaluate()
    assert ev["tokens"] == 2 * (2 * 16 - 1) and set(ev) >= {"longmem_ppl", "no_memory_ppl", "backbone_ppl", "ppl_ratio"}
    # untrained (ReZero) SideNet: memory or not, it reproduces the backbone
    assert ev["ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert ev["no_memory_ppl"] == pytest.approx(ev["backbone_ppl"], rel=1e-4)


def test_resume_with_other_data_is_refused(tmp_path):
    Trainer(config(tmp_path), documents(), model=model()).fit(progress=False, until=2)
    with pytest.raises(ValueError, match="cannot resume with other data"):
        Trainer(config(tmp_path), documents(6), model=model(), resume=True)


def test_resume_with_documents_cut_into_parts(tmp_path):
    """``max_doc_segments`` cuts the 10-segment documents into parts; the checkpoint counts the parts, and a resume
    with the same data must count them the same way (it was refused as "other data")."""
    cut = config(tmp_path, max_doc_segments=4)
    first = Trainer(cut, documents(), model=model())
    first.fit(progress=False, until=2)
    assert len(first.data.documents) > len(documents())
    assert Trainer(cut, documents(), model=model(), resume=True).step == 2
    with pytest.raises(ValueError, match="cannot resume with other data"):
        Trainer(cut, documents(6), model=model(), resume=True)


def test_a_run_starts_untrained_or_from_init_with_its_own_top_k(tmp_path, monkeypatch):
    import longmem.model.longmem as lm_model
    from longmem.model.longmem import LongMemModel

    bb = model("compact").backbone
    bb.model.save_pretrained(tmp_path / "bb")
    bb.tokenizer.save_pretrained(tmp_path / "bb")
    shipped = LongMemModel(bb, tiny_model("llama", backbone=str(tmp_path / "bb"), train_scope="compact",
                                          lora_rank=4).config)
    with torch.no_grad():
        for p in shipped.trainable_state().values():
            p.add_(0.01)  # "trained": differs from an untrained SideNet
    shipped.save(tmp_path / "shipped")
    monkeypatch.setattr(lm_model, "SHIPPED", {str(tmp_path / "bb"): "shipped"})  # this backbone has a default
    monkeypatch.setattr(lm_model, "SHIPPED_DIR", tmp_path)
    fresh = Trainer(config(tmp_path, backbone=str(tmp_path / "bb"), train_scope="compact", lora_rank=4),
                    documents()).model
    assert all(p.abs().sum() == 0 for n, p in fresh.sidenet.named_parameters() if "alpha" in n)  # not the shipped
    assert fresh.config.topk == 64
    init = Trainer(config(tmp_path, out=str(tmp_path / "run2"), backbone=str(tmp_path / "bb"),
                          init=str(tmp_path / "shipped"), topk=4), documents()).model
    assert init.config.topk == 4 and init.sidenet.layers[init.config.memory_layer].topk == 4
    got, want = init.trainable_state(), shipped.trainable_state()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_memtrm_trains_through_the_same_loop_resumes_and_round_trips(tmp_path):
    """``--model memtrm``: the baseline trains its memory layer with the same data and loop and resumes (close to an
    uninterrupted run: its memory holds keys/values of its own trainable layer, rebuilt with the current weights);
    its checkpoint (safetensors + JSON) loads back, is refused as a LongMem checkpoint, and vice versa."""
    from tiny import tiny_llama

    from longmem.model.baselines import MemTRM
    from longmem.model.longmem import CheckpointError, LongMemModel
    from training.train import load_trained

    def memtrm():
        return MemTRM(tiny_llama(), cached_layer=2, chunk_size=2, topk=8, capacity=64, segment_len=16)

    docs = documents()
    whole = Trainer(config(tmp_path / "a", model="memtrm", steps=6), docs, model=memtrm())
    hist = whole.fit(progress=False)
    assert all(h["gate"] != 0.5 for h in hist[1:])  # the gate trains (it starts at sigmoid(0))
    part = Trainer(config(tmp_path / "b", model="memtrm", steps=6), docs, model=memtrm())
    part.fit(progress=False, until=3)
    said = []
    resumed = Trainer(config(tmp_path / "b", model="memtrm", steps=6), docs, model=memtrm(), resume=True,
                      log=said.append)
    assert isinstance(resumed.model, MemTRM) and resumed.step == 3 and any("not bit for bit" in m for m in said)
    resumed.fit(progress=False)
    a, b = whole.model.trainable_state(), resumed.model.trainable_state()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-2) for k in a)
    ckpt = tmp_path / "a" / "run" / "checkpoint"
    again = load_trained(ckpt, whole.model.backbone)
    assert isinstance(again, MemTRM) and all(torch.equal(again.trainable_state()[k], a[k]) for k in a)
    ids = torch.arange(3, 19).view(1, -1)
    torch.testing.assert_close(again(ids, again.new_memory()).logits, whole.model(ids, whole.model.new_memory()).logits)
    with pytest.raises(CheckpointError, match="a memtrm checkpoint, not a LongMem"):
        LongMemModel.load(ckpt, whole.model.backbone)
    longmem_ckpt = model().save(tmp_path / "longmem")
    with pytest.raises(CheckpointError, match="not a MemTRM checkpoint"):
        MemTRM.load(longmem_ckpt, whole.model.backbone)
    with pytest.raises(CheckpointError, match="trained for backbone"):
        MemTRM.load(ckpt, tiny_llama(seed=1))
    with pytest.raises(ValueError, match="model must be"):
        Trainer(config(tmp_path / "c", model="gpt"), docs, model=memtrm())


def test_the_kl_term_keeps_the_sidenet_near_the_backbone(tmp_path):
    """kl_weight adds KL(backbone || model) on every token but recall answers: 0 at init (closed ReZero branches
    reproduce the backbone), and training with it ends nearer the backbone than training without it."""
    from training.train import token_losses, token_nll

    m = model("compact")
    ids = torch.as_tensor(documents()[1].ids[:32], dtype=torch.long).view(2, 16)
    out = m.step(ids, m.new_memory(batch_size=2))
    nll, kl = token_losses(m, out.hidden, ids, out.reference)
    assert torch.allclose(kl, torch.zeros_like(kl), atol=1e-6) and torch.equal(nll, token_nll(m, out.hidden, ids))
    drift = {}
    for w in (0.0, 50.0):
        trained = model("compact")
        hist = Trainer(config(tmp_path / str(w), steps=12, lr=2e-2, train_scope="compact", kl_weight=w,
                              scale_lr=20.0), documents(), model=trained).fit(progress=False)
        assert ("kl" in hist[-1]) == (w > 0)
        with torch.no_grad():
            out = trained.step(ids, trained.new_memory(batch_size=2))
            drift[w] = token_losses(trained, out.hidden, ids, out.reference)[1].mean().item()
    assert drift[0.0] > 0.01 and drift[50.0] < 0.5 * drift[0.0], drift


@pytest.mark.parametrize("scope", ["all", "empty"])
def test_the_kl_scope_picks_the_tokens_it_applies_to(scope):
    """kl_scope="all" puts KL(backbone || model) on every token but recall answers; "empty" only on the rows read
    with an empty memory (row 0 here: row 1 holds its document's past). Checked against the terms by hand."""
    from longmem.model.lm import segment_starts
    from training.train import SegmentLoss

    torch.manual_seed(0)
    m = model("compact")
    with torch.no_grad():
        for name, p in m.named_trainable():
            if "alpha" in name or "lora_b" in name:
                p.add_(0.3 * torch.randn_like(p))  # open the ReZero branches: the SideNet now differs from the backbone
    ids = torch.as_tensor(documents()[1].ids[:32], dtype=torch.long).view(2, 16)
    answers = torch.zeros_like(ids, dtype=torch.bool)
    answers[:, 10:13] = True
    past = torch.as_tensor(documents()[2].ids[:32], dtype=torch.long).view(2, 16)

    def memory():  # row 0 empty, row 1 with 16 tokens of past (each call gets its own: a step adds to it)
        bank = m.new_memory(batch_size=2)
        with torch.no_grad():
            k, v = m.encode_memory(past)
        bank.add(k, v, tokens=past, starts=segment_starts(*past.shape, past.device))
        bank.clear([0])
        assert bank.sizes()[0] == 0 and bank.sizes()[1] > 0
        return bank

    with torch.no_grad():
        plain = SegmentLoss(m, kl_weight=0.0)(ids, memory(), answers)[0]
        objective, _, kl = SegmentLoss(m, kl_weight=2.0, kl_scope=scope)(ids, memory(), answers)
    assert (kl[0] > 1e-4).any() and (kl[1] > 1e-4).any()
    where = ~answers[:, 1:]  # (B, T-1)
    if scope == "empty":
        where[1] = False
    torch.testing.assert_close(objective, plain + 2.0 * (kl * where).sum() / where.sum())
    with pytest.raises(ValueError, match="kl_scope must be one of"):
        SegmentLoss(m, kl_weight=1.0, kl_scope="answers")
