"""A many-shot classifier builder: the paper's in-context learning with demonstrations in memory (section 4.3).

The flow, top to bottom:

    labelled file --read_examples--> [Example(text, label word)]
        --split_examples--> context (k demonstrations in the prompt) | memory (many, in the memory bank) | test
    memory examples --demo_stream--> one text --tokenizer--> model.memorize (or a persistent bank, see ingest)
    tasks.Classifier(template, labels, context) + memory --evaluate(test)--> accuracy, per-label metrics, confusion
    accuracy_vs_memory: the same test set scored while the memory grows (0 = in-context only); with demonstrations
        chosen per input from the bank, ``demos.accuracy_vs_bank``
    ClassifierSpec: what the app saves (as JSON) to rebuild the classifier later; classify_rows: label a whole file

``PRESETS`` holds the paper's templates (appendix D) and how the shared copies of its datasets (``icl/`` of the
shared data, the LM-BFF "original" layout) map label numbers to label words. Plots use matplotlib's Agg canvas on
a ``Figure`` (no pyplot, no global backend switch), so they are safe in a threaded web app.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from . import readers
from .lm import SegmentLM
from .readers import DemoFormat
from .tasks import Classifier
from .text import InputError, read_text

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)
PEEK_ROWS = 5  # rows shown by peek_columns
PEEK_BYTES = 1 << 20  # peek_columns reads at most this much of a file


# -----------------------------------------------------------------------------
# presets: the paper's datasets and templates

@dataclass(frozen=True)
class Preset:
    name: str  # as in the paper's table 5
    template: str  # one demonstration (appendix D)
    label_words: dict[str, str]  # label value in the files -> label word (in the order the words are listed)
    folder: str  # the set's folder under the shared data's icl/
    train_file: str = "train.csv"  # demonstrations (context and memory) are drawn from here
    eval_file: str = "test.csv"  # the split the official evaluation scored
    columns: tuple[str, ...] | None = ("label", "text")  # names of a header-less file's columns; None = has a header
    text_column: str = "text"
    label_column: str = "label"

    @property
    def labels(self) -> list[str]:
        return list(self.label_words.values())

    def demo_format(self, separator: str = "\n\n") -> DemoFormat:
        """How the readers (and bank ingestion) read this set's files."""
        return DemoFormat(template=self.template, label_words=dict(self.label_words), text_column=self.text_column,
                          label_column=self.label_column, columns=list(self.columns) if self.columns else None,
                          separator=separator)

    def paths(self, data_dir: str | Path) -> tuple[Path, Path]:
        """(train file, evaluation file) under ``data_dir`` (the shared ``data`` folder)."""
        folder = Path(data_dir) / "icl" / self.folder
        return folder / self.train_file, folder / self.eval_file

    def read(self, data_dir: str | Path) -> tuple[list[Example], list[Example]]:
        """(train examples, evaluation examples) of this set under ``data_dir``, rows without text left out."""
        return tuple(read_examples(path, self.demo_format(), skip_empty=True) for path in self.paths(data_dir))


SENTIMENT = "Review: {text} Sentiment: {label}"
TYPE = "input: {text} type: {label}"
# label numbers as in the LM-BFF "original" files, checked against the texts: SST-2/SST-5 share sentences (SST-2 1
# is SST-5 3-4), MPQA 0 = "complaining", "failing to support"; Subj 0 = review snippets (subjective), 1 = plot
# summaries (objective)
PRESETS: dict[str, Preset] = {
    "SST-2": Preset("SST-2", SENTIMENT, {"1": "positive", "0": "negative"}, "SST-2", "train.tsv", "dev.tsv",
                    columns=None, text_column="sentence"),
    "MR": Preset("MR", SENTIMENT, {"1": "positive", "0": "negative"}, "mr"),
    "MPQA": Preset("MPQA", SENTIMENT, {"1": "positive", "0": "negative"}, "mpqa"),
    # the official evaluation used SST-5's dev set, shipped only as space-separated stsa.fine.dev: test.csv here
    "SST-5": Preset("SST-5", TYPE, {"0": "terrible", "1": "bad", "2": "okay", "3": "good", "4": "great"}, "sst-5"),
    "Subj": Preset("Subj", TYPE, {"1": "objective", "0": "subjective"}, "subj"),
}


# -----------------------------------------------------------------------------
# examples: reading labelled files

@dataclass(frozen=True)
class Example:
    text: str
    label: str  # the label word (after the preset's or the user's label_words mapping)


def read_examples(path: str | Path, fmt: DemoFormat, skip_empty: bool = False) -> list[Example]:
    """Every row of a CSV/TSV/JSONL file as an Example, parsed and checked as bank ingestion does (``readers``):
    bad input raises ``InputError`` naming the file, the line and the problem. ``skip_empty`` leaves out rows
    whose text is blank instead (MPQA's train.csv has three)."""
    p = Path(path)
    pairs, _ = readers.labelled(p, _rows(p, _read_table(p), fmt, skip_empty), fmt)
    return [Example(text, word) for text, word in pairs]


def read_texts(path: str | Path, text_column: str = "text", columns: list[str] | None = None) -> list[str]:
    """The texts of a file to classify (no labels needed): a column of a CSV/TSV/JSONL file, or the non-blank lines
    of a .txt file."""
    p = Path(path)
    if p.suffix.lower() == ".txt":
        return [line.strip() for line in read_text(p).splitlines() if line.strip()]
    # the text column doubles as the label column: the readers then check only that column (and empty texts)
    fmt = DemoFormat(text_column=text_column, label_column=text_column, columns=columns)
    texts = [text for _, text, _ in _rows(p, _read_table(p), fmt)]
    if not texts:
        raise InputError(f"{p}: has no texts")
    return texts


def peek_columns(path: str | Path, has_header: bool = True) -> tuple[list[str], list[list[str]]]:
    """(column names, first rows) of a CSV/TSV/JSONL file, for choosing the text and label columns. A header-less
    file's columns are named "column 1", "column 2", ... (pass them as ``DemoFormat.columns``); a JSONL file's
    are its objects' keys."""
    p = Path(path)
    content = _read_table(p, limit=PEEK_BYTES)
    if p.suffix.lower() == ".jsonl":
        objs = []
        for n, line in enumerate(content.splitlines(), start=1):
            if line.strip() and len(objs) < PEEK_ROWS:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{p}: line {n}: invalid JSON: {e}") from e
                if not isinstance(obj, dict):
                    raise InputError(f"{p}: line {n}: expected a JSON object, got {type(obj).__name__}")
                objs.append(obj)
        columns = list(dict.fromkeys(k for obj in objs for k in obj))
        rows = [[_cell(obj.get(k)) for k in columns] for obj in objs]
    else:
        reader = csv.reader(io.StringIO(content, newline=""), delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
        rows = []
        try:
            for row in reader:
                if not row:  # a blank line
                    continue
                if rows and len(row) != len(rows[0]):
                    raise InputError(f"{p}: line {reader.line_num}: expected {len(rows[0])} fields, got {len(row)}")
                rows.append(row)
                if len(rows) == PEEK_ROWS + has_header:
                    break
        except csv.Error as e:
            raise InputError(f"{p}: line {reader.line_num}: malformed CSV: {e}") from e
        if has_header:
            columns = [name.strip() for name in rows.pop(0)] if rows else []
            if len(set(columns)) != len(columns) or not all(columns):
                raise InputError(f"{p}: the header has blank or repeated column names ({', '.join(columns)}); "
                                 "rename them, or read the file as header-less")
        else:
            columns = [f"column {i + 1}" for i in range(len(rows[0]) if rows else 0)]
    if not rows:
        raise InputError(f"{p}: has no rows" + (" after its header" if has_header and columns else ""))
    return columns, rows


def _rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line, text, label) rows through the readers' own parsers (column checks, line numbers, messages)."""
    parse = readers._jsonl_rows if p.suffix.lower() == ".jsonl" else readers._csv_rows
    return parse(p, content, fmt, skip_empty)


def _read_table(p: Path, limit: int | None = None) -> str:
    """A CSV/TSV/JSONL file's text (its first ``limit`` bytes, cut after a line), refusing what is not one."""
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    if p.suffix.lower() not in readers.DEMO_EXTS:
        raise InputError(f"{p}: unsupported file type '{p.suffix or p.name}' for examples "
                         f"(supported: {', '.join(readers.DEMO_EXTS)})")
    size = p.stat().st_size
    if size == 0:
        raise InputError(f"{p}: the file is empty")
    if limit is None and size > readers.MAX_EXTRACT_BYTES:
        raise InputError(f"{p}: {size / 2**20:.0f} MiB is larger than the {readers.MAX_EXTRACT_BYTES // 2**20} MiB "
                         "limit for example files")
    with open(p, "rb") as f:
        raw = f.read(limit) if limit is not None else f.read()
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InputError(f"{p}: is UTF-16 encoded; save it as UTF-8 first")
    if b"\x00" in raw[:readers.SNIFF_BYTES]:
        raise InputError(f"{p}: looks like a binary file, not text")
    if limit is not None and size > limit:
        raw = raw[:raw.rfind(b"\n") + 1] or raw
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        log.warning("%s is not valid UTF-8 (%s); undecodable bytes were replaced with U+FFFD", p, e.reason)
        return raw.decode("utf-8-sig", errors="replace")


def _cell(v) -> str:
    return v if isinstance(v, str) else ("" if v is None else json.dumps(v))


# -----------------------------------------------------------------------------
# splitting and formatting demonstrations

@dataclass
class Split:
    context: list[Example]  # k-shot demonstrations for the prompt
    memory: list[Example]  # demonstrations for the memory bank
    test: list[Example]  # held out for evaluation


def split_examples(examples: Sequence[Example], n_context: int, n_memory: int | None, n_test: int,
                   seed: int = 0) -> Split:
    """Disjoint random context / memory / test sets, the same for the same seed. The context holds one example of
    every label first (when ``n_context`` allows), then random ones, in random order. ``n_memory=None`` puts every
    example left over into memory."""
    counts = {"n_context": n_context, "n_memory": n_memory or 0, "n_test": n_test}
    for name, n in counts.items():
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    n_memory = len(examples) - n_context - n_test if n_memory is None else n_memory
    need = n_context + max(n_memory, 0) + n_test
    if n_memory < 0 or need > len(examples):
        raise ValueError(f"not enough examples: {n_context} in context + {max(n_memory, 0)} in memory + {n_test} "
                         f"to test = {need}, but there are {len(examples)}")
    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    first: dict[str, int] = {}  # label -> its first example in the shuffled order
    for i in order:
        first.setdefault(examples[i].label, i)
    context = list(first.values())[:n_context]
    taken = set(context)
    context += [i for i in order if i not in taken][:n_context - len(context)]
    rng.shuffle(context)
    taken = set(context)
    rest = [i for i in order if i not in taken]
    pick = lambda idx: [examples[i] for i in idx]  # noqa: E731
    return Split(pick(context), pick(rest[n_test:n_test + n_memory]), pick(rest[:n_test]))


def format_demo(template: str, example: Example) -> str:
    """One demonstration, e.g. "Review: a gorgeous film Sentiment: positive"."""
    return template.format(text=example.text, label=example.label)


def demo_stream(template: str, examples: Sequence[Example], separator: str = "\n\n") -> str:
    """Demonstrations as one text, as they are written into memory."""
    return separator.join(format_demo(template, e) for e in examples)


# -----------------------------------------------------------------------------
# a saved classifier

@dataclass
class ClassifierSpec:
    """Everything needed to rebuild a classifier over its bank: the prompt side and the evaluation set."""
    name: str
    template: str  # demonstrations' template, e.g. "Review: {text} Sentiment: {label}"
    labels: list[str]  # label words
    context: list[str] = field(default_factory=list)  # formatted demonstrations in the prompt (k-shot)
    separator: str = "\n"  # between the context demonstrations and the text
    source: str = ""  # name of the file the demonstrations came from
    n_memory: int = 0  # demonstrations written into the bank's memory
    n_test: int = 0  # held-out examples
    seed: int = 0  # of the split
    test: list[Example] = field(default_factory=list)  # the held-out examples
    last_eval: dict | None = None  # EvalResult.to_dict() of the latest evaluation
    # the demonstrations in the prompt: "none" = the fixed ``context``; "fused", "memory" or "lexical" = the ``shots``
    # best of the bank's found for each text (``longmem.demos``), ``balance``d over the labels or not
    finder: str = "none"
    shots: int = 4
    balance: bool = False
    calibrate: bool = False  # contextual calibration (``tasks.calibrate``)

    def classifier(self, model: SegmentLM, memory, demos=None) -> Classifier:
        """The classifier over ``memory``; ``demos`` (a ``demos.DemoFinder`` over the bank) chooses the prompt's
        demonstrations when ``finder`` is not "none"."""
        choose = None
        if self.finder != "none":
            if demos is None:
                raise ValueError(f"classifier {self.name!r} finds its demonstrations in its bank: give it a DemoFinder")
            from .demos import Choice  # the finder's settings; demos itself builds on this module

            choose = demos.chooser(Choice(self.finder, self.shots, self.balance))
        return Classifier(model, memory, self.template, list(self.labels), list(self.context), self.separator,
                          choose=choose, calibrate=self.calibrate)

    def to_dict(self) -> dict:
        return asdict(self)  # Examples become {"text", "label"}; all values JSON-safe

    @classmethod
    def from_dict(cls, d: dict) -> "ClassifierSpec":
        missing = [k for k in ("name", "template", "labels") if k not in d]
        if missing:
            raise ValueError(f"a saved classifier needs {', '.join(missing)}")
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}  # fields added by later versions are ignored
        kw["test"] = [Example(e["text"], e["label"]) for e in d.get("test", [])]
        return cls(**kw)


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
                       context_separator: str = "\n", csz: int | None = None,
                       calibrate: bool = False) -> list[CurvePoint]:
    """Test accuracy with the first ``size`` memory examples in an in-RAM memory, for each size (ascending; 0 =
    empty memory, in-context demonstrations only). The memory grows incrementally: each demonstration is encoded
    once. ``csz`` retrieves with finer chunks than the model's (``MemoryBank.rechunk``), as a bank's classifier
    may; ``calibrate`` scores as ``tasks.Classifier`` does with it. ``progress(done, total)`` counts examples memorized
    plus texts predicted."""
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
            model.memorize(ids, memory, lambda d, t, base=done: report(base + batch * d // t))  # tokens -> examples
            done, have = done + batch, size
        if memory is not None and csz is not None:
            classifier.memory = memory.rechunk(csz)  # shares the keys/values; only the chunk index is rebuilt
        result = evaluate(classifier, test, lambda d, _t, base=done: report(base + d))
        done += len(test)
        points.append(CurvePoint(size, result.accuracy, len(memory) if memory is not None else 0, len(test)))
    return points


# -----------------------------------------------------------------------------
# plots (PNG)

def agg_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)  # the Agg canvas for this figure only: no pyplot, no global backend
    return fig


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
               baseline_label: str = "majority class", label: str = "LongMem") -> Path:
    """Accuracy against the number of demonstrations in memory as a PNG, each point with its 95% interval over the
    test examples, and an optional horizontal baseline."""
    fig = agg_figure(6, 4)
    ax = fig.subplots()
    acc = [100 * p.accuracy for p in points]
    bars = [[a - 100 * p.interval[0] for a, p in zip(acc, points)],
            [100 * p.interval[1] - a for a, p in zip(acc, points)]]
    ax.errorbar([p.n_memory for p in points], acc, yerr=bars, fmt="o-", capsize=3, label=f"{label} (95% interval)")
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


# -----------------------------------------------------------------------------
# classifying a whole file

def classify_rows(classifier: Classifier, texts: Sequence[str], progress: Progress | None = None) -> list[dict]:
    """One row per text: the text, the predicted label, its probability among the labels ("confidence"),
    log P(word | prompt, memory) of every label word as "score_<word>" (calibrated when the classifier is), "read":
    the demonstrations its prompt held, one per line, when they are chosen per text (else empty), and "error": why a
    text could not be classified (e.g. longer than the window), empty otherwise. One bad row never loses the
    others."""
    rows = []
    for i, text in enumerate(texts):
        try:
            scores = classifier.scores(text)
        except ValueError as e:
            rows.append({"text": text, "prediction": "", "confidence": None,
                         **{f"score_{w}": None for w in classifier.labels}, "read": "", "error": str(e)})
        else:
            best = max(scores, key=scores.get)
            confidence = 1 / sum(math.exp(s - scores[best]) for s in scores.values())  # softmax over the labels
            read = "\n".join(classifier.read(text)) if classifier.choose is not None else ""
            rows.append({"text": text, "prediction": best, "confidence": confidence,
                         **{f"score_{w}": s for w, s in scores.items()}, "read": read, "error": ""})
        if progress is not None:
            progress(i + 1, len(texts))
    return rows


def write_predictions_csv(rows: Sequence[dict], path: str | Path) -> Path:
    """``classify_rows`` output as a UTF-8 CSV file with a header."""
    columns = list(rows[0]) if rows else ["text", "prediction", "confidence"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)
