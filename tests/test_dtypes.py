"""Every model path in bfloat16 as well as float32, on any CPU: bfloat16 runs everywhere (emulated, only slower, where
the CPU has no AVX512-BF16 or AMX), so a dtype bug is caught on every machine, not only on the kind that picks bf16.

Paths: the tiny llama (RoPE, GQA) and GPT-2 backbones; LongMem with a full and a compact (LoRA) SideNet, loaded the way
a shipped checkpoint is (float32 weights onto a bf16 backbone); forward, memorize, nll, score, generate; memory written
in one dtype and read by a model of the other, through both memory-attention paths; MemTRM; persistent banks; chat and
the classifier; a training step under bf16 autocast; and every eval suite (``eval all --quick`` on a tiny llama saved
as a model directory).

Tolerances, on purpose: bf16 keeps 8 significant bits (a rounding moves a number by up to 2^-9 of itself). Through the
tiny models' 4 layers the log-probabilities moved by at most 0.009 (llama) and 0.003 (GPT-2), against 0.01-0.2 that
memory changes them by; the tests allow a quarter of what memory changes, so a bf16 path that lost or garbled memory
fails, and rounding passes.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import random_ids
from tiny import CHAT_TEMPLATE, VOCAB, char_tokenizer, chat_model, small_config, tiny_backbone

from longmem.model import sidenet
from longmem.model.baselines import MemTRM
from longmem.model.lm import Sampling
from longmem.model.longmem import LongMemModel
from longmem.tasks.chat import Chat
from longmem.tasks.classify import Classifier

BF16 = torch.bfloat16


@pytest.fixture(params=["llama", "qwen2", "gpt2"])
def family(request) -> str:
    return request.param


@pytest.fixture(params=["full", "compact"])
def scope(request) -> str:
    return request.param


def awake(model: LongMemModel, seed: int = 0) -> LongMemModel:
    """A "trained" SideNet: branches half open, LoRA updates non-zero, memory's share of attention 88%, so every side
    path changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.gate.fill_(-2.0)
        for name, p in model.sidenet.named_parameters():
            if name.endswith(("alpha_attn", "alpha_mlp")):
                p.fill_(0.5)
            elif name.endswith("lora_b"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def pair(family: str, scope: str, tmp_path, **config) -> tuple[LongMemModel, LongMemModel]:
    """The same trained model in float32 and in bf16, the bf16 one loaded as a checkpoint is (``LongMemModel.load``
    onto a bf16 backbone: copied blocks in bf16, LoRA factors and scales float32)."""
    m32 = awake(LongMemModel(tiny_backbone(family), small_config(train_scope=scope, lora_rank=4, segment_len=32,
                                                                 **config)))
    m32.save(tmp_path / "ckpt")
    return m32, LongMemModel.load(tmp_path / "ckpt", tiny_backbone(family, BF16))


def logp_with_memory(model, ids, filler, memory=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities (T, V) of ``ids`` read after ``filler`` went into memory, and with memory empty."""
    if memory is None:
        memory = model.new_memory()
        model.memorize(filler, memory)
    with_mem = model(ids, memory, update_memory=False).logits.float().log_softmax(-1)[0]
    empty = model(ids, model.new_memory(), update_memory=False).logits.float().log_softmax(-1)[0]
    return with_mem, empty


def test_backbone_states_and_memory_keys_agree_across_dtypes(family):
    b32, b16 = tiny_backbone(family), tiny_backbone(family, BF16)
    ids = random_ids(48)
    h32, h16 = b32(ids).hidden, b16(ids).hidden
    assert h16[-1].dtype == BF16
    scale = h32[-1].abs().max()
    assert (h16[-1].float() - h32[-1]).abs().max() < 0.05 * scale
    k32, v32 = b32.layer_kv(2, h32[2])
    k16, v16 = b16.layer_kv(2, h16[2])
    assert k16.dtype == v16.dtype == BF16
    torch.testing.assert_close(k16.float(), k32, atol=0.05 * k32.abs().max().item(), rtol=0.05)


def test_longmem_reads_memory_alike_in_both_dtypes(family, scope, tmp_path):
    m32, m16 = pair(family, scope, tmp_path)
    assert m16.sidenet.layers[0].dtype == BF16 and m16.new_memory().dtype == BF16
    if scope == "compact":  # the one place float32 factors meet bf16 weights
        lora = [p for n, p in m16.sidenet.named_parameters() if "lora_" in n]
        assert lora and all(p.dtype == torch.float32 for p in lora)
    ids, filler = random_ids(32, seed=1), random_ids(96, seed=2)
    with32, empty32 = logp_with_memory(m32, ids, filler)
    with16, empty16 = logp_with_memory(m16, ids, filler)
    effect = (with32 - empty32).abs().max()  # what memory changes
    assert effect > 0.01, "the test needs a model that memory changes"
    assert (with16 - with32).abs().max() < 0.25 * effect
    assert (empty16 - empty32).abs().max() < 0.25 * effect
    assert (with16.argmax(-1) == with32.argmax(-1)).float().mean() > 0.9


def test_nll_score_generate_in_bfloat16(family, scope, tmp_path):
    m32, m16 = pair(family, scope, tmp_path)
    text = random_ids(100, seed=3)
    (nll32, n32), (nll16, n16) = m32.nll(text, m32.new_memory()), m16.nll(text, m16.new_memory())
    assert n32 == n16 == 99 and math.isfinite(nll16)
    assert abs(nll16 / nll32 - 1) < 0.005  # per-token NLL within 0.5%
    mem32, mem16 = m32.new_memory(), m16.new_memory()
    m32.memorize(random_ids(64, seed=4), mem32)
    m16.memorize(random_ids(64, seed=4), mem16)
    s32 = m32.score(random_ids(20, seed=5), random_ids(4, seed=6), mem32)
    s16 = m16.score(random_ids(20, seed=5), random_ids(4, seed=6), mem16)
    assert abs(s16 - s32) < 0.02 * abs(s32)
    prompt = random_ids(50, seed=7)  # longer than the 32-token window: its head moves into memory
    before = len(mem16)
    out = list(m16.generate(prompt, mem16, Sampling(max_new_tokens=30, temperature=0)))
    assert len(out) == 30 and all(0 <= t < VOCAB for t in out) and len(mem16) > before
    assert len(list(m16.generate(prompt, None, Sampling(max_new_tokens=3, temperature=0.8, seed=0)))) == 3


@pytest.mark.parametrize("path", ["dense", "gather"])
def test_memory_of_one_dtype_is_read_by_a_model_of_the_other(family, path, tmp_path, monkeypatch):
    """bf16 keys/values read by a float32 model, and float32 ones by a bf16 model: each memory-attention path meets
    the two dtypes in one place (its float32 scores)."""
    if path == "gather":  # the per-query gather, which memory holding > 16x K tokens takes
        monkeypatch.setattr(sidenet, "DENSE_MEMORY_RATIO", 0)
    m32, m16 = pair(family, "compact", tmp_path)
    ids, filler = random_ids(32, seed=1), random_ids(96, seed=2)
    mems = {}
    for name, m in (("f32", m32), ("bf16", m16)):
        mems[name] = m.new_memory()
        m.memorize(filler, mems[name])
    assert mems["bf16"].dtype == BF16 and mems["f32"].dtype == torch.float32
    own32, empty32 = logp_with_memory(m32, ids, filler, mems["f32"])
    effect = (own32 - empty32).abs().max()
    crossed32 = logp_with_memory(m32, ids, filler, mems["bf16"])[0]  # float32 model, bf16 memory
    crossed16 = logp_with_memory(m16, ids, filler, mems["f32"])[0]  # bf16 model, float32 memory
    assert (crossed32 - own32).abs().max() < 0.25 * effect
    assert (crossed16 - own32).abs().max() < 0.25 * effect


def test_memtrm_in_bfloat16(family, tmp_path):
    layers = tiny_backbone(family).spec.n_layers
    m32 = MemTRM(tiny_backbone(family), cached_layer=layers // 2, chunk_size=2, topk=8, capacity=None, segment_len=32)
    with torch.no_grad():
        m32.memory_layer.gate.fill_(-1.0)  # memory's share 73%
    m32.save(tmp_path / "memtrm")
    m16 = MemTRM.load(tmp_path / "memtrm", tiny_backbone(family, BF16))
    ids, filler = random_ids(32, seed=1), random_ids(96, seed=2)
    with32, empty32 = logp_with_memory(m32, ids, filler)
    with16, _ = logp_with_memory(m16, ids, filler)
    effect = (with32 - empty32).abs().max()
    assert effect > 0.01 and (with16 - with32).abs().max() < 0.25 * effect
    nll32, n = m32.nll(random_ids(100, seed=3), m32.new_memory())
    nll16, _ = m16.nll(random_ids(100, seed=3), m16.new_memory())
    assert abs(nll16 / nll32 - 1) < 0.005
    assert len(list(m16.generate(random_ids(40, seed=4), m16.new_memory(), Sampling(max_new_tokens=5)))) == 5


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float32"])
def test_a_bank_built_in_bfloat16_restores_and_answers(kv_dtype, tmp_path):
    """Ingest with a bf16 model into a bank stored in bf16 or float32, reopen it, and chat with it in memory: the
    restored memory holds exactly what ``memorize`` computes (in the bank's dtype)."""
    from longmem.ingest.pipeline import ingest
    from longmem.storage import BankDirectory

    model = awake(chat_model(segment_len=64, dtype=BF16))
    book = tmp_path / "book.txt"
    book.write_text("".join(f"Chapter {i}. The keeper counted {i * 7} gulls at dawn.\n" for i in range(12)))
    with BankDirectory(tmp_path / "banks").create("b", model, kv_dtype=kv_dtype) as bank:
        assert ingest(bank, model, book).document.status == "complete"
    ref = model.new_memory(capacity=None)
    model.memorize(torch.tensor(model.backbone.tokenizer(book.read_text()).input_ids), ref, batch_segments=1)
    with BankDirectory(tmp_path / "banks").open("b") as bank:
        memory = bank.load_memory()
    n = ref.rows[0].n
    assert memory.dtype == getattr(torch, kv_dtype) and memory.rows[0].n == n
    assert torch.equal(memory.rows[0].k[:, :n], ref.rows[0].k[:, :n].to(memory.dtype))  # bf16 in float32: exact
    assert torch.equal(memory.rows[0].v[:, :n], ref.rows[0].v[:, :n].to(memory.dtype))
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    assert "".join(chat.ask("How many gulls?")) and len(chat.history) == 2


def test_classifier_scores_agree_across_dtypes(tmp_path):
    m32, m16 = pair("llama", "compact", tmp_path, chunk_size=2)
    words = ["+", "-", "="]
    demos = [f"demo {i}:{words[i % 3]}" for i in range(20)]
    scores = {}
    for name, m in (("f32", m32), ("bf16", m16)):
        memory = m.new_memory()
        m.memorize(torch.tensor(m.backbone.tokenizer("\n".join(demos)).input_ids), memory)
        clf = Classifier(m, memory, "{text}:{label}", words, demos[:2])
        scores[name] = clf.scores("a fine film")
    for w in words:
        assert scores["bf16"][w] == pytest.approx(scores["f32"][w], rel=0.02)


def test_a_training_step_under_bfloat16_autocast(tmp_path, scope):
    """The trainer keeps float32 weights and computes under bf16 autocast (its "auto" on a BF16 CPU or GPU): the
    loss agrees with float32 and the updated weights stay float32."""
    import numpy as np

    from training.data import Document
    from training.train import TrainConfig, Trainer

    docs = [Document(f"d{k}", np.resize(np.arange(3 + 5 * k, 10 + 6 * k) % 90 + 3, 160).astype(np.int32))
            for k in range(4)]
    hist = {}
    for amp in ("none", "bfloat16"):
        cfg = TrainConfig(out=str(tmp_path / amp), batch_size=2, segment_len=16, memory_tokens=64, steps=3, lr=3e-3,
                          eval_every=0, save_every=0, amp=amp, train_scope=scope)
        model = LongMemModel(tiny_backbone("llama"), small_config(segment_len=16, capacity=64, train_scope=scope,
                                                                  lora_rank=4))
        trainer = Trainer(cfg, docs, model=model)
        assert trainer.amp == (None if amp == "none" else BF16)
        hist[amp] = [h["loss"] for h in trainer.fit(progress=False)]
        assert all(p.dtype == torch.float32 for _, p in model.named_trainable())
    assert all(math.isfinite(x) for x in hist["bfloat16"])
    for a, b in zip(hist["none"], hist["bfloat16"]):
        assert abs(b / a - 1) < 0.02


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.heavy
@pytest.mark.shared_data
def test_every_eval_suite_runs_in_both_dtypes(dtype, tmp_path, capsys):
    """``longmem eval all --quick`` (sizes cut further) on a tiny llama saved as a local model directory, whose native
    context is 8k like SmolLM2's: every suite runs in ``--dtype`` and its record says the dtype it ran in."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from longmem.cli.eval import main
    from longmem.eval import SUITES

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=8192,
                      tie_word_embeddings=True)
    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "bb")
    tok.save_pretrained(tmp_path / "bb")
    cut = ["chapterbreak.suffix_tokens=16", "squad.test=2", "icl.test=4", "books.opening_tokens=1100",
           "books.arxiv_tokens=1100", "efficiency.documents=1100", "ablations.test=4", "ablations.book_tokens=1100",
           "bookqa.block=1", "bookqa.questions=2"]
    argv = ["all", "--quick", "--backbone", str(tmp_path / "bb"), "--untrained", "--dtype", dtype,
            "--out", str(tmp_path / "out"), "--threads", "2"] + [f"--set={c}" for c in cut]
    assert main(argv) == 0
    for name in SUITES:
        result = json.loads((tmp_path / "out" / f"{name}.json").read_text())
        assert result["provenance"]["machine"]["dtype"] == dtype, name
    capsys.readouterr()
    # --resume: a second run of a suite reuses the units the first one recorded, and gives the same record
    first = {name: json.loads((tmp_path / "out" / f"{name}.json").read_text())["data"] for name in ("icl", "bookqa")}
    for name, n_units in (("icl", 3), ("bookqa", 2)):  # icl: the models' unit, the anchor's, the head's; bookqa: a unit
        #                                                   per question here (bookqa.block=1)
        assert main([name] + argv[1:] + ["--resume"]) == 0
        assert f"resuming: {n_units} finished units" in capsys.readouterr().err
        assert json.loads((tmp_path / "out" / f"{name}.json").read_text())["data"] == first[name]
    # a run cut off after bookqa's first block answers only the second one again, and the record is the same
    units = tmp_path / "out" / "bookqa.tasks.jsonl"
    units.write_text(units.read_text().splitlines(keepends=True)[0])
    assert main(["bookqa"] + argv[1:] + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "resuming: 1 finished units" in err and "question 1/1 to run" in err and "question 2/" not in err
    data = json.loads((tmp_path / "out" / "bookqa.json").read_text())["data"]
    for k, by_d in first["bookqa"]["results"].items():  # the answers; the timings differ
        for d, r in by_d.items():
            assert [x["answer"] for x in data["results"][k][d]["items"]] == [x["answer"] for x in r["items"]]
    # a run of the second block alone, in a folder of its own, reports that block; its unit and the first run's
    # first one, put together, are the whole record again (two processes can split a distance)
    other = [str(tmp_path / "other") if a == str(tmp_path / "out") else a for a in argv]
    assert main(["bookqa"] + other[1:] + ["--set=bookqa.blocks=1"]) == 0
    assert "question 1/1 to run" in capsys.readouterr().err
    part = json.loads((tmp_path / "other" / "bookqa.json").read_text())
    assert part["data"]["questions"] == first["bookqa"]["questions"][1:] and part["size"]["blocks"] == [1]
    units.write_text(units.read_text().splitlines(keepends=True)[0] + (tmp_path / "other" / "bookqa.tasks.jsonl")
                     .read_text())
    assert main(["bookqa"] + argv[1:] + ["--resume"]) == 0
    assert "resuming: 2 finished units" in capsys.readouterr().err
    data = json.loads((tmp_path / "out" / "bookqa.json").read_text())["data"]
    for k, by_d in first["bookqa"]["results"].items():
        for d, r in by_d.items():
            assert [x["answer"] for x in data["results"][k][d]["items"]] == [x["answer"] for x in r["items"]]
