"""Demonstrations memory finds: a many-shot classifier's in-context demonstrations chosen for each input from the
bank that holds all of them, the rest staying in memory for the paper's fusion.

    finder = DemoFinder(bank, model, memory, template, labels)  # memory: the bank's (chunk size 2: the paper's)
    demos = finder.find("a gorgeous film", Choice(finder="fused", shots=20))
    classifier = Classifier(model, memory, template, labels, choose=finder.chooser(Choice()), calibrate=True)

A bank stores a demonstration file one demonstration per passage (``passages``' demonstrations mode), so the bank's
passage finders (``reading.PassageFinder``) rank demonstrations as they rank a book's passages:

- ``memory``: LongMem's own retrieval. The input, written as the classifier reads it ("Review: <text> Sentiment:"),
  runs through the model with the bank's memory; every chunk its memory layer retrieves votes for the demonstration
  holding it.
- ``lexical``: BM25 over the demonstrations' words (the bank's FTS5 index), queried with the input's text.
- ``fused``: both, by reciprocal rank fusion. ``none``: the classifier's fixed demonstrations (the paper's setting).

Choosing demonstrations by their similarity to the input is KATE's idea (Liu et al. 2021, "What makes good in-context
examples for GPT-3?"); as there, the closest demonstration is put last, next to the input. A passage that is not a
demonstration of this template and these labels (a book in the same bank) is never chosen, nor is one whose text is
the input's own: a labelled copy of the input would give its answer away.

``grow_bank`` writes demonstrations into a bank in steps (0, 100, 500, 2,000 ...), so the accuracy of a classifier can
be measured as its bank grows (``measure.accuracy_vs_memory``, ``longmem eval icl``).
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from longmem.ingest.readers import DemoFormat
from longmem.memory.memory import Memory
from longmem.storage.bank import Bank
from longmem.storage.passages import ChunkPlaces
from longmem.tasks.classify import Choice, Classifier
from longmem.tasks.examples import Example, prompt_parts
from longmem.tasks.measure import CurvePoint, default_sizes, evaluate
from longmem.tasks.reading import PassageFinder


@dataclass(frozen=True)
class Demo:
    """A demonstration found for an input."""

    text: str
    label: str
    formatted: str  # as written in the bank and read in the prompt: "Review: a gorgeous film Sentiment: positive"
    passage_id: int
    ranks: dict = field(default_factory=dict)  # finder -> rank that brought it (1 = best)


def demo_pattern(template: str) -> re.Pattern:
    """A regex reading a formatted demonstration back into its text and label (``template``'s literal parts, with
    the whitespace between them as written or any whitespace)."""
    if template.count("{text}") != 1 or template.count("{label}") != 1:
        raise ValueError(f"template {template!r} needs {{text}} and {{label}} once each")
    pieces = []
    for part in re.split(r"(\{text\}|\{label\})", template):
        if part in ("{text}", "{label}"):
            pieces.append(f"(?P<{part[1:-1]}>.+?)")
        else:  # literal words, any whitespace around and between them
            words = part.split()
            pieces.append(r"\s*" + r"\s+".join(re.escape(w) for w in words) + r"\s*" if words else r"\s*")
    rx = "".join(pieces)
    return re.compile(rx, re.DOTALL)


def parse_demo(pattern: re.Pattern, formatted: str) -> tuple[str, str] | None:
    """(text, label) of a formatted demonstration, or None when it is not one."""
    m = pattern.fullmatch(formatted.strip())
    return (m["text"].strip(), m["label"].strip()) if m else None


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def balanced(demos: Sequence[Demo], labels: Sequence[str], k: int) -> list[Demo]:
    """``k`` demonstrations taking the labels in turn, each label's best first (a label with none left is skipped),
    in the order of their rank."""
    queues = {w: [d for d in demos if d.label == w] for w in labels}
    chosen: list[Demo] = []
    while len(chosen) < k and any(queues.values()):
        for w in labels:
            if queues[w] and len(chosen) < k:
                chosen.append(queues[w].pop(0))
    rank = {id(d): i for i, d in enumerate(demos)}
    return sorted(chosen, key=lambda d: rank[id(d)])


class DemoFinder:
    """Ranks a bank's demonstrations for inputs to classify (see the module doc). ``memory``: the bank's memory as
    loaded (``Bank.load_memory``, possibly re-chunked); the bank stays open while the finder is used."""

    def __init__(self, bank: Bank, model, memory: Memory, template: str, labels: Sequence[str],
                 places: ChunkPlaces | None = None):
        self.model, self.template, self.labels = model, template, list(labels)
        self.passages = PassageFinder(bank, model, memory, places)
        self.pattern = demo_pattern(template)

    def query_ids(self, text: str) -> torch.Tensor:
        """(1, T) the input as the classifier reads it before a label word: the memory finder's query."""
        own = prompt_parts(self.template, text)[0]
        return self.model.backbone.tokenizer(own, return_tensors="pt", add_special_tokens=False).input_ids

    def find(self, text: str, choice: Choice) -> list[Demo]:
        """The ``choice.shots`` best demonstrations for ``text``, best first (none for finder "none")."""
        if not text.strip():
            raise ValueError("the text to classify is empty")
        if choice.finder == "none" or choice.shots == 0:
            return []
        ids = self.query_ids(text) if choice.finder in ("memory", "fused") else None
        out = []
        for f in self.passages.rank(text, choice.finder, choice.depth, question_ids=ids):
            parsed = parse_demo(self.pattern, f.passage.text)
            if parsed is None or parsed[1] not in self.labels or _same_text(parsed[0], text):
                continue
            out.append(Demo(parsed[0], parsed[1], f.passage.text.strip(), f.passage.id, dict(f.ranks)))
        return balanced(out, self.labels, choice.shots) if choice.balance else out[: choice.shots]

    def context(self, text: str, choice: Choice) -> list[str]:
        """The formatted demonstrations to read before ``text``, in prompt order: the best last, next to the text."""
        return [d.formatted for d in reversed(self.find(text, choice))]

    def chooser(self, choice: Choice) -> Callable[[str], list[str]]:
        """``context`` for ``choice``, as ``classify.Classifier.choose`` takes it."""
        return lambda text: self.context(text, choice)


def bank_examples(bank: Bank, template: str, labels: Sequence[str]) -> list:
    """Every demonstration of ``template`` stored in ``bank`` (its complete demonstration documents, one
    demonstration per passage) as a ``tasks.examples.Example``, in the order they were stored; passages that are not
    such a demonstration with one of ``labels`` are left out."""
    pattern, allowed, out = demo_pattern(template), set(labels), []
    for doc in bank.documents():
        if doc.kind != "demos" or doc.status != "complete" or doc.meta.get("template") != template:
            continue
        for _, text in bank.passage_texts(doc.id):
            parsed = parse_demo(pattern, text)
            if parsed is not None and parsed[1] in allowed:
                out.append(Example(*parsed))
    return out


def write_demos(path: Path, examples: Sequence) -> Path:
    """Examples (``.text``, ``.label``) as a JSONL file of {"text", "label"} rows, as bank ingestion reads them
    (with ``jsonl_format``)."""
    path.write_text("".join(json.dumps({"text": e.text, "label": e.label}) + "\n" for e in examples),
                    encoding="utf-8")
    return path


def jsonl_format(template: str) -> DemoFormat:
    """How bank ingestion reads a ``write_demos`` file: its "text" and "label" keys, written with ``template``."""
    return DemoFormat(template=template, text_column="text", label_column="label")


def grow_bank(bank: Bank, model, examples: Sequence, sizes: Sequence[int], template: str, scratch: Path,
              progress: Callable[[int, int], None] | None = None) -> Iterator[int]:
    """Write ``examples`` into ``bank`` in steps: after the bank holds the first ``size`` of them, yield ``size``
    (ascending sizes; each step ingests only the examples it adds, as one demonstration document). ``progress(done,
    total)`` counts examples written."""
    from longmem.ingest.pipeline import ingest  # ingestion sits above the bank and its finders

    sizes = sorted(set(sizes))
    if sizes and (sizes[0] < 0 or sizes[-1] > len(examples)):
        raise ValueError(f"memory sizes must lie in [0, {len(examples)}], got {list(sizes)}")
    fmt = jsonl_format(template)
    have = 0
    for size in sizes:
        if size > have:
            path = write_demos(scratch / f"demos-{have}-{size}.jsonl", examples[have:size])
            report = None
            if progress is not None:
                def report(d, t, *_, base=have, size=size):  # this file's tokens -> demonstrations so far
                    progress(base + (size - base) * d // max(t, 1), sizes[-1])
            ingest(bank, model, path, demos=fmt, title=f"demonstrations {have + 1}-{size}", progress=report)
            path.unlink()
            have = size
        yield size


def accuracy_vs_bank(model, template: str, labels: Sequence[str], context: Sequence[str], memory_examples: Sequence,
                     test: Sequence, choice: Choice, work_dir: Path, sizes: Sequence[int] | None = None,
                     calibrate: bool = False, chunk_size: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> list:
    """``measure.accuracy_vs_memory`` for a classifier that finds its prompt's demonstrations in its bank: the
    first ``size`` memory examples are written into a temporary bank under ``work_dir`` (``grow_bank``) and the test
    set is scored with ``choice``'s demonstrations from it and the bank's memory (re-chunked to ``chunk_size``), for
    each size. Size 0 has no bank to find in: the fixed ``context`` is read, memory empty. Returns ``CurvePoint``s."""
    from longmem.storage import BankDirectory

    sizes = default_sizes(len(memory_examples)) if sizes is None else sorted(set(sizes))
    if not test:
        raise ValueError("nothing to evaluate: the test set is empty")
    total = (sizes[-1] if sizes else 0) + len(sizes) * len(test)
    done, points = 0, []
    report = (lambda d: progress(d, total)) if progress is not None else (lambda d: None)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="curve-") as tmp:
        with BankDirectory(tmp).create("curve", model) as bank:
            for size in grow_bank(bank, model, memory_examples, sizes, template, Path(tmp),
                                  lambda d, _t: report(d + len(points) * len(test))):
                done = size
                memory = bank.load_memory(model) if size else model.new_memory(capacity=None)
                if chunk_size is not None and chunk_size != memory.chunk_size:
                    memory = memory.rechunk(chunk_size)
                choose = DemoFinder(bank, model, memory, template, labels).chooser(choice) if size else None
                classifier = Classifier(model, memory, template, list(labels), list(context), choose=choose,
                                        calibrate=calibrate)
                base = done + len(points) * len(test)
                result = evaluate(classifier, test, lambda d, _t, base=base: report(base + d))
                points.append(CurvePoint(size, result.accuracy, len(memory), len(test)))
    return points
