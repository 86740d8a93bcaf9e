"""Demonstrations memory finds (``longmem.tasks.demos``) and contextual calibration: a real bank (SQLite, FTS5, faiss)
on a tiny llama, demonstrations written into it by ingestion, found per input by memory, words and both."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import tiny_model

from longmem.storage import BankDirectory
from longmem.tasks import classify as CL
from longmem.tasks import examples as EX
from longmem.tasks import measure as ME
from longmem.tasks.classify import Choice, Classifier, ClassifierSpec, calibrate
from longmem.tasks.demos import DemoFinder, accuracy_vs_bank, balanced, demo_pattern, grow_bank, parse_demo
from longmem.tasks.examples import Example

TEMPLATE = "Review: {text} Sentiment: {label}"
LABELS = ["positive", "negative"]
WORDS = ["apple", "river", "candle", "mirror", "garden", "silver", "thunder", "pepper", "violin", "marble", "forest",
         "copper"]


def demos_set(n: int = 24) -> list[Example]:
    """Short texts with a distinctive word each; the label alternates."""
    return [Example(f"the {WORDS[i % len(WORDS)]} story number {i}", LABELS[i % 2]) for i in range(n)]


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def model(request):
    m = tiny_model(dtype=request.param, segment_len=64, chunk_size=2)
    for layer in m.sidenet.layers:  # open the SideNet's branches: memory changes what the model computes
        layer.alpha_attn.data.fill_(0.5)
        layer.alpha_mlp.data.fill_(0.5)
    return m


@pytest.fixture(scope="module")
def bank(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("banks")
    b = BankDirectory(root).create("demos", model)
    list(grow_bank(b, model, demos_set(), [24], TEMPLATE, root))
    yield b
    b.close()


@pytest.fixture(scope="module")
def finder(bank, model):
    return DemoFinder(bank, model, bank.load_memory(model), TEMPLATE, LABELS)


def stored(bank) -> set[str]:
    return {r[0] for r in bank.db.execute("SELECT text FROM passages")}


def test_a_template_reads_a_demonstration_back():
    p = demo_pattern(TEMPLATE)
    assert parse_demo(p, "Review: a gorgeous  film Sentiment: positive") == ("a gorgeous  film", "positive")
    assert parse_demo(p, "Chapter one. It was a dark night.") is None
    assert parse_demo(demo_pattern("input: {text} type: {label}"), "input: x y type: okay") == ("x y", "okay")
    with pytest.raises(ValueError, match="once each"):
        demo_pattern("{text} {text} {label}")


@pytest.mark.parametrize("how", ["lexical", "memory", "fused"])
def test_every_finder_returns_demonstrations_of_this_bank_only(finder, bank, how):
    found = finder.find("the violin story number 99", Choice(finder=how, shots=6))
    assert 0 < len(found) <= 6
    assert all(d.formatted in stored(bank) for d in found)
    assert all(d.label in LABELS and d.formatted == TEMPLATE.format(text=d.text, label=d.label) for d in found)
    assert len({d.passage_id for d in found}) == len(found)
    if how == "lexical":  # the words it shares: the violin demonstrations first
        assert {d.text for d in found[:2]} == {"the violin story number 8", "the violin story number 20"}


def test_the_input_itself_is_never_a_demonstration(finder):
    text = "the violin story number 8"  # stored with its label
    for how in ("lexical", "memory", "fused"):
        found = finder.find(text, Choice(finder=how, shots=24))
        assert text not in {d.text for d in found}
        assert found  # the others still are


def test_passages_that_are_not_demonstrations_are_not_chosen(tmp_path, model):
    b = BankDirectory(tmp_path).create("mixed", model)
    book = tmp_path / "book.txt"
    book.write_text("The violin story is a book. It has no labels at all.\n\nThe violin played on.", encoding="utf-8")
    from longmem.ingest.pipeline import ingest

    ingest(b, model, book)
    list(grow_bank(b, model, demos_set(6), [6], TEMPLATE, tmp_path))
    f = DemoFinder(b, model, b.load_memory(model), TEMPLATE, LABELS)
    for how in ("lexical", "fused"):
        found = f.find("violin story", Choice(finder=how, shots=10))  # "story": the book and the demonstrations
        assert found and all(parse_demo(f.pattern, d.formatted) for d in found)
        assert not any("book" in d.formatted for d in found)
    b.close()


def test_shots_none_and_order(finder):
    assert finder.find("apple", Choice(finder="none")) == [] and finder.find("apple", Choice(shots=0)) == []
    found = finder.find("the apple story", Choice(finder="lexical", shots=3))
    assert finder.context("the apple story", Choice(finder="lexical", shots=3)) == [d.formatted for d in found[::-1]]
    with pytest.raises(ValueError, match="empty"):
        finder.find("  ", Choice())
    with pytest.raises(ValueError, match="finder must be one of"):
        Choice(finder="embed")


def test_balance_takes_the_labels_in_turn():
    demos = [EX.Example(f"t{i}", w) for i, w in enumerate(["a", "a", "a", "b", "a", "b"])]
    from longmem.tasks.demos import Demo

    ranked = [Demo(e.text, e.label, e.text, i) for i, e in enumerate(demos)]
    assert [d.text for d in balanced(ranked, ["a", "b"], 4)] == ["t0", "t1", "t3", "t5"]
    assert [d.text for d in balanced(ranked, ["a", "b", "c"], 3)] == ["t0", "t1", "t3"]  # "c" has none: skipped
    assert len(balanced(ranked, ["a", "b"], 99)) == 6


def test_balanced_finds_hold_both_labels(finder):
    found = finder.find("the violin story number 8", Choice(finder="lexical", shots=4, balance=True))
    assert sorted(d.label for d in found) == ["negative", "negative", "positive", "positive"]


def test_calibration_by_hand():
    # rigged scores: the text's and the content-free input's log-probabilities of each label word
    text = {"pos": math.log(0.6), "neg": math.log(0.2)}  # among the labels: 0.75, 0.25
    free = {"pos": math.log(0.3), "neg": math.log(0.1)}  # among the labels: 0.75, 0.25 -> a biased model
    out = calibrate(text, free)
    assert out["pos"] == pytest.approx(0.0) and out["neg"] == pytest.approx(0.0)  # no evidence beyond the bias
    out = calibrate({"pos": math.log(0.5), "neg": math.log(0.5)}, free)
    assert out == pytest.approx({"pos": math.log(0.5 / 0.75), "neg": math.log(0.5 / 0.25)})
    assert max(out, key=out.get) == "neg"  # calibration turns a tie toward the label the model is biased against
    with pytest.raises(ValueError, match="same labels"):
        calibrate(text, {"pos": 0.0})


def test_a_calibrated_classifier_divides_by_the_content_free_prior(model):
    clf = Classifier(model, None, TEMPLATE, LABELS, ["Review: fine Sentiment: positive"])
    cal = Classifier(model, None, TEMPLATE, LABELS, ["Review: fine Sentiment: positive"], calibrate=True)
    raw, prior = clf.scores("a dull film"), clf.scores(cal.content_free)
    assert cal.scores("a dull film") == pytest.approx(calibrate(raw, prior))


def test_a_classifier_reads_what_its_chooser_picks(model, finder):
    choice = Choice(finder="fused", shots=3)
    clf = Classifier(model, finder.passages.memory, TEMPLATE, LABELS, ["unused"], choose=finder.chooser(choice))
    text = "the garden story number 77"
    assert clf.read(text) == finder.context(text, choice)
    assert clf.prompt(text).startswith(clf.read(text)[0]) and "unused" not in clf.prompt(text)
    fixed = Classifier(model, finder.passages.memory, TEMPLATE, LABELS, clf.read(text))
    assert clf.scores(text) == pytest.approx(fixed.scores(text))
    [row] = CL.classify_rows(clf, [text])
    assert row["read"].split("\n") == clf.read(text) and row["prediction"] in LABELS


def test_a_saved_spec_builds_a_finding_classifier(model, finder):
    spec = ClassifierSpec("s", TEMPLATE, LABELS, context=["Review: ok Sentiment: positive"], finder="lexical",
                          shots=2, calibrate=True)
    clf = spec.classifier(model, finder.passages.memory, finder)
    assert len(clf.read("the apple story")) == 2 and clf.calibrate
    with pytest.raises(ValueError, match="DemoFinder"):
        spec.classifier(model, finder.passages.memory)
    assert ClassifierSpec.from_dict(spec.to_dict()) == spec
    old = {k: v for k, v in spec.to_dict().items() if k not in ("finder", "shots", "balance", "calibrate")}
    assert ClassifierSpec.from_dict(old).finder == "none"  # a classifier saved before keeps its fixed context


def test_grow_bank_adds_only_what_each_step_adds(tmp_path, model):
    b = BankDirectory(tmp_path).create("grow", model)
    seen = []
    for size in grow_bank(b, model, demos_set(12), [0, 4, 12], TEMPLATE, tmp_path):
        seen.append((size, len(stored(b)), len(b.documents())))
    assert seen == [(0, 0, 0), (4, 4, 1), (12, 12, 2)]
    with pytest.raises(ValueError, match="must lie in"):
        list(grow_bank(b, model, demos_set(3), [5], TEMPLATE, tmp_path))
    b.close()


@pytest.mark.heavy
def test_accuracy_vs_bank(tmp_path, model):
    data = demos_set(20)
    test, memory_examples = data[:4], data[4:]
    calls = []
    points = accuracy_vs_bank(model, TEMPLATE, LABELS, [], memory_examples, test, Choice("fused", 3), tmp_path,
                              sizes=[0, 8, 16], progress=lambda d, t: calls.append((d, t)))
    assert [p.n_memory for p in points] == [0, 8, 16] and all(p.n_test == 4 for p in points)
    assert points[0].memory_tokens == 0 < points[1].memory_tokens < points[2].memory_tokens
    assert calls[-1] == (16 + 3 * 4, 16 + 3 * 4) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    zero_shot = ME.evaluate(Classifier(model, None, TEMPLATE, LABELS), test)
    assert points[0].accuracy == zero_shot.accuracy  # nothing in the bank: the fixed (empty) context
    assert list(tmp_path.iterdir()) == []  # the temporary bank is gone


def test_wilson_interval():
    lo, hi = ME.wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert ME.wilson(0, 10)[0] == 0.0 and ME.wilson(0, 0) == (0.0, 1.0)
    assert ME.CurvePoint(0, 0.5, 0, 100).interval == ME.wilson(50, 100)


def test_the_fixed_curve_calibrates_when_asked(model):
    data = demos_set(12)
    test, memory_examples = data[:4], data[4:]
    context = ["Review: fine Sentiment: positive"]
    [point] = ME.accuracy_vs_memory(model, TEMPLATE, LABELS, context, memory_examples, test, sizes=[0], calibrate=True)
    assert point.accuracy == ME.evaluate(Classifier(model, None, TEMPLATE, LABELS, context, calibrate=True),
                                        test).accuracy
