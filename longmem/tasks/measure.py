"""Measuring a classifier on held-out examples: accuracy, per-label precision/recall/F1 and the confusion matrix
(``evaluate``), the majority-class baseline, Wilson intervals, accuracy as the demonstrations in memory grow
(``accuracy_vs_memory``; with demonstrations found per input, ``longmem.tasks.demos.accuracy_vs_bank``), the
classifier a user would build instead from the same examples (``anchor_results``: sentence embeddings + logistic
regression), and their plots (matplotlib's Agg canvas on a ``Figure``: no pyplot, safe in a threaded web app).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from longmem.model.lm import SegmentLM
from longmem.tasks.classify import Classifier, Progress
from longmem.tasks.examples import Example, demo_stream
from longmem.tasks.readout import fit_cv
from longmem.util.plots import agg_figure

# -----------------------------------------------------------------------------
# evaluation

@dataclass
class LabelMetrics:
    precision: float  # of the texts predicted as this label, the share that have it (0 when none was predicted)
    recall: float  # of the texts with this label, the share predicted as it
    f1: float
    support: int  # texts with this label


@dataclass
class EvalResult:
    labels: list[str]
    accuracy: float
    per_label: dict[str, LabelMetrics]
    confusion: list[list[int]]  # [true label][predicted label], both in `labels` order
    truths: list[str]
    predictions: list[str]

    @property
    def macro_f1(self) -> float:
        return sum(m.f1 for m in self.per_label.values()) / len(self.per_label)

    def to_dict(self) -> dict:
        return {**asdict(self), "macro_f1": self.macro_f1, "n": len(self.truths)}

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        return cls(d["labels"], d["accuracy"], {w: LabelMetrics(**m) for w, m in d["per_label"].items()},
                   d["confusion"], d["truths"], d["predictions"])


def score_predictions(labels: Sequence[str], truths: Sequence[str], predictions: Sequence[str]) -> EvalResult:
    """Accuracy, per-label precision/recall/F1 and the confusion matrix of predictions against truths."""
    labels = list(labels)
    if len(truths) != len(predictions):
        raise ValueError(f"{len(truths)} true labels but {len(predictions)} predictions")
    if not truths:
        raise ValueError("nothing to evaluate: the test set is empty")
    index = {w: i for i, w in enumerate(labels)}
    for w in (*truths, *predictions):
        if w not in index:
            raise ValueError(f"label {w!r} is not one of the classifier's labels: {', '.join(labels)}")
    confusion = [[0] * len(labels) for _ in labels]
    for t, p in zip(truths, predictions):
        confusion[index[t]][index[p]] += 1
    per_label = {}
    for i, w in enumerate(labels):
        hit, predicted, support = confusion[i][i], sum(row[i] for row in confusion), sum(confusion[i])
        precision = hit / predicted if predicted else 0.0
        recall = hit / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[w] = LabelMetrics(precision, recall, f1, support)
    accuracy = sum(confusion[i][i] for i in range(len(labels))) / len(truths)
    return EvalResult(labels, accuracy, per_label, confusion, list(truths), list(predictions))


def evaluate(classifier: Classifier, test: Sequence[Example], progress: Progress | None = None) -> EvalResult:
    """Predict every test example (``progress(done, total)`` after each) and score the predictions."""
    predictions = classifier.predict_many([e.text for e in test], progress)
    return score_predictions(classifier.labels, [e.label for e in test], predictions)


def paired_gap(a: Sequence[bool], b: Sequence[bool]) -> tuple[float, float, int]:
    """Two classifiers on the same items (each right or not): the mean of a minus b in points, the half-width of its
    95% interval (normal, over the items' differences), and the number of items."""
    if len(a) != len(b) or not a:
        raise ValueError(f"a paired gap needs the same items on both sides, got {len(a)} and {len(b)}")
    d = [int(x) - int(y) for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / max(len(d) - 1, 1))
    return 100 * mean, 100 * 1.96 * sd / math.sqrt(len(d)), len(d)


def majority_accuracy(test: Sequence[Example]) -> float:
    """Accuracy of always answering the test set's most common label (a floor for any classifier)."""
    counts: dict[str, int] = {}
    for e in test:
        counts[e.label] = counts.get(e.label, 0) + 1
    return max(counts.values()) / len(test) if test else 0.0


# -----------------------------------------------------------------------------
# accuracy as the memory grows

@dataclass
class CurvePoint:
    n_memory: int  # demonstrations in memory
    accuracy: float  # on the test set
    memory_tokens: int  # searchable tokens in memory
    n_test: int = 0  # test examples scored

    @property
    def interval(self) -> tuple[float, float]:
        """95% interval of the accuracy over the test examples (Wilson)."""
        return wilson(round(self.accuracy * self.n_test), self.n_test)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% by default); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


CURVE_SIZES = (100, 500, 2000)  # demonstrations in memory a curve is measured at (besides 0 and all of them)


def default_sizes(n: int) -> list[int]:
    """Memory sizes to try for ``n`` available demonstrations: 0, those of ``CURVE_SIZES`` below n, and n."""
    return sorted({0, n, *(s for s in CURVE_SIZES if s < n)})


def accuracy_vs_memory(model: SegmentLM, template: str, labels: Sequence[str], context: Sequence[str],
                       memory_examples: Sequence[Example], test: Sequence[Example], sizes: Sequence[int] | None = None,
                       separator: str = "\n\n", progress: Progress | None = None,
                       context_separator: str = "\n", chunk_size: int | None = None,
                       calibrate: bool = False) -> list[CurvePoint]:
    """Test accuracy with the first ``size`` memory examples in an in-RAM memory, for each size (ascending; 0 =
    empty memory, in-context demonstrations only). The memory grows incrementally: each demonstration is encoded
    once. ``chunk_size`` retrieves with finer chunks than the model's (``Memory.rechunk``), as a bank's classifier
    may; ``calibrate`` scores as ``classify.Classifier`` does with it. ``progress(done, total)`` counts examples
    memorized plus texts predicted."""
    sizes = default_sizes(len(memory_examples)) if sizes is None else sorted(set(sizes))
    if not sizes or sizes[0] < 0 or sizes[-1] > len(memory_examples):
        raise ValueError(f"memory sizes must lie in [0, {len(memory_examples)}], got {list(sizes)}")
    if not test:
        raise ValueError("nothing to evaluate: the test set is empty")
    if sizes[-1] > 0 and not model.uses_memory:
        raise ValueError(f"{type(model).__name__} has no memory; only size 0 can be evaluated")
    memory = model.new_memory(capacity=None) if model.uses_memory else None
    classifier = Classifier(model, memory, template, list(labels), list(context), context_separator,
                            calibrate=calibrate)
    tok = model.backbone.tokenizer
    total, done, have, points = sizes[-1] + len(sizes) * len(test), 0, 0, []
    report = (lambda d: progress(d, total)) if progress is not None else (lambda d: None)
    for size in sizes:
        if size > have:
            text = demo_stream(template, memory_examples[have:size], separator)
            text = separator + text if have else text  # the stream continues where the last batch stopped
            ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids  # (1, T)
            batch = size - have
            # tokens memorized -> examples
            model.memorize(ids, memory, lambda d, t, base=done, batch=batch: report(base + batch * d // t))
            done, have = done + batch, size
        if memory is not None and chunk_size is not None:
            classifier.memory = memory.rechunk(chunk_size)  # shares the keys/values; only the chunk index is rebuilt
        result = evaluate(classifier, test, lambda d, _t, base=done: report(base + d))
        done += len(test)
        points.append(CurvePoint(size, result.accuracy, len(memory) if memory is not None else 0, len(test)))
    return points


# -----------------------------------------------------------------------------
# the anchor: what a user would build from the same examples

ANCHOR_LABEL = "sentence embeddings + logistic regression"


def fitted_results(x: torch.Tensor, xt: torch.Tensor, labels: Sequence[str], examples: Sequence[Example],
                   test: Sequence[Example], sizes: Sequence[int], seed: int = 0) -> list[tuple[int, EvalResult]]:
    """A logistic regression on the features ``x`` (M, F) of the first ``size`` ``examples`` at each size, its
    penalty chosen by cross-validation on them (``readout.fit_cv``, folds dealt by ``seed``), scored on ``test``
    (features ``xt`` (T, F)). Sizes whose examples hold fewer than two labels are left out (size 0 always). Returns
    [(size, its EvalResult)], ascending."""
    sizes = sorted({n for n in sizes if n > 0})
    if sizes and sizes[-1] > min(len(examples), len(x)):
        raise ValueError(f"sizes must lie in [1, {min(len(examples), len(x))}], got {sizes}")
    if not test:
        raise ValueError("nothing to evaluate: the test set is empty")
    out = []
    for n in sizes:
        seen = [e.label for e in examples[:n]]
        if len(set(seen)) < 2:
            continue
        predictions = fit_cv(x[:n].double(), seen, seed=seed).predict(xt.double())
        out.append((n, score_predictions(labels, [e.label for e in test], predictions)))
    return out


def anchor_results(embed: Callable[[list[str]], np.ndarray], labels: Sequence[str], examples: Sequence[Example],
                   test: Sequence[Example], sizes: Sequence[int], seed: int = 0) -> list[tuple[int, EvalResult]]:
    """The anchor classifier at each size (``fitted_results`` on ``embed``'s vectors, texts -> (N, E)): a logistic
    regression on the sentence embeddings of the first ``size`` ``examples``. Each text is embedded once."""
    top = max([n for n in sizes if n > 0], default=0)
    if top > len(examples):
        raise ValueError(f"anchor sizes must lie in [1, {len(examples)}], got {sorted(set(sizes))}")
    if not test:
        raise ValueError("nothing to evaluate: the test set is empty")
    x = torch.from_numpy(np.asarray(embed([e.text for e in examples[:top]]), dtype=np.float64))  # (M, E)
    xt = torch.from_numpy(np.asarray(embed([e.text for e in test]), dtype=np.float64))  # (T, E)
    return fitted_results(x, xt, labels, examples, test, sizes, seed)


# -----------------------------------------------------------------------------
# plots (PNG)

def plot_confusion(result: EvalResult, path: str | Path) -> Path:
    """The confusion matrix as a PNG: rows = true label, columns = predicted, counts written in the cells."""
    n = len(result.labels)
    fig = agg_figure(2.2 + 0.7 * n, 1.8 + 0.6 * n)
    ax = fig.subplots()
    ax.imshow(result.confusion, cmap="Blues", vmin=0)
    ax.set_xticks(range(n), result.labels, rotation=45 if n > 3 else 0, ha="right" if n > 3 else "center")
    ax.set_yticks(range(n), result.labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    top = max(max(row) for row in result.confusion) or 1
    for i, row in enumerate(result.confusion):
        for j, count in enumerate(row):
            ax.text(j, i, str(count), ha="center", va="center", color="white" if count > top / 2 else "black")
    ax.set_title(f"accuracy {result.accuracy:.1%} on {len(result.truths)}")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return Path(path)


def plot_curve(points: Sequence[CurvePoint], path: str | Path, baseline: float | None = None,
               baseline_label: str = "majority class", label: str = "LongMem",
               anchor: Sequence[CurvePoint] = (), anchor_label: str = ANCHOR_LABEL) -> Path:
    """Accuracy against the number of demonstrations in memory as a PNG, each point with its 95% interval over the
    test examples, an optional horizontal baseline, and the anchor's line (``anchor``: its accuracy against as many
    examples) where given."""
    fig = agg_figure(6, 4)
    ax = fig.subplots()
    for line, name, fmt in ((points, label, "o-"), (anchor, anchor_label, "^--")):
        if not line:
            continue
        acc = [100 * p.accuracy for p in line]
        bars = [[max(0.0, a - 100 * p.interval[0]) for a, p in zip(acc, line)],  # >= 0: Wilson's bound may
                [max(0.0, 100 * p.interval[1] - a) for a, p in zip(acc, line)]]  # round past a perfect score
        ax.errorbar([p.n_memory for p in line], acc, yerr=bars, fmt=fmt, capsize=3, label=f"{name} (95% interval)")
    if baseline is not None:
        ax.axhline(100 * baseline, color="gray", linestyle="--", label=baseline_label)
    ax.set_xlabel("demonstrations in memory")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"accuracy vs demonstrations in memory ({len(points)} sizes)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return Path(path)
