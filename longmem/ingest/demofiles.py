"""Labelled demonstration files (CSV, TSV, JSONL): their ``DemoFormat``, their rows parsed and checked (columns,
labels, line numbers kept for messages), and their demonstrations written as text.

    fmt = DemoFormat(text_column="sentence", label_words={"0": "negative", "1": "positive"})
    rows = demo_rows(Path("train.tsv"), content, fmt)        # [(line, text, label), ...]
    meta = demo_texts(Path("train.tsv"), fmt, sink.part)    # each demonstration's text, in file order

``read_demos`` is the format registry's reader (``formats``): the extraction child runs it. Bad input raises
``InputError`` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from longmem.ingest.limits import ExtractLimits
from longmem.text.io import InputError

if TYPE_CHECKING:
    from longmem.ingest.documents import TextSink

log = logging.getLogger(__name__)


@dataclass
class DemoFormat:
    """How a labelled demonstration file (CSV/TSV/JSONL) becomes text."""
    template: str = "Review: {text} Sentiment: {label}"  # one demonstration; {text} and {label} fields
    # label value in the file -> word written into memory; None = the value itself
    label_words: dict[str, str] | None = None
    labels: list[str] | None = None  # allowed label values; None = the keys of label_words if given, else anything
    text_column: str = "text"  # column (CSV/TSV header name) or JSON key holding the text
    label_column: str = "label"
    # names for a header-less CSV/TSV (e.g. ["label", "text"]); None = the first row is the header
    columns: list[str] | None = None
    separator: str = "\n\n"  # between demonstrations


def labelled(p: Path, rows: list[tuple[int, str, str]], fmt: DemoFormat) -> tuple[list[tuple[str, str]],
                                                                                   list[str] | None]:
    """Parsed rows (line, text, label value) as (text, label word) pairs, every label checked against the format's
    allowed labels (``InputError`` naming the first bad line); also returns those allowed labels (None = any)."""
    if not rows:
        raise InputError(f"{p}: has no examples")
    allowed = fmt.labels if fmt.labels is not None else (list(fmt.label_words) if fmt.label_words else None)
    if allowed is not None:
        allowed = [str(a) for a in allowed]
        bad = [(line, label) for line, _, label in rows if label not in allowed]
        if bad:
            line, label = bad[0]
            raise InputError(f"{p}: line {line}: label {label!r} is not one of: {', '.join(allowed)} "
                             f"({len(bad)} of {len(rows)} rows have labels outside this set)")
    words = {str(k): v for k, v in (fmt.label_words or {}).items()}
    return [(text, words.get(label, label)) for _, text, label in rows], allowed


def demo_texts(p: Path, fmt: DemoFormat, emit: Callable[[str], None]) -> dict:
    """Parse a demonstration file, hand the text of each demonstration (``fmt.template`` filled in) to ``emit`` in
    file order, and return the facts kept with the document (template, labels, counts)."""
    check_template(p, fmt)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        log.warning("%s is not valid UTF-8 (%s); undecodable bytes were replaced with U+FFFD", p, e.reason)
        content = raw.decode("utf-8-sig", errors="replace")
    del raw
    rows = demo_rows(p, content, fmt)
    del content
    pairs, allowed = labelled(p, rows, fmt)
    counts: dict[str, int] = {}
    for text, word in pairs:
        emit(fmt.template.format(text=text, label=word))
        counts[word] = counts.get(word, 0) + 1
    return {"template": fmt.template, "label_words": fmt.label_words,
            "labels": allowed if allowed is not None else sorted({label for _, _, label in rows}),
            "n_examples": len(rows), "label_counts": counts}



def read_demos(path: Path, sink: TextSink, limits: ExtractLimits, demos: DemoFormat | None) -> tuple[str, dict]:
    """The registry's reader of demonstration files: each demonstration into ``sink``; no title, the facts of
    ``demo_texts``."""
    return "", demo_texts(path, demos or DemoFormat(), sink.part)


def check_template(p: Path, fmt: DemoFormat) -> None:
    """Refuse a template that does not use exactly the fields {text} and {label}."""
    fields = {name for _, name, _, _ in _parse_template(p, fmt.template) if name is not None}
    if fields != {"text", "label"}:
        raise InputError(f"{p}: the template {fmt.template!r} must use exactly the fields {{text}} and {{label}} "
                         f"(it uses: {', '.join(sorted(fields)) or 'none'})")


def _parse_template(p: Path, template: str) -> list:
    try:
        return list(string.Formatter().parse(template))
    except ValueError as e:
        raise InputError(f"{p}: the template {template!r} is not a valid format string: {e}") from e


def demo_rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line, text, label) rows of a demonstration file's ``content``, JSONL or CSV/TSV by ``p``'s suffix: the
    columns ``fmt`` names checked, line numbers kept for messages; empty texts refused unless ``skip_empty``."""
    parse = _jsonl_rows if p.suffix.lower() == ".jsonl" else _csv_rows
    return parse(p, content, fmt, skip_empty)


def _csv_rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line number, text, label) of every row of a CSV/TSV file (``skip_empty``: leave out rows without text)."""
    reader = csv.reader(io.StringIO(content, newline=""), delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
    header, rows = fmt.columns, []
    if header is not None:
        _check_columns(p, header, fmt)
    try:
        for row in reader:
            if not row:  # a blank line
                continue
            if header is None:
                header = [name.strip() for name in row]
                _check_columns(p, header, fmt)
                continue
            if len(row) != len(header):
                raise InputError(f"{p}: line {reader.line_num}: expected {len(header)} fields, got {len(row)}")
            rows.append(_example(p, reader.line_num, dict(zip(header, row)), fmt, skip_empty))
    except csv.Error as e:
        raise InputError(f"{p}: line {reader.line_num}: malformed CSV: {e}") from e
    return [r for r in rows if r is not None]


def _check_columns(p: Path, header: list[str], fmt: DemoFormat) -> None:
    for col in (fmt.text_column, fmt.label_column):
        if col not in header:
            raise InputError(f"{p}: has no '{col}' column (columns: {', '.join(header)})")


def _jsonl_rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line number, text, label) of every JSON object of a JSONL file (``skip_empty``: leave out rows without
    text)."""
    rows = []
    for n, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: line {n}: invalid JSON: {e}") from e
        except RecursionError as e:
            raise InputError(f"{p}: line {n}: the JSON is nested too deeply") from e
        if not isinstance(obj, dict):
            raise InputError(f"{p}: line {n}: expected a JSON object, got {type(obj).__name__}")
        for col in (fmt.text_column, fmt.label_column):
            if col not in obj:
                raise InputError(f"{p}: line {n}: has no '{col}' key (keys: {', '.join(obj)})")
        rows.append(_example(p, n, obj, fmt, skip_empty))
    return [r for r in rows if r is not None]


def _example(p: Path, line: int, record: dict, fmt: DemoFormat, skip_empty: bool = False) -> tuple | None:
    text, label = (v if isinstance(v, str) else ("" if v is None else json.dumps(v))
                   for v in (record[fmt.text_column], record[fmt.label_column]))
    if not text.strip():
        if skip_empty:
            return None
        raise InputError(f"{p}: line {line}: the text is empty")
    if not label.strip():
        raise InputError(f"{p}: line {line}: the label is empty")
    return line, text.strip(), label.strip()
