"""``eval.icl``'s anchor: a logistic regression on sentence embeddings of the same memory demonstrations, at every
memory size of the curve, scored on the same test sentences, and shown in the curve's table beside LongMem; LongMem's
head, fitted the same way on the model's state and the embeddings, and the issue's targets against the anchor."""

from __future__ import annotations

import numpy as np

from longmem.eval.icl import Task, anchor_rows, head_rows
from longmem.eval.icl_report import ANCHOR, HEAD, Size, curve_table, head_targets, summarize
from longmem.tasks.examples import PRESETS, Example


def features(texts: list[str]) -> np.ndarray:
    """A stand-in for sentence embeddings (the shipped model's are tested in ``test_embedder``): word counts."""
    return np.array([[t.count("good"), t.count("bad"), len(t.split())] for t in texts], dtype=np.float32)


def task(seed: int = 0) -> Task:
    words = ["good", "bad"]
    demos = [Example(f"a {words[i % 2]} film number {i}", ["positive", "negative"][i % 2]) for i in range(60)]
    test = [Example(f"so {words[i % 2]}", ["positive", "negative"][i % 2]) for i in range(10)]
    test[0] = Example("so bad", "positive")  # a mislabelled test sentence: the anchor gets it wrong
    return Task(PRESETS["SST-2"], seed, [], demos, test)


def test_the_anchor_is_fitted_at_each_memory_size_and_scored_per_sentence():
    rows = anchor_rows(task(), Size(memory_demos=60, curve=[20, 500]), features)
    assert [(r["model"], r["memory"]) for r in rows] == [(f"{ANCHOR}@20", 20), (ANCHOR, 60)]
    for r in rows:
        assert r["items"]["label"] == "0" + "1" * 9 and r["label"] == r["calibrated"] == r["greedy"] == 0.9
        assert r["k"] == 0 and r["n"] == 10 and "agree" not in r


def test_the_curve_table_shows_the_anchor_beside_longmem():
    size = Size(sets=["SST-2"], shots=[4], memory_demos=60, curve=[20])
    runs = anchor_rows(task(), size, features)
    runs += [{"set": "SST-2", "seed": 0, "k": 4, "model": m, "memory": n, "greedy": 0.5, "label": 0.6,
              "calibrated": 0.7, "n": 10, "agree": 10} for m, n in (("longmem", 60), ("longmem@20", 20),
                                                                    ("longmem_empty", 0))]
    text = curve_table(summarize(runs), size, 4)
    anchor = next(line for line in text.splitlines() if "logistic regression" in line)
    assert anchor.count("90.0") == 2  # at 20 and at 60 examples; nothing at 0


class Stacked:
    """A stand-in for ``tasks.head.Featurizer``: the word counts, and a second column that reads "good" twice."""

    def __call__(self, texts):
        import torch
        return torch.from_numpy(np.concatenate([features(texts), 2 * features(texts)[:, :1]], 1))


def test_the_head_is_fitted_like_the_anchor_and_its_targets_are_judged_per_set():
    size = Size(sets=["SST-2"], shots=[4], memory_demos=60, curve=[20])
    head = head_rows(task(), size, Stacked())
    assert [(r["model"], r["memory"]) for r in head] == [(f"{HEAD}@20", 20), (HEAD, 60)]
    assert all(r["items"]["label"] == "0" + "1" * 9 and r["k"] == 0 for r in head)
    runs = head + anchor_rows(task(), size, features)
    notes = head_targets(runs, summarize(runs), size)
    assert "+0.0 ± 0.0 points (paired, 10 test sentences); by set SST-2 +0.0" in notes[0]
    assert "is not met" in notes[0] and "20 → 90.0, 60 → 90.0 (does not rise at every step)" in notes[1]
    better = [dict(r, label=1.0, items={"label": "1" * 10}) for r in head]  # the head right on every sentence
    notes = head_targets(better + anchor_rows(task(), size, features),
                         summarize(better + anchor_rows(task(), size, features)), size)
    assert "+10.0 ±" in notes[0] and "is met" in notes[0]
