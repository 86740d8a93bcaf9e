"""The many-shot classifier builder: Classifier's prompt and fast path, reading/splitting examples, presets on the
shared ICL files, metrics, accuracy vs memory size, plots, saved specs and CSV output. Tiny models only."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import random_ids
from tiny import tiny_model

from longmem.ingest.readers import DemoFormat
from longmem.model.baselines import BackboneLM
from longmem.tasks import classify as CL
from longmem.tasks import examples as EX
from longmem.tasks import measure as ME
from longmem.tasks.classify import Classifier, ClassifierSpec
from longmem.tasks.examples import Example
from longmem.text.io import InputError

SENTIMENT = {"0": "negative", "1": "positive"}
SIGNS = ["+", "-", "="]  # one character = one token for the tiny models' character tokenizer
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model():
    return tiny_model(segment_len=64)


def awake(model):
    """Open the SideNet's branches so that what memory holds changes the scores (an untrained SideNet ignores it)."""
    for layer in model.sidenet.layers:
        layer.alpha_attn.data.fill_(0.5)
        layer.alpha_mlp.data.fill_(0.5)
    return model


def examples(n: int, labels=("positive", "negative"), seed: int = 0) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    return [Example(f"text number {i}", labels[int(torch.randint(len(labels), (1,), generator=g))]) for i in range(n)]


def write(tmp_path, name: str, content: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


# -----------------------------------------------------------------------------
# Classifier: prompt, fast path, context

def slow_scores(clf: Classifier, text: str) -> dict[str, float]:
    """Reference: one model.score call per label word, on the classifier's own prompt."""
    tok = clf.model.backbone.tokenizer
    ids = tok(clf.prompt(text), add_special_tokens=False).input_ids
    prefix = clf.template.split("{label}")[0].format(text=text)
    gap = prefix[len(prefix.rstrip()):]  # the template's whitespace before {label} goes with the word
    return {w: clf.model.score(ids, tok(gap + w, add_special_tokens=False).input_ids, clf.memory) for w in clf.labels}


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("n_context", [0, 2, 12])  # 12 demonstrations overflow the 64-token window
def test_fast_path_equals_one_score_per_label(family, n_context, monkeypatch):
    model = awake(tiny_model(family, segment_len=64))
    memory = model.new_memory()
    model.memorize(random_ids(80, seed=3), memory)
    context = [f"demo {i}:{SIGNS[i % 3]}" for i in range(n_context)]
    clf = Classifier(model, memory, "{text}:{label}", SIGNS, context)
    expect = slow_scores(clf, "a fine film")
    monkeypatch.setattr(model, "score", lambda *a, **k: pytest.fail("the fast path must not call score"))
    got = clf.scores("a fine film")
    assert list(got) == SIGNS
    for w in SIGNS:
        assert got[w] == pytest.approx(expect[w], abs=1e-4)


def test_memory_changes_the_scores():
    model = awake(tiny_model(segment_len=64))
    empty, full = model.new_memory(), model.new_memory()
    model.memorize(random_ids(120, seed=4), full)
    a = Classifier(model, empty, "{text}:{label}", SIGNS).scores("some text")
    b = Classifier(model, full, "{text}:{label}", SIGNS).scores("some text")
    assert any(abs(a[w] - b[w]) > 1e-4 for w in SIGNS)


def test_multi_token_label_words_are_scored_one_by_one(model):
    clf = Classifier(model, None, "Review: {text} Sentiment: {label}", ["positive", "negative"])
    tok = model.backbone.tokenizer
    got = clf.scores("  a gorgeous film ")
    for w in clf.labels:  # the template's space goes with the label word, as in the demonstrations' tokens
        expect = model.score(tok("Review: a gorgeous film Sentiment:").input_ids, tok(" " + w).input_ids)
        assert got[w] == pytest.approx(expect)
    assert clf.predict("a gorgeous film") == max(got, key=got.get)


def test_context_demonstrations_are_in_the_prompt_and_change_the_scores(model):
    plain = Classifier(model, None, "{text}:{label}", SIGNS)
    shots = Classifier(model, None, "{text}:{label}", SIGNS, ["good:+", "bad:-"], separator="\n")
    assert plain.prompt("ok") == "ok:"
    assert shots.prompt("ok") == "good:+\nbad:-\nok:"
    a, b = plain.scores("ok"), shots.scores("ok")
    assert any(abs(a[w] - b[w]) > 1e-4 for w in SIGNS)
    assert Classifier(model, None, "{text}:{label}", SIGNS, ["good:+"], separator=" | ").prompt("ok") == "good:+ | ok:"


def test_too_long_text_is_refused_but_long_context_is_cut(model):
    clf = Classifier(model, None, "{text}:{label}", SIGNS, ["x" * 200])
    assert set(clf.scores("short")) == set(SIGNS)  # the context keeps its end
    with pytest.raises(ValueError, match=r"too long to classify.*64-token window"):
        clf.scores("y" * 70)
    with pytest.raises(ValueError, match="too long"):  # multi-token words need room too
        Classifier(model, None, "{text}:{label}", ["long label", "other"]).scores("z" * 58)


def test_classifier_validation(model):
    with pytest.raises(ValueError, match="needs {text} before {label}"):
        Classifier(model, None, "{label} {text}", SIGNS)
    with pytest.raises(ValueError, match="at least two labels"):
        Classifier(model, None, "{text}:{label}", ["+"])
    with pytest.raises(ValueError, match="distinct"):
        Classifier(model, None, "{text}:{label}", ["+", "+"])
    with pytest.raises(ValueError, match="empty"):
        Classifier(model, None, "{text}:{label}", SIGNS).scores("   ")


def test_predict_many_reports_progress(model):
    clf = Classifier(model, None, "{text}:{label}", SIGNS, ["a:+"])
    calls = []
    texts = ["one", "two", "three"]
    assert clf.predict_many(texts, lambda d, t: calls.append((d, t))) == [clf.predict(t) for t in texts]
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_from_documents_takes_context(model):
    docs = [SimpleNamespace(kind="demos", meta={"template": "{text}:{label}", "label_counts": {"-": 2, "+": 3}}),
            SimpleNamespace(kind="text", meta={})]
    clf = Classifier.from_documents(model, None, docs, context=["a:+"], separator=" ")
    assert (clf.template, clf.labels, clf.context, clf.prompt("b")) == ("{text}:{label}", ["+", "-"], ["a:+"], "a:+ b:")


# -----------------------------------------------------------------------------
# reading examples

def test_read_csv_with_header_and_label_words(tmp_path):
    p = write(tmp_path, "r.csv", 'text,label\n"A gripping, moving film.",1\n  Dull.  ,0\n\n')
    assert EX.read_examples(p, DemoFormat(label_words=SENTIMENT)) == [Example("A gripping, moving film.", "positive"),
                                                                      Example("Dull.", "negative")]


def test_read_headerless_csv_tsv_and_jsonl(tmp_path):
    mr = write(tmp_path, "mr.csv", '0,"simplistic , silly ."\n1,"a ""charming"" journey ."\n')
    assert EX.read_examples(mr, DemoFormat(columns=["label", "text"], label_words=SENTIMENT)) == [
        Example("simplistic , silly .", "negative"), Example('a "charming" journey .', "positive")]
    sst = write(tmp_path, "s.tsv", "sentence\tlabel\nhide new secretions \t0\n")
    assert EX.read_examples(sst, DemoFormat(text_column="sentence")) == [Example("hide new secretions", "0")]
    js = write(tmp_path, "d.jsonl", '{"text": "great", "label": 1}\n\n{"text": "awful", "label": "neg"}\n')
    assert EX.read_examples(js, DemoFormat()) == [Example("great", "1"), Example("awful", "neg")]


@pytest.mark.parametrize("name, content, fmt, message", [
    ("cols.csv", "text,stars\ngood,5\n", DemoFormat(), r"has no 'label' column \(columns: text, stars\)"),
    ("labels.csv", "text,label\nok,1\nhm,2\nmeh,3\n", DemoFormat(label_words=SENTIMENT),
     r"line 3: label '2' is not one of: 0, 1 \(2 of 3 rows"),
    ("ragged.csv", "text,label\ngood,1\nbad,0,extra\n", DemoFormat(), r"line 3: expected 2 fields, got 3"),
    ("quote.csv", 'text,label\n"never closed,1\n', DemoFormat(), r"malformed CSV|expected 2 fields"),
    ("emptytext.csv", "text,label\ngood,1\n  ,0\n", DemoFormat(), r"line 3: the text is empty"),
    ("headeronly.csv", "text,label\n", DemoFormat(), r"has no examples"),
    ("badjson.jsonl", '{"text": "a", "label": 1}\n{"text": "b", label: 0}\n', DemoFormat(), r"line 2: invalid JSON"),
    ("list.jsonl", '[1, 2]\n', DemoFormat(), r"line 1: expected a JSON object"),
    ("empty.csv", "", DemoFormat(), r"the file is empty"),
    ("binary.csv", b"PK\x03\x04\x00\x00junk", DemoFormat(), r"binary file"),
    ("utf16.csv", "text,label\n".encode("utf-16"), DemoFormat(), r"UTF-16"),
    ("reviews.xlsx", "text,label\n", DemoFormat(), r"unsupported file type '.xlsx'"),
])
def test_bad_example_files(tmp_path, name, content, fmt, message):
    p = write(tmp_path, name, content)
    with pytest.raises(InputError, match=message) as e:
        EX.read_examples(p, fmt)
    assert name in str(e.value)


def test_missing_file_and_skip_empty(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        EX.read_examples(tmp_path / "nope.csv", DemoFormat())
    p = write(tmp_path, "e.csv", "0,fine\n0,\n1,good\n")
    fmt = DemoFormat(columns=["label", "text"])
    assert [e.text for e in EX.read_examples(p, fmt, skip_empty=True)] == ["fine", "good"]


def test_peek_columns(tmp_path):
    rows = "".join(f"t{i},{i % 2}\n" for i in range(8))
    cols, first = EX.peek_columns(write(tmp_path, "h.csv", "text,label\n" + rows))
    assert cols == ["text", "label"] and first == [[f"t{i}", str(i % 2)] for i in range(5)]
    cols, first = EX.peek_columns(write(tmp_path, "n.tsv", "1\tgood\n0\tbad\n"), has_header=False)
    assert cols == ["column 1", "column 2"] and first == [["1", "good"], ["0", "bad"]]
    fmt = DemoFormat(columns=cols, text_column="column 2", label_column="column 1")  # what the UI then passes
    assert EX.read_examples(tmp_path / "n.tsv", fmt)[1] == Example("bad", "0")
    cols, first = EX.peek_columns(write(tmp_path, "j.jsonl", '{"text": "a", "y": 1}\n{"text": "b", "id": null}\n'))
    assert cols == ["text", "y", "id"] and first == [["a", "1", ""], ["b", "", ""]]


@pytest.mark.parametrize("name, content, header, message", [
    ("only.csv", "text,label\n", True, r"has no rows after its header"),
    ("dup.csv", "text,text\na,b\n", True, r"blank or repeated column names"),
    ("ragged.csv", "a,b\n1,2,3\n", False, r"line 2: expected 2 fields, got 3"),
    ("bad.jsonl", "{oops\n", True, r"line 1: invalid JSON"),
    ("empty.tsv", "", True, r"the file is empty"),
])
def test_peek_columns_errors(tmp_path, name, content, header, message):
    with pytest.raises(InputError, match=message):
        EX.peek_columns(write(tmp_path, name, content), has_header=header)


def test_read_texts(tmp_path):
    assert EX.read_texts(write(tmp_path, "t.csv", "id,review\n1,nice\n2,awful\n"), "review") == ["nice", "awful"]
    assert EX.read_texts(write(tmp_path, "t.txt", "first\n\n second \n")) == ["first", "second"]
    with pytest.raises(InputError, match="has no 'text' column"):
        EX.read_texts(tmp_path / "t.csv")


# -----------------------------------------------------------------------------
# presets on the shared ICL files

@pytest.mark.parametrize("name, n_train, n_eval", [("SST-2", 6920, 872), ("MR", 8662, 2000), ("MPQA", 8603, 2000),
                                                   ("SST-5", 8544, 2210), ("Subj", 8000, 2000)])
def test_presets_read_the_shared_files(model, name, n_train, n_eval, shared_data_dir):
    preset = EX.PRESETS[name]
    train, test = preset.read(shared_data_dir)
    assert (len(train), len(test)) == (n_train, n_eval)  # MPQA: 3 of 8606 rows have no text
    assert set(Counter(e.label for e in train)) == set(preset.labels)
    Classifier(model, None, preset.template, preset.labels)  # the template suits the classifier


def test_preset_label_numbers_agree_between_sst2_and_sst5(shared_data_dir):
    """SST-2 and SST-5 share sentences: SST-2 positive must be SST-5 good/great, negative terrible/bad."""
    sst2 = {e.text: e.label for e in EX.PRESETS["SST-2"].read(shared_data_dir)[0]}
    pairs = Counter((sst2[e.text], e.label) for e in EX.PRESETS["SST-5"].read(shared_data_dir)[0] if e.text in sst2)
    assert sum(pairs.values()) > 5000
    assert set(pairs) == {("positive", "good"), ("positive", "great"), ("negative", "bad"), ("negative", "terrible")}


# -----------------------------------------------------------------------------
# splitting and formatting

def test_split_is_deterministic_and_disjoint():
    data = examples(60)
    a, b = EX.split_examples(data, 4, 30, 10, seed=7), EX.split_examples(data, 4, 30, 10, seed=7)
    assert a == b and EX.split_examples(data, 4, 30, 10, seed=8) != a
    assert (len(a.context), len(a.memory), len(a.test)) == (4, 30, 10)
    texts = [e.text for part in (a.context, a.memory, a.test) for e in part]
    assert len(set(texts)) == len(texts) == 44
    everything = EX.split_examples(data, 2, None, 10, seed=1)
    assert len(everything.memory) == 48


def test_split_context_covers_every_label():
    data = [Example(f"p{i}", "pos") for i in range(40)] + [Example(f"n{i}", "neg") for i in range(3)] + \
        [Example("the only neutral", "neutral")]
    for seed in range(20):
        split = EX.split_examples(data, 3, 10, 5, seed=seed)
        assert {e.label for e in split.context} == {"pos", "neg", "neutral"}
    assert len({e.label for e in EX.split_examples(data, 2, 0, 0, seed=0).context}) == 2


def test_split_errors():
    with pytest.raises(ValueError, match=r"not enough examples: 4 in context \+ 30 in memory \+ 10 to test = 44, but "
                                         r"there are 20"):
        EX.split_examples(examples(20), 4, 30, 10, seed=0)
    with pytest.raises(ValueError, match="n_test must be >= 0"):
        EX.split_examples(examples(20), 1, 1, -1, seed=0)
    with pytest.raises(ValueError, match="not enough"):
        EX.split_examples(examples(5), 4, None, 3, seed=0)


def test_format_demo_and_stream():
    demos = [Example("a {curly} film", "positive"), Example("dull", "negative")]
    assert EX.format_demo("Review: {text} Sentiment: {label}", demos[0]) == "Review: a {curly} film Sentiment: positive"
    assert EX.demo_stream("{text} => {label}", demos) == "a {curly} film => positive\n\ndull => negative"
    assert EX.demo_stream("{text} => {label}", demos, separator="\n") == "a {curly} film => positive\ndull => negative"


# -----------------------------------------------------------------------------
# saved classifiers

def test_spec_round_trips_through_json(model):
    spec = ClassifierSpec("reviews", "{text}:{label}", SIGNS, ["good:+", "bad:-"], " | ", "r.csv", 200, 2, 5,
                          [Example("nice", "+"), Example("meh", "=")], {"accuracy": 0.5})
    back = ClassifierSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec and isinstance(back.test[0], Example)
    clf = back.classifier(model, None)
    assert clf.prompt("x") == "good:+ | bad:- | x:" and clf.labels == SIGNS
    assert ClassifierSpec.from_dict({"name": "n", "template": "t", "labels": ["a", "b"], "new_field": 1}).test == []
    with pytest.raises(ValueError, match="needs template, labels"):
        ClassifierSpec.from_dict({"name": "n"})


# -----------------------------------------------------------------------------
# metrics

def test_score_predictions_exact():
    labels = ["pos", "neg", "neu"]
    truths = ["pos", "pos", "pos", "neg", "neg", "neu"]
    preds = ["pos", "pos", "neg", "neg", "pos", "pos"]
    r = ME.score_predictions(labels, truths, preds)
    assert r.accuracy == pytest.approx(3 / 6)
    assert r.confusion == [[2, 1, 0], [1, 1, 0], [1, 0, 0]]
    pos, neg, neu = (r.per_label[w] for w in labels)
    assert (pos.precision, pos.recall, pos.support) == (pytest.approx(2 / 4), pytest.approx(2 / 3), 3)
    assert pos.f1 == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))
    assert (neg.precision, neg.recall, neg.f1, neg.support) == (0.5, 0.5, 0.5, 2)
    assert (neu.precision, neu.recall, neu.f1, neu.support) == (0.0, 0.0, 0.0, 1)  # never predicted: 0, not NaN
    assert r.macro_f1 == pytest.approx((pos.f1 + 0.5) / 3)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["n"] == 6 and ME.EvalResult.from_dict(d) == r


def test_score_predictions_errors():
    with pytest.raises(ValueError, match="2 true labels but 1 predictions"):
        ME.score_predictions(["a", "b"], ["a", "b"], ["a"])
    with pytest.raises(ValueError, match="label 'c' is not one of"):
        ME.score_predictions(["a", "b"], ["a", "c"], ["a", "b"])
    with pytest.raises(ValueError, match="empty"):
        ME.score_predictions(["a", "b"], [], [])


def test_evaluate_scores_the_classifiers_own_predictions(model):
    clf = Classifier(model, None, "{text}:{label}", SIGNS, ["good:+"])
    test = [Example(f"t{i}", SIGNS[i % 3]) for i in range(6)]
    calls = []
    r = ME.evaluate(clf, test, lambda d, t: calls.append(d))
    assert r.predictions == clf.predict_many([e.text for e in test]) and r.truths == [e.label for e in test]
    assert sum(map(sum, r.confusion)) == 6 and calls == [1, 2, 3, 4, 5, 6]
    assert r.accuracy == sum(p == t for p, t in zip(r.predictions, r.truths)) / 6
    assert ME.majority_accuracy([Example("a", "x"), Example("b", "x"), Example("c", "y")]) == pytest.approx(2 / 3)


# -----------------------------------------------------------------------------
# accuracy vs memory

def test_default_sizes():
    assert ME.default_sizes(2000) == [0, 100, 500, 2000] and ME.default_sizes(3000) == [0, 100, 500, 2000, 3000]
    assert ME.default_sizes(300) == [0, 100, 300] and ME.default_sizes(0) == [0]


def test_accuracy_vs_memory_grows_the_memory(model):
    data = [Example(f"w{i}", SIGNS[i % 3]) for i in range(20)]
    test, memory_examples = data[:4], data[4:]
    calls = []
    points = ME.accuracy_vs_memory(model, "{text}:{label}", SIGNS, ["a:+"], memory_examples, test, sizes=[16, 0, 4, 4],
                                  progress=lambda d, t: calls.append((d, t)))
    assert [p.n_memory for p in points] == [0, 4, 16]
    tokens = [p.memory_tokens for p in points]
    assert tokens[0] == 0 and tokens[0] < tokens[1] < tokens[2]
    stream = len(EX.demo_stream("{text}:{label}", memory_examples))  # one token per character
    assert tokens[2] == stream // model.chunk_size * model.chunk_size
    assert calls[-1] == (16 + 3 * 4, 16 + 3 * 4) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    # size 0 is in-context only: the same as evaluating without memory
    alone = ME.evaluate(Classifier(model, None, "{text}:{label}", SIGNS, ["a:+"]), test)
    assert points[0].accuracy == alone.accuracy


def test_accuracy_vs_memory_with_finer_chunks(model):
    model = awake(model)
    data = [Example(f"w{i}", SIGNS[i % 3]) for i in range(20)]
    test, memory_examples = data[:4], data[4:]
    [point] = ME.accuracy_vs_memory(model, "{text}:{label}", SIGNS, ["a:+"], memory_examples, test, sizes=[16],
                                    chunk_size=1)
    memory = model.new_memory(capacity=None)
    tok = model.backbone.tokenizer
    model.memorize(tok(EX.demo_stream("{text}:{label}", memory_examples), return_tensors="pt").input_ids, memory)
    fine = Classifier(model, memory.rechunk(1), "{text}:{label}", SIGNS, ["a:+"])
    assert point.accuracy == ME.evaluate(fine, test).accuracy
    assert [fine.scores(e.text) for e in test] != [Classifier(model, memory, "{text}:{label}", SIGNS, ["a:+"]).scores(
        e.text) for e in test]  # finer chunks really retrieve differently


def test_accuracy_vs_memory_errors(model):
    data = [Example(f"w{i}", SIGNS[i % 3]) for i in range(6)]
    with pytest.raises(ValueError, match=r"memory sizes must lie in \[0, 6\]"):
        ME.accuracy_vs_memory(model, "{text}:{label}", SIGNS, [], data, data[:2], sizes=[0, 7])
    with pytest.raises(ValueError, match="has no memory"):
        ME.accuracy_vs_memory(BackboneLM(model.backbone, 64), "{text}:{label}", SIGNS, [], data, data[:2], sizes=[2])


# -----------------------------------------------------------------------------
# plots and CSV output

def test_plots_write_png(tmp_path):
    import matplotlib.image

    r = ME.score_predictions(["pos", "neg"], ["pos", "neg", "neg"], ["pos", "pos", "neg"])
    for path in (ME.plot_confusion(r, tmp_path / "confusion.png"),
                 ME.plot_curve([ME.CurvePoint(0, 0.5, 0, 20), ME.CurvePoint(100, 0.75, 400, 20)],
                               tmp_path / "curve.png", baseline=0.6),
                 ME.plot_curve([ME.CurvePoint(100, 0.75, 400, 20)], tmp_path / "anchor.png",
                               anchor=[ME.CurvePoint(30, 1.0, 0, 6)])):  # a perfect score: bars >= 0
        assert path.read_bytes()[:8] == PNG
        assert matplotlib.image.imread(path).ndim == 3


def word_counts(texts: list[str]):
    """A stand-in for sentence embeddings (the shipped model's are tested in ``test_embedder``)."""
    import numpy as np

    return np.array([[t.count("good"), t.count("bad"), 1.0] for t in texts], dtype=np.float32)  # a constant too


def test_the_anchor_is_fitted_on_the_first_examples_at_each_size():
    examples = [Example(f"{'good' if i % 2 else 'bad'} {i}", "pos" if i % 2 else "neg") for i in range(40)]
    test = [Example("good one", "pos"), Example("bad one", "neg"), Example("bad, labelled pos", "pos")]
    out = ME.anchor_results(word_counts, ["neg", "pos"], examples, test, [0, 1, 10, 40])
    assert [n for n, _ in out] == [10, 40]  # 0 and a single label's examples: no classifier
    for _, r in out:
        assert r.predictions == ["pos", "neg", "neg"] and r.accuracy == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="sizes"):
        ME.anchor_results(word_counts, ["neg", "pos"], examples, test, [41])
    with pytest.raises(ValueError, match="empty"):
        ME.anchor_results(word_counts, ["neg", "pos"], examples, [], [10])


def test_classify_rows_and_csv(model, tmp_path):
    clf = Classifier(model, None, "{text}:{label}", SIGNS)
    rows = CL.classify_rows(clf, ["nice, really", 'he said "no"', "x" * 500])
    assert list(rows[0]) == ["text", "prediction", "confidence", "score_+", "score_-", "score_=", "read", "error"]
    assert rows[0]["read"] == ""  # fixed demonstrations: nothing chosen per text
    too_long = rows.pop()  # longer than the window: reported on its row, the others are classified
    assert too_long["prediction"] == "" and "window" in too_long["error"] and not rows[0]["error"]
    for row in rows:
        scores = clf.scores(row["text"])
        assert row["prediction"] == max(scores, key=scores.get)
        assert 1 / 3 <= row["confidence"] <= 1
    path = CL.write_predictions_csv(rows, tmp_path / "out.csv")
    back = list(csv.DictReader(open(path, encoding="utf-8", newline="")))
    assert [r["text"] for r in back] == ["nice, really", 'he said "no"']
    assert float(back[1]["score_-"]) == pytest.approx(rows[1]["score_-"])
    assert CL.write_predictions_csv([], tmp_path / "none.csv").read_text().strip() == "text,prediction,confidence"
