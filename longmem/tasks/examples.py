"""Labelled examples for a many-shot classifier: the paper's presets (templates and label words of its five
datasets, appendix D, and how the shared data's copies map label numbers to words), reading labelled files into
``Example``s, peeking at a file's columns, splitting examples into the prompt's demonstrations, memory's and a
held-out test set, and formatting them as the model reads them.

    labelled file --read_examples--> [Example(text, label word)]
        --split_examples--> context (k demonstrations in the prompt) | memory (many) | test
    memory examples --demo_stream--> one text for ``model.memorize`` (or a bank, see ``longmem.ingest``)
"""

from __future__ import annotations

import csv
import io
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from longmem.ingest import demofiles, formats, readers
from longmem.ingest.demofiles import DemoFormat
from longmem.text.io import InputError, read_text

log = logging.getLogger(__name__)

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
    pairs, _ = demofiles.labelled(p, _rows(p, _read_table(p), fmt, skip_empty), fmt)
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
    return demofiles.demo_rows(p, content, fmt, skip_empty)


def _read_table(p: Path, limit: int | None = None) -> str:
    """A CSV/TSV/JSONL file's text (its first ``limit`` bytes, cut after a line), refusing what is not one with the
    readers' own checks (``readers.file_head``, the format's size limit, ``readers.refuse_binary``)."""
    p, head, size = readers.file_head(p)
    fmt = formats.for_path(p)
    if fmt is None or not fmt.labelled:
        raise InputError(f"{p}: unsupported file type '{p.suffix or p.name}' for examples "
                         f"(supported: {', '.join(formats.DEMO_SUFFIXES)})")
    if limit is None:
        readers.check_size(p, fmt, size)
    readers.refuse_binary(p, head)
    with open(p, "rb") as f:
        raw = f.read(limit) if limit is not None else f.read()
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


def prompt_parts(template: str, text: str) -> tuple[str, str]:
    """(the text written in ``template`` up to its label, without trailing whitespace; the whitespace that goes with
    the label word): what a classifier reads before a label word, as the demonstrations were written."""
    prefix = template.split("{label}")[0].format(text=text.strip())
    own = prefix.rstrip()
    return own, prefix[len(own):]


def demo_stream(template: str, examples: Sequence[Example], separator: str = "\n\n") -> str:
    """Demonstrations as one text, as they are written into memory."""
    return separator.join(format_demo(template, e) for e in examples)


# -----------------------------------------------------------------------------
# a saved classifier
