"""The evaluation suites' numbers, on tiny models built in code: scoring after a shared prefix equals one pass,
perplexity equals hand-computed values, rigged ICL labels give exactly 100% and 0%, aggregation and settings."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_ids
from tiny import VOCAB, char_tokenizer, small_config

from longmem.cli.eval import parse_overrides, provenance
from longmem.eval import bookqa, books, icl, icl_report
from longmem.eval import recall as recall_suite
from longmem.eval.chapterbreak import Item, choose
from longmem.eval.core import EMPTY_LABELS, Entrant, EvalContext, apply_overrides, lineup, mean_std
from longmem.eval.datasets.books import Document
from longmem.eval.scoring import Prefix
from longmem.model.baselines import BackboneLM, MemTRM
from longmem.model.longmem import LongMemModel
from longmem.tasks.examples import Example, Preset


def memory_model(backbone, segment_len: int = 48) -> LongMemModel:
    """A tiny LongMem whose SideNet differs from the backbone (copy-init) and reads its memory."""
    return LongMemModel(backbone, small_config(segment_len=segment_len, side_init="plain")).eval()


def filled_memory(lm, n: int = 40):
    memory = lm.new_memory(capacity=None)
    lm.memorize(random_ids(n, seed=7)[0], memory)
    return memory


@pytest.mark.parametrize("which", ["longmem", "backbone"])
def test_prefix_scores_equal_one_pass(backbone, which):
    lm = memory_model(backbone) if which == "longmem" else BackboneLM(backbone, 48)
    memory = filled_memory(lm) if lm.uses_memory else None
    context, cont = random_ids(20, seed=1)[0], random_ids(9, seed=2)[0]
    prefix = Prefix.read(lm, context, memory)
    assert prefix.logprobs(cont).sum().item() == pytest.approx(lm.score(context, cont, memory), abs=1e-4)
    # extending, then reading the next token, is scoring that token after the longer context
    longer = prefix.extend(cont[:4])
    assert longer.next_logprobs()[cont[4]].item() == pytest.approx(
        lm.score(torch.cat([context, cont[:4]]), cont[4:5], memory), abs=1e-4)
    assert prefix.length == 20 and longer.length == 24  # the prefix itself is unchanged
    # greedy decoding from the prefix equals re-reading everything for each token
    ids, want = context.tolist(), []
    for _ in range(5):
        hidden = lm.step(torch.tensor([ids]), memory).hidden
        want.append(int(lm.backbone.logits(hidden[:, -1:])[0, -1].argmax()))
        ids.append(want[-1])
    assert prefix.greedy(5) == want


def test_prefix_refuses_what_does_not_fit(llama):
    lm = BackboneLM(llama, 16)
    with pytest.raises(ValueError, match="no room"):
        Prefix.read(lm, random_ids(16)[0])
    prefix = Prefix.read(lm, random_ids(10)[0])
    with pytest.raises(ValueError, match="does not fit"):
        prefix.logprobs(random_ids(7)[0])


def zero_lm_head(backbone) -> None:
    """Logits of exactly 0 for every token: the model predicts the uniform distribution over the vocabulary."""
    with torch.no_grad():
        backbone.model.get_output_embeddings().weight.zero_()


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size(backbone):
    zero_lm_head(backbone)
    docs = [("<5k", Document("a", random_ids(70, seed=3)[0].numpy())),
            ("<5k", Document("b", random_ids(33, seed=4)[0].numpy()))]
    for lm in (BackboneLM(backbone, 16), memory_model(backbone, 16)):
        r = books.score_documents(Entrant("m", "m", lm), docs, capacity=32, log=lambda m: None)
        assert r["splits"]["<5k"]["tokens"] == 69 + 32  # every token but each document's first is predicted
        assert r["splits"]["<5k"]["ppl"] == pytest.approx(VOCAB, rel=1e-5)


def test_perplexity_equals_a_hand_computed_cross_entropy(backbone):
    ids = random_ids(40, seed=5)
    logits = backbone.model(ids).logits[0, :-1].float()  # the Hugging Face model itself, one pass
    want = math.exp(F.cross_entropy(logits, ids[0, 1:]).item())
    r = books.score_documents(Entrant("b", "b", BackboneLM(backbone, 64)), [("<5k", Document("d", ids[0].numpy()))],
                              capacity=None, log=lambda m: None)
    assert r["splits"]["<5k"]["ppl"] == pytest.approx(want, rel=1e-5)
    assert r["documents"]["d"]["ppl"] == pytest.approx(want, rel=1e-5)


def test_split_of_follows_the_paper_ranges():
    assert [books.split_of(n) for n in (4_999, 5_000, 9_999, 10_000, 99_999, 100_000, 500_000, 1_000_000)] == [
        "<5k", "5k-10k", "5k-10k", "10k-100k", "10k-100k", "100k-500k", "500k-1M", ">1M"]


def test_memory_share_is_the_change_from_the_memory_empty_sidenet():
    results = {"longmem_empty": {"splits": {"5k-10k": {"ppl": 25.0}, "ArXiv": {"ppl": 10.0}}},
               "longmem": {"splits": {"5k-10k": {"ppl": 24.0}, "ArXiv": {"ppl": 10.5}}}}
    assert books._memory_share(results, ["5k-10k", "ArXiv"], "longmem") == (
        "Memory's own share (LongMem with its memory empty -> with memory): 5k-10k 25.00 -> 24.00 (-4.0%), "
        "ArXiv 10.00 -> 10.50 (+5.0%).")
    results = {"memtrm_empty": {"splits": {"ArXiv": {"ppl": 8.0}}}, "memtrm": {"splits": {"ArXiv": {"ppl": 7.0}}}}
    assert books._memory_share(results, ["ArXiv"], "memtrm") == (
        "Memory's own share (MemTRM with its memory empty -> with memory): ArXiv 8.00 -> 7.00 (-12.5%).")


def test_book_documents_are_openings_and_whole_books():
    b = [Document("x", np.arange(20_000)), Document("y", np.arange(3_000))]
    docs = books.book_documents(b, books.Size(books=2, opening_tokens=8192, max_tokens=15_000))
    assert [(s, d.name, len(d.ids)) for s, d in docs] == [("5k-10k", "x[:8192]", 8192), ("10k-100k", "x", 15_000),
                                                        ("<5k", "y", 3_000)]


# --------------------------------------------------------------------------------------------------------------
# in-context learning

TEMPLATE = "Review: {text} Sentiment: {label}"
PRESET = Preset("toy", TEMPLATE, {"1": "positive", "0": "negative"}, "toy")


def toy_task(test: list[Example]) -> icl.Task:
    demos = [Example(f"film {i} was {'good' if i % 2 else 'bad'}", "positive" if i % 2 else "negative")
             for i in range(12)]
    return icl.Task(PRESET, 0, demos[:4], demos[4:], test)


def test_rigged_icl_labels_give_exactly_100_and_0_percent(llama):
    """Gold labels set to the model's own choice (computed by plain one-pass scoring) give 100%, the other label 0%:
    the suite's scoring after a shared prefix, its protocol and its accuracy agree with ``SegmentLM.score``."""
    lm = memory_model(llama, segment_len=256)
    task = toy_task([])
    memory = icl.demo_memory(lm, task.memory, TEMPLATE, chunk_size=2)
    tok, context = lm.backbone.tokenizer, icl.context_ids(llama.tokenizer, TEMPLATE, task.shots(2))
    texts = ["a dull, slow film", "warm and funny", "it was fine", "the plot made no sense"]
    own = []
    for text in texts:
        prompt = context + tok("Review: " + text + " Sentiment:", add_special_tokens=False).input_ids
        scores = {w: lm.score(prompt, tok(" " + w, add_special_tokens=False).input_ids, memory) for w in PRESET.labels}
        own.append(max(scores, key=scores.get))
    right = icl.classify(lm, memory, context, TEMPLATE, PRESET.labels, [Example(t, w) for t, w in zip(texts, own)])
    assert right.label_acc == 1.0 and right.predictions == own
    other = {"positive": "negative", "negative": "positive"}
    flipped = [Example(t, other[w]) for t, w in zip(texts, own)]
    wrong = icl.classify(lm, memory, context, TEMPLATE, PRESET.labels, flipped)
    assert wrong.label_acc == 0.0


def test_greedy_protocol_needs_the_token_to_start_the_label():
    assert icl.starts_label(" pos", " ", "positive") and icl.starts_label(" positive", " ", "positive")
    assert not icl.starts_label("pos", " ", "positive")  # the label word follows a space
    assert not icl.starts_label(" ", " ", "positive")  # whitespace alone starts every label
    assert not icl.starts_label(" positively", " ", "positive")
    assert not icl.starts_label(" neg", " ", "positive")
    scored = icl.Scored(greedy=[True, False, False, True], label=[True, True, False, False], predictions=[])
    assert (scored.agree, scored.greedy_acc, scored.label_acc) == (2, 0.5, 0.5)  # equal accuracy, 2 verdicts differ


def test_k_shots_cover_every_label_first():
    task = toy_task([])
    assert {e.label for e in task.shots(2)} == {"positive", "negative"}
    assert task.shots(3) == [e for e in task.context if e in task.shots(3)]  # in the context's order
    assert task.shots(10) == task.context


def test_full_context_demonstrations_fit_the_budget_and_end_with_the_shots(llama):
    task = toy_task([])
    shots = icl.context_ids(llama.tokenizer, TEMPLATE, task.shots(4))
    ids = icl.full_context_ids(llama.tokenizer, task, 4, budget=len(shots) + 70)
    assert len(shots) < len(ids) <= len(shots) + 70 and ids[-len(shots):] == shots
    assert icl.full_context_ids(llama.tokenizer, task, 4, budget=10_000)[: 5] == llama.tokenizer(
        "Review: " + task.memory[0].text, add_special_tokens=False).input_ids[:5]  # everything fits: all of memory


def test_a_task_log_resumes_only_its_own_finished_units(tmp_path):
    from longmem.eval.core import TaskLog

    path, sig = tmp_path / "icl.tasks.jsonl", {"size": {"test": 8}, "seed": 0}
    first = TaskLog(path, sig, resume=False, made_at="abc")
    first.put("SST-2/0", {"runs": [1]})
    first.put("SST-2/1", {"runs": [2]})
    with open(path, "a") as f:
        f.write('{"signature": {"size": {"test": 8}, "seed": 0}, "key": "MR/0", "val')  # cut off by a kill
    again = TaskLog(path, sig, resume=True, made_at="def", log=lambda m: None)
    assert again.get("SST-2/0") == {"runs": [1]} and again.get("MR/0") is None and again.commits() == ["abc"]
    again.put("MR/0", {"runs": [3]})
    assert TaskLog(path, sig, resume=True, log=lambda m: None).commits() == ["abc", "def"]
    other = TaskLog(path, {**sig, "seed": 1}, resume=True, log=lambda m: None)  # another size or seed: nothing reused
    assert other.get("SST-2/0") is None
    assert TaskLog(path, sig, resume=True, log=lambda m: None).get("SST-2/0") == {"runs": [1]}  # ... nor dropped
    fresh = TaskLog(path, sig, resume=False)  # without --resume a run starts afresh
    assert fresh.get("SST-2/0") is None and not path.exists()


def test_a_unit_recorded_under_a_setting_s_old_name_resumes(tmp_path):
    """Units written before ``csz`` became ``chunk_size`` (the committed ICL record) are the same run's units."""
    from longmem.eval.core import TaskLog

    path = tmp_path / "icl.tasks.jsonl"
    old = {"size": {"test": 8, "csz": 2}, "seed": 0, "csz": 4}
    TaskLog(path, old, resume=False, made_at="abc").put("SST-2/0", {"runs": [1]})
    new = {"size": {"test": 8, "chunk_size": 2}, "seed": 0, "chunk_size": 4}
    assert TaskLog(path, new, resume=True, log=lambda m: None).get("SST-2/0") == {"runs": [1]}
    other = {"size": {"test": 8, "chunk_size": 1}, "seed": 0, "chunk_size": 4}
    assert TaskLog(path, other, resume=True, log=lambda m: None).get("SST-2/0") is None


def test_a_unit_recorded_before_a_setting_joined_the_signature_counts_as_made_at_its_default(tmp_path):
    """The committed ICL units predate ``segment_len`` in the signature (every run then used 1024) and bookqa's
    ``budget`` size field: a run at the defaults reuses them; a run at another window or budget does not."""
    from longmem.eval.core import TaskLog

    path = tmp_path / "bookqa.tasks.jsonl"
    TaskLog(path, {"size": {"questions": 8}, "seed": 0}, resume=False).put("4096/0", {"scores": 1})
    defaults = {"size": {"questions": 100, "budget": 640}, "segment_len": 1024}
    today = {"size": {"questions": 8, "budget": 640}, "seed": 0, "segment_len": 1024}
    assert TaskLog(path, today, resume=True, log=lambda m: None, defaults=defaults).get("4096/0") == {"scores": 1}
    for other in ({**today, "segment_len": 2048}, {**today, "size": {"questions": 8, "budget": 1500}}):
        assert TaskLog(path, other, resume=True, log=lambda m: None, defaults=defaults).get("4096/0") is None


def test_a_unit_recorded_before_best_last_existed_counts_as_best_first_whatever_today_s_default(tmp_path):
    """bookqa's first blocks were read best first, before ``best_last`` existed; its default is now True, so those
    units belong to a run asking for best_last=false and not to one at today's default."""
    ctx = EvalContext(None, [], tmp_path, tmp_path, resume=True, log=lambda m: None, provenance={"commit": "abc"})
    selects = ("distances",)
    log = ctx.task_log("bookqa", bookqa.QUICK, selects)
    old = json.loads(json.dumps(log.signature))
    del old["size"]["best_last"]  # as the unit was written then
    (tmp_path / "bookqa.tasks.jsonl").write_text(json.dumps({"signature": old, "key": "4096/0", "value": 1}) + "\n")
    assert asdict(bookqa.QUICK)["best_last"] is True
    assert ctx.task_log("bookqa", bookqa.QUICK, selects).get("4096/0") is None
    first = apply_overrides(bookqa.QUICK, {"best_last": "false"})
    assert ctx.task_log("bookqa", first, selects).get("4096/0") == 1


def test_a_unit_made_before_4bit_decoding_belongs_to_runs_that_decode_bfloat16_weights(tmp_path):
    """Units recorded before ``int4`` joined the signature decoded with bfloat16 weights: a run that still does
    (float32, or ``LONGMEM_INT4=0``) reuses them; one whose 4-bit models decode 4 bits does not."""
    def ctx(machine: dict) -> EvalContext:
        return EvalContext(None, [], tmp_path, tmp_path, resume=True, log=lambda m: None,
                           provenance={"commit": "abc", "machine": machine})

    log = ctx({"dtype": "bfloat16", "int4": False}).task_log("icl", icl.QUICK)
    old = json.loads(json.dumps(log.signature))
    del old["int4"]  # as units were written then
    (tmp_path / "icl.tasks.jsonl").write_text(json.dumps({"signature": old, "key": "SST-2/0", "value": 1}) + "\n")
    assert ctx({"dtype": "bfloat16", "int4": False}).task_log("icl", icl.QUICK).get("SST-2/0") == 1
    assert ctx({"dtype": "bfloat16", "int4": True}).task_log("icl", icl.QUICK).get("SST-2/0") is None


def test_a_run_asking_for_fewer_or_more_units_reuses_those_it_shares(tmp_path):
    ctx = EvalContext(None, [], tmp_path, tmp_path, resume=True, log=lambda m: None, provenance={"commit": "abc"})
    selects = ("sets", "seeds")
    ctx.task_log("icl", apply_overrides(icl.QUICK, {"seeds": "3"}), selects).put("SST-2/0", 1)
    assert ctx.task_log("icl", icl.QUICK, selects).get("SST-2/0") == 1  # one seed of the three: reused
    assert ctx.task_log("icl", apply_overrides(icl.QUICK, {"sets": "SST-2,MR"}), selects).get("SST-2/0") == 1
    assert ctx.task_log("icl", apply_overrides(icl.QUICK, {"test": "9"}), selects).get("SST-2/0") is None


def test_units_made_with_other_sidenet_weights_are_not_reused(tmp_path, llama):
    """A retrained SideNet shipped under the same name has other weights: the record names them by digest, and a
    resumed run does not take units the earlier weights made."""
    from longmem.model.longmem import checkpoint_digest

    lm = memory_model(llama)
    before = lm.save(tmp_path / "before")
    with torch.no_grad():
        next(p for _, p in lm.named_trainable()).add_(0.5)
    digests = [checkpoint_digest(before)[:16], checkpoint_digest(lm.save(tmp_path / "after"))[:16]]
    assert digests[0] != digests[1]

    def log_with(digest, name="shipped with the package"):
        made_by = provenance(lm, ["icl"], name, None, "auto", digest)
        assert made_by["sidenet_sha256"] == digest
        ctx = EvalContext(None, [], tmp_path, tmp_path / "out", resume=True, log=lambda m: None, provenance=made_by)
        return ctx.task_log("icl", icl.QUICK, ("sets", "seeds"))

    log_with(digests[0]).put("SST-2/0", 1)
    assert log_with(digests[0]).get("SST-2/0") == 1
    assert log_with(digests[1]).get("SST-2/0") is None
    assert log_with(digests[0], name=str(before)).get("SST-2/0") == 1  # the same weights named by their folder


def test_summary_intervals_are_wilson_per_set_and_binomial_on_the_average():
    runs = [{"set": s, "seed": 0, "k": 4, "model": "m", "greedy": a, "label": a, "n": 100} for s, a in
            (("A", 0.5), ("B", 0.9))]
    s = icl_report.summarize(runs)
    lo, hi = s["m/4/A"]["ci"]["label"]
    assert (lo, hi) == pytest.approx((40.38, 59.62), abs=0.01)
    half = 100 * 1.96 * math.sqrt(0.25 / 100 + 0.09 / 100) / 2
    assert s["m/4/Avg"]["ci"]["label"] == pytest.approx((70 - half, 70 + half))
    assert icl_report.cell(s["m/4/A"], "label") == "50.0 ±9.6" and icl_report.cell(s["m/4/A"], "calibrated") == ""


def test_paired_differences_use_the_same_sentences():
    runs = [{"set": "A", "seed": 0, "k": 4, "model": m, "items": {"label": bits, "calibrated": bits}}
            for m, bits in (("x", "1100"), ("y", "0100"))]
    mean, half, n = icl_report.paired(runs, ("x", 4), ("y", 4))
    assert (mean, n) == (25.0, 4) and half == pytest.approx(100 * 1.96 * 0.5 / 2)
    assert icl_report.paired(runs, ("x", 4), ("z", 4)) is None


def test_summary_means_stds_and_average():
    runs = [{"set": s, "seed": seed, "k": 4, "model": "m", "greedy": g, "label": lab, "n": 10}
            for s, seed, g, lab in [("A", 0, 0.5, 0.6), ("A", 1, 0.7, 0.8), ("B", 0, 0.9, 1.0), ("B", 1, 0.9, 1.0)]]
    s = icl_report.summarize(runs)
    assert s["m/4/A"]["label"] == pytest.approx((70.0, math.sqrt(200.0)))
    assert s["m/4/B"]["greedy"] == pytest.approx((90.0, 0.0))
    assert s["m/4/Avg"]["label"][0] == pytest.approx(85.0)
    assert mean_std([1.0]) == (1.0, 0.0)


# --------------------------------------------------------------------------------------------------------------
# ChapterBreak scoring, lineup, settings


def test_chapterbreak_picks_the_model_own_continuation(llama):
    """The true opening is the model's greedy continuation of the prefix, the negatives random text: it must win,
    with the prefix's head in memory (the prefix is longer than the window)."""
    lm = memory_model(llama, segment_len=32)
    prefix = random_ids(60, seed=9)[0].numpy()
    true = Prefix.read(lm, prefix[-(32 - 8):], None).greedy(8)
    item = Item(source=None, prefix=prefix, candidates=[true] + [random_ids(8, seed=s)[0].tolist() for s in (1, 2)])
    best, scores = choose(Entrant("longmem", "LongMem", lm), item, prefix_tokens=60, suffix_tokens=8)
    assert best == 0 and len(scores) == 3


def test_lineup_has_the_full_context_row_only_when_longer(llama):
    lm = memory_model(llama, segment_len=64)
    assert [e.key for e in lineup(lm)] == ["backbone_1k", "backbone_full", "longmem"]
    assert lineup(lm)[1].context == 512  # the tiny llama's native context
    assert [e.key for e in lineup(lm, full_context=64)] == ["backbone_1k", "longmem"]


def test_a_record_says_which_dtype_was_asked_for_and_why_it_was_chosen(llama, monkeypatch):
    monkeypatch.delenv("LONGMEM_DTYPE", raising=False)
    lm = memory_model(llama)
    m = provenance(lm, ["squad"], "shipped", None, "auto")["machine"]
    assert m["dtype_requested"] == "auto" and m["dtype"] == "float32"  # what the model ran in
    assert "chosen automatically" in m["dtype_reason"]
    m = provenance(lm, ["squad"], "shipped", None, "float32")["machine"]
    assert (m["dtype_requested"], m["dtype_reason"]) == ("float32", "float32, as asked")


def test_size_overrides_are_typed_and_checked():
    size = apply_overrides(icl.QUICK, {"seeds": "3", "sets": "SST-2,MR", "shots": "4,20"})
    assert (size.seeds, size.sets, size.shots) == (3, ["SST-2", "MR"], [4, 20])
    with pytest.raises(ValueError, match="has no size setting 'seed'"):
        apply_overrides(icl.QUICK, {"seed": "3"})
    with pytest.raises(ValueError, match="expected int"):
        apply_overrides(icl.QUICK, {"seeds": "many"})
    assert apply_overrides(bookqa.FULL, {"blocks": "5,6"}).blocks == [5, 6]  # an empty list's items: by annotation
    with pytest.raises(ValueError, match="expected list"):
        apply_overrides(bookqa.FULL, {"blocks": "5,six"})
    assert parse_overrides(["icl.seeds=2", "books.books=3"]) == {"icl": {"seeds": "2"}, "books": {"books": "3"}}
    with pytest.raises(ValueError, match="SUITE.FIELD=VALUE"):
        parse_overrides(["nosuch.seeds=2"])


def test_every_registered_suite_has_quick_and_full_sizes():
    import importlib

    from longmem.eval import SUITES

    for name, module in SUITES.items():
        m = importlib.import_module(module)
        assert callable(m.run) and type(m.QUICK) is type(m.FULL), name
    assert Path(importlib.import_module(SUITES["books"]).__file__).parent.name == "eval"


def test_lineup_takes_a_memtrm_of_the_same_backbone_only(llama):
    from tiny import tiny_llama

    lm = memory_model(llama, segment_len=64)
    rows = lineup(lm, memtrm=MemTRM(llama, cached_layer=2, chunk_size=2, topk=8, segment_len=64))
    assert [e.key for e in rows] == ["backbone_1k", "backbone_full", "memtrm", "longmem"]
    with pytest.raises(ValueError, match="another backbone"):
        lineup(lm, memtrm=MemTRM(tiny_llama(seed=3), cached_layer=2, chunk_size=2, topk=8, segment_len=64))


def test_icl_verdict_says_what_memory_adds(llama):
    from longmem.eval.core import memory_empty

    rows = lineup(memory_model(llama, segment_len=64))
    assert [e.key for e in memory_empty(rows)] == ["longmem_empty"] and memory_empty(rows[:1]) == []
    assert memory_empty(rows)[0].lm is rows[-1].lm  # the same model, run with an empty memory
    with_memtrm = lineup(memory_model(llama, segment_len=64), memtrm=MemTRM(llama, cached_layer=2, chunk_size=2, topk=8,
                                                                              segment_len=64))
    empty = memory_empty(with_memtrm)
    assert [e.key for e in empty] == ["memtrm_empty", "longmem_empty"] and not any(e.fills_memory for e in empty)
    assert empty[0].lm is with_memtrm[2].lm and empty[0].label == EMPTY_LABELS["memtrm"]
    avg = {"longmem": (70.0, 60.0), "longmem_empty": (65.0, 62.5), "backbone_1k": (60.0, 61.0)}
    summary = {f"{m}/20/Avg": {"greedy": (g, float("nan")), "label": (w, float("nan"))} for m, (g, w) in avg.items()}
    text = icl_report.verdict(summary, rows + memory_empty(rows), ["SST-2"], 20)
    assert "backbone_1k 60.0, 61.0; longmem 70.0, 60.0; longmem_empty 65.0, 62.5" in text
    assert "LongMem beats the 1k-context backbone on 1 of 2 (not on label-word scoring)." in text
    assert text.endswith("What memory adds (LongMem minus its memory-empty self): +5.0, -2.5 points.")
    avg.update(memtrm=(72.0, 64.0), memtrm_empty=(71.0, 66.0))
    summary = {f"{m}/20/Avg": {"greedy": (g, float("nan")), "label": (w, float("nan"))} for m, (g, w) in avg.items()}
    text = icl_report.verdict(summary, with_memtrm + empty, ["SST-2"], 20)
    assert "MemTRM on 0 of 2 (not on the paper's protocol, label-word scoring)." in text
    assert text.endswith("What memory adds (MemTRM minus its memory-empty self): +1.0, -2.0 points. What memory "
                         "adds (LongMem minus its memory-empty self): +5.0, -2.5 points.")


def test_versus_counts_wins_and_names_the_losses():
    from longmem.eval.core import versus

    ppl = {"longmem": {"a": 10.0, "b": 12.0, "c": 9.0}, "backbone_1k": {"a": 11.0, "b": 11.0, "c": 9.0},
           "memtrm": {"a": 10.5, "b": 12.5, "c": 9.5}}
    assert versus(ppl, lambda v: v, lower_is_better=True) == (
        "LongMem beats the 1k-context backbone on 1 of 3 (not on b, c); MemTRM on 3 of 3.")
    acc = {"longmem": {"x": 0.5}, "backbone_1k": {"x": 0.25}}
    assert versus(acc, lambda v: v, lower_is_better=False) == "LongMem beats the 1k-context backbone on 1 of 1."


def test_report_writes_one_document_from_suites_run_at_different_times(tmp_path, capsys):
    import dataclasses
    import gzip
    import json

    from longmem.cli.eval import main
    from longmem.eval.core import SuiteResult

    out, docs = tmp_path / "out", tmp_path / "docs" / "results.md"
    assert main(["report", "--out", str(out), "--docs", str(docs)]) == 2  # nothing to report yet
    assert "no suite results" in capsys.readouterr().err
    out.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "threads": 2, "dtype": "bfloat16", "torch": "2", "faiss": "1"}
    for suite, commit, plot in (("recall", "bbbbbbb", "recall.png"), ("books", "aaaaaaa", None)):
        prov = {"command": f"longmem eval {suite} --quick", "commit": commit, "dirty": False, "date": "today",
                "machine": machine, "sidenet": "shipped", "topk": 1024, "chunk_size": 4, "memtrm": None}
        size = asdict(books.FULL) if suite == "books" else {**asdict(recall_suite.FULL), "items": 3}  # recall: reduced
        r = SuiteResult(suite, f"Title of {suite}", [f"| a |\n| --- |\n| {suite} |"], {}, json.loads(json.dumps(size)),
                        [plot] if plot else [], [f"note on {suite}"], 60.0, prov)
        (out / f"{suite}.json").write_text(json.dumps(r.to_json()))
        if plot:
            (out / plot).write_bytes(b"png")
    assert main(["report", "--out", str(out), "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert text.index("Title of books") < text.index("Title of recall")  # suite order, not file order
    assert "| recall | reduced: items 3 (full 10) | `longmem eval recall --quick` | `bbbbbbb`" in text
    assert "| books | full | `longmem eval books --quick` | `aaaaaaa`" in text
    assert "1 of 2 suites ran at the full size" in text
    assert text.count("Hardware: Test CPU") == 1 and "no trained MemTRM checkpoint" in text
    assert (docs.parent / "results" / "recall.png").read_bytes() == b"png" and "](results/recall.png)" in text
    kept = docs.parent / "results"
    assert sorted(f.name for f in kept.iterdir()) == ["books.json.gz", "recall.json.gz", "recall.png"]
    copy = (kept / "books.json.gz").read_bytes()
    assert json.loads(gzip.decompress(copy)) == json.loads((out / "books.json").read_text())
    (out / "books.json").unlink()  # the document's own copy of the data is enough to write it again
    docs.unlink()
    assert main(["report", "--out", str(kept), "--docs", str(docs)]) == 0
    assert docs.read_text() == text and (kept / "recall.png").read_bytes() == b"png"
    assert main(["report", "--out", str(kept), "--docs", str(tmp_path / "again" / "results.md")]) == 0
    assert (tmp_path / "again" / "results" / "books.json.gz").read_bytes() == copy  # the same bytes, every time
    with_memtrm = dataclasses.replace(r, provenance={**prov, "memtrm": "runs/memtrm/weights"})  # r: books
    (kept / "books.json").write_text(json.dumps(with_memtrm.to_json()))  # a new result copied in, plain
    assert main(["report", "--out", str(kept), "--docs", str(docs)]) == 0
    assert "MemTRM baseline: `runs/memtrm/weights` (`--memtrm`)." in docs.read_text()
    assert sorted(f.name for f in kept.iterdir()) == ["books.json.gz", "recall.json.gz", "recall.png"]
    (out / "books.json").write_text(json.dumps(with_memtrm.to_json()))
    (out / "recall.json").unlink()  # a run of books alone: the document keeps recall as it was
    recall_copy = (kept / "recall.json.gz").read_bytes()
    assert main(["report", "--out", str(out), "--docs", str(docs)]) == 0
    assert "Title of recall" in docs.read_text() and (kept / "recall.json.gz").read_bytes() == recall_copy
    assert "MemTRM baseline: `runs/memtrm/weights`" in docs.read_text()  # books from the run's folder
    (kept / "recall.json.gz").unlink()  # a suite leaves the document when its copy is deleted
    assert main(["report", "--out", str(kept), "--docs", str(docs)]) == 0
    assert "Title of recall" not in docs.read_text() and "Title of books" in docs.read_text()
    assert main(["report", "--out", str(out)]) == 2  # report needs --docs
    (kept / "books.json.gz").write_bytes(copy[: len(copy) // 2])  # a truncated copy: an error naming the file
    assert main(["report", "--out", str(kept), "--docs", str(docs)]) == 2
    assert "books.json.gz: not a readable suite result" in capsys.readouterr().err


def test_a_result_written_before_csz_was_renamed_reads_and_reports_its_chunk_size():
    from longmem.cli.eval import results_document
    from longmem.eval.core import SuiteResult

    old = {"suite": "squad", "title": "SQuAD", "tables": [], "data": {}, "size": {"test": 20, "csz": 2},
           "plots": [], "notes": [], "seconds": 60.0,
           "provenance": {"sidenet": "shipped", "topk": 1024, "csz": 4, "command": "longmem eval squad"}}
    result = SuiteResult.from_json(old)
    assert result.size == {"test": 20, "chunk_size": 2} and result.provenance["chunk_size"] == 4
    assert "chunks of 4" in results_document([result], "results")


def test_the_results_document_names_each_backbone_its_suites_ran_on():
    from longmem.cli.eval import results_document
    from longmem.eval.core import SuiteResult

    def result(suite, backbone, sidenet):
        return SuiteResult.from_json({"suite": suite, "title": suite, "tables": [], "data": {}, "size": {},
                                      "plots": [], "notes": [], "seconds": 60.0,
                                      "provenance": {"backbone": backbone, "sidenet": sidenet, "topk": 64,
                                                     "chunk_size": 4, "command": f"longmem eval {suite}"}})

    text = results_document([result("natural", "qwen2.5-coder-0.5b-instruct-q4_k_m",
                                     "untrained: none ships for this backbone"),
                             result("facts", "SmolLM2-135M-Instruct", "shipped with the package")], "results")
    assert "Backbone: SmolLM2-135M-Instruct." in text and "Backbone: qwen2.5-coder-0.5b-instruct-q4_k_m." in text
    assert "LongMem SideNet: untrained: none ships for this backbone (K = 64" in text


def test_a_result_made_before_best_last_existed_reports_it_was_read_best_first():
    from longmem.cli.eval import size_cell
    from longmem.eval import natural
    from longmem.eval.core import SuiteResult

    size = asdict(natural.FULL)
    made = {k: v for k, v in size.items() if k != "best_last"}
    old = SuiteResult("natural", "Natural", [], {}, made, [], [], 60.0)
    assert size_cell(old) == "reduced: best_last False (full True)"
    assert size_cell(SuiteResult("natural", "Natural", [], {}, size, [], [], 60.0)) == "full"


def test_topk_and_window_flags_reach_the_model_and_bad_k_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from longmem.cli.eval import load_model, parse_args

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "bb")
    char_tokenizer().save_pretrained(tmp_path / "bb")
    base = ["books", "--backbone", str(tmp_path / "bb"), "--untrained", "--dtype", "float32"]
    model = load_model(parse_args(base + ["--topk", "32", "--segment-len", "128"]))
    layer = model.sidenet.layers[model.sidenet.memory_layer]
    assert (model.config.topk, layer.topk, model.segment_len) == (32, 32, 128)
    assert provenance(model, base, "untrained", None)["topk"] == 32  # a resumed unit's signature names K
    with pytest.raises(SystemExit, match="--topk must be >= 1"):
        load_model(parse_args(base + ["--topk", "0"]))
