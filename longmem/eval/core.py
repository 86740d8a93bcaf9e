"""What every evaluation suite shares: the models compared, the data, sizes, and a suite's result.

A suite (``longmem.eval.SUITES``) is a module with ``run(ctx: EvalContext) -> SuiteResult``. The context holds
the lineup: every model that suite compares, side by side in one run, under the same loops (``SegmentLM``):

- ``backbone_1k``: the frozen backbone with the same 1k local window as LongMem and no memory (the paper's GPT-2*);
- ``backbone_full``: the backbone attending to its native context at once (8k for SmolLM2), where it fits;
- ``memtrm``: the MemTRM baseline (``longmem.model.baselines.MemTRM``), when a trained checkpoint is given;
- ``longmem``: the backbone + trained SideNet + memory bank.

A suite's size is a dataclass with a ``quick`` instance (CI: seconds per suite on a 2-core CPU) and a ``full`` one
(the record, ``docs/results.md``); ``--set suite.field=value`` changes one field of either.
"""

from __future__ import annotations

import json
import math
import os
import time
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from longmem.eval.datasets.books import Document, book_split, tokenize_files
from longmem.model.baselines import BackboneLM
from longmem.model.lm import SegmentLM
from longmem.model.longmem import LongMemModel
from longmem.util.files import write_file_atomic
from longmem.util.names import current_names
from longmem.util.plots import agg_figure as figure  # noqa: F401 (the suites' plots)

Log = Callable[[str], None]

def legend_below(ax, ncol: int = 1, gap: float = 0.1) -> None:
    """The legend under the axes (and their tick labels, and an x-axis label with ``gap`` ~0.16), where it cannot
    hide the bars or lines of many models; save the figure with ``bbox_inches="tight"`` to keep all of it."""
    ax.legend(fontsize=7, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -gap), frameon=False)


@dataclass
class Entrant:
    """One model of a comparison: a row of every table."""

    key: str  # JSON key: "backbone_1k", "backbone_full", "memtrm", "longmem"
    label: str  # its name in tables
    lm: SegmentLM
    empty_of: str | None = None  # a memory-empty run: the key of the model it repeats without memory ("longmem")

    @property
    def fills_memory(self) -> bool:
        """Whether a model with memory gets the suite's memory (False: it runs with an empty one)."""
        return self.empty_of is None

    @property
    def context(self) -> int:
        return self.lm.segment_len


def lineup(model: LongMemModel, full_context: int | None = None, memtrm: SegmentLM | None = None) -> list[Entrant]:
    """The models compared with ``model``: the backbone with its window, the backbone at ``full_context`` tokens
    (default: its native context; left out when that is no longer than the window), MemTRM when given, LongMem."""
    bb, local = model.backbone, model.segment_len
    full = min(full_context or bb.spec.max_positions, bb.spec.max_positions)
    rows = [Entrant("backbone_1k", f"backbone, {_k(local)} context (the paper's GPT-2*)", BackboneLM(bb, local))]
    if full > local:
        rows.append(Entrant("backbone_full", f"backbone, {_k(full)} context", BackboneLM(bb, full)))
    if memtrm is not None:
        if memtrm.backbone.fingerprint() != bb.fingerprint():
            raise ValueError("the MemTRM checkpoint was trained for another backbone than LongMem's")
        rows.append(Entrant("memtrm", f"MemTRM ({_k(memtrm.segment_len)} local + memory)", memtrm))
    rows.append(Entrant("longmem", f"LongMem ({_k(local)} local + memory)", model))
    return rows


# the models that have a memory-empty twin: (name, what runs without memory)
WITH_MEMORY = {"longmem": ("LongMem", "the SideNet alone"), "memtrm": ("MemTRM", "its trained layer alone")}
EMPTY_LABELS = {k: f"{name}, memory empty ({alone})" for k, (name, alone) in WITH_MEMORY.items()}


def memory_empty(entrants: list[Entrant]) -> list[Entrant]:
    """MemTRM and LongMem again, keyed ``<key>_empty``, to be run with nothing in memory: the difference to the model
    with memory is what memory adds, the difference to the 1k backbone what training did without it (LongMem's
    SideNet, MemTRM's fine-tuned layer). Empty for a lineup without either."""
    return [Entrant(f"{e.key}_empty", EMPTY_LABELS[e.key], e.lm, empty_of=e.key)
            for e in entrants if e.key in EMPTY_LABELS]


def versus(results: dict, score, lower_is_better: bool, rivals=("backbone_1k", "memtrm")) -> str:
    """"LongMem beats the 1k backbone on 3 of 4, MemTRM on 2 of 4 (not on ArXiv)": ``results`` maps a model key to
    {column: result}, ``score(result)`` gives the number compared."""
    parts = []
    for rival in rivals:
        if rival not in results or "longmem" not in results:
            continue
        cols = list(results["longmem"])
        won = [c for c in cols if (score(results["longmem"][c]) < score(results[rival][c])) == lower_is_better
               and score(results["longmem"][c]) != score(results[rival][c])]
        lost = [c for c in cols if c not in won]
        name = {"backbone_1k": "the 1k-context backbone", "memtrm": "MemTRM"}[rival]
        parts.append(f"{name} on {len(won)} of {len(cols)}" + (f" (not on {', '.join(lost)})" if lost else ""))
    return "LongMem beats " + "; ".join(parts) + "." if parts else ""


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else f"{tokens:,}-token"


@dataclass
class EvalContext:
    model: LongMemModel  # the LongMem model evaluated (its backbone serves the baselines)
    entrants: list[Entrant]
    data_dir: Path  # shared data: books/, icl/, squad/, arxiv/, MANIFEST.md
    out_dir: Path  # JSON, markdown and PNG files of the suites
    quick: bool = False  # CI size
    seed: int = 0
    overrides: dict[str, dict[str, str]] = field(default_factory=dict)  # suite -> {size field: value}
    log: Log = print
    provenance: dict = field(default_factory=dict)  # how this run was made, stored with each suite's result
    resume: bool = False  # a long suite goes on from the work units an earlier run of it finished (``TaskLog``)
    _books: list[Document] | None = None

    @property
    def tokenizer(self):
        return self.model.backbone.tokenizer

    def entrant(self, key: str) -> Entrant | None:
        return next((e for e in self.entrants if e.key == key), None)

    def held_out_books(self) -> list[Document]:
        """The test split of the shared books (never trained on), tokenized once (cached on disk)."""
        if self._books is None:
            from longmem.util.data import cache_root

            _, test = book_split(self.data_dir)
            self._books = tokenize_files(test, self.tokenizer, cache_root() / "tokens")
        return self._books

    def size(self, suite: str, quick, full):
        """The suite's size: ``quick`` or ``full``, with this run's ``--set`` overrides applied."""
        base = quick if self.quick else full
        return apply_overrides(base, self.overrides.get(suite, {}), suite)

    def task_log(self, suite: str, size, selects: tuple[str, ...] = ()) -> "TaskLog":
        """The suite's finished work units in this run's folder (see ``TaskLog``), for ``size``; ``selects``: the
        size fields that only choose which units run (e.g. the sets and seeds), so that a run asking for fewer units
        (a report of what is done) or more (a longer run) reuses the units it shares with an earlier one."""
        same = {k: self.provenance.get(k) for k in SAME_RUN}
        machine = self.provenance.get("machine", {})
        made = {k: v for k, v in asdict(size).items() if k not in selects}
        signature = json.loads(json.dumps({"size": made, "seed": self.seed, "dtype": machine.get("dtype"),
                                           "int4": bool(machine.get("int4", False)), **same}))
        defaults = {k: v for k, v in asdict(type(size)()).items() if k not in selects}  # the size class's defaults
        defaults.update({k: v for k, v in SIZE_ADDED_LATER.items() if k in defaults})
        defaults = json.loads(json.dumps({"size": defaults, **ADDED_LATER}))
        return TaskLog(self.out_dir / f"{suite}.tasks.jsonl", signature, self.resume, self.log,
                       made_at=f"{self.provenance.get('commit', 'unknown')} on {machine.get('cpu', 'unknown')}",
                       defaults=defaults)


# what a resumed unit shares with the run, beside its size, seed and dtype
SAME_RUN = ("backbone", "sidenet_sha256", "topk", "chunk_size", "segment_len", "memtrm")  # the SideNet by its weights
# signature keys added after units were recorded without them, and the value every such unit was made with
ADDED_LATER = {"segment_len": 1024, "int4": False}  # int4: 4-bit models decoded 4 bits (``model.int4``)
# the same for size fields whose default changed since they were added (others: a unit without the field was made
# at the size class's default)
SIZE_ADDED_LATER = {"best_last": False, "reading_topk": 0, "search_excerpts": True, "backbone_stops": False}


def upgraded(signature: dict | None, defaults: dict | None = None) -> dict | None:
    """A recorded unit's signature as a run would write it today: renamed settings (here and in its size) under
    their current names, and keys added since (``defaults``: a signature at every default, its size included)
    at their defaults, which is what a unit recorded before a key existed was made with."""
    if not isinstance(signature, dict):
        return signature
    out = current_names(signature)
    if isinstance(out.get("size"), dict):
        out["size"] = current_names(out["size"])
    if defaults:
        out = {**{k: v for k, v in defaults.items() if k != "size"}, **out}
        if isinstance(out.get("size"), dict) and isinstance(defaults.get("size"), dict):
            out["size"] = {**defaults["size"], **out["size"]}
    return out


class TaskLog:
    """A long suite's finished work units (e.g. one ICL set under one seed), appended to a JSON-lines file as each
    finishes, so that a run cut off (a session's end) goes on where it stopped: with ``resume``, the units the file
    holds under the same ``signature`` (size, seed, models, dtype) are reused and those of other signatures are kept
    for the runs they belong to; without it the file starts afresh. A unit recorded before a setting was renamed or
    added to the signature is read as today's runs write it (``upgraded``; ``defaults``: the signature at every
    default).
    Each unit records the commit and CPU that made it (``made_at``, "<commit> on <cpu>"): a result names them all
    (``commits``); thread counts and machines may differ between the runs that share a record. Each line is written
    whole and flushed to disk before the next unit starts."""

    def __init__(self, path: Path, signature: dict, resume: bool, log: Log = print, made_at: str = "unknown",
                 defaults: dict | None = None):
        self.path, self.signature, self.made_at = Path(path), signature, made_at
        self.units: dict[str, object] = {}
        self.made: dict[str, str] = {}  # unit -> commit
        if resume and self.path.exists():
            kept = []
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut off by a kill: that unit runs again
                    continue
                kept.append(line + "\n")  # other runs' units stay: a run in another dtype or size loses nothing
                if upgraded(row.get("signature"), defaults) == signature:
                    self.units[row["key"]] = row["value"]
                    self.made[row["key"]] = row.get("commit", "unknown")
            write_file_atomic(self.path, "".join(kept).encode())  # whole lines only: the next unit starts its own
            log(f"resuming: {len(self.units)} finished units in {self.path.name}")
        elif self.path.exists():
            self.path.unlink()

    def get(self, key: str):
        """The value stored for unit ``key``, or None when it has not run."""
        return self.units.get(key)

    def put(self, key: str, value) -> None:
        """Record unit ``key`` as finished with ``value`` (JSON-able)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"signature": self.signature, "key": key, "commit": self.made_at, "value": value})
                    + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.units[key], self.made[key] = value, self.made_at

    def commits(self) -> list[str]:
        """Where the finished units were made ("<commit> on <cpu>"), in order of first use."""
        return list(dict.fromkeys(self.made.values()))


def apply_overrides(size, values: dict[str, str], suite: str = "suite"):
    """``size`` (a dataclass) with fields set from strings, converted to each field's type (lists: comma-separated)."""
    known = {f.name: f for f in fields(size)}
    try:
        hints = typing.get_type_hints(type(size))
    except (NameError, TypeError):  # an annotation that does not resolve: go by the current values alone
        hints = {}
    changes = {}
    for name, text in values.items():
        if name not in known:
            raise ValueError(f"{suite} has no size setting {name!r} (it has: {', '.join(known)})")
        current = getattr(size, name)
        try:
            if isinstance(current, bool):
                value = text.lower() in ("1", "true", "yes")
            elif isinstance(current, (list, tuple)):
                of = [a for a in typing.get_args(hints.get(name)) if isinstance(a, type)]  # list[int] -> int
                kind = of[0] if of else type(current[0]) if current else str
                value = type(current)(kind(x) for x in text.split(",") if x)
            else:
                value = type(current)(text)
        except ValueError:
            raise ValueError(f"{suite}.{name}={text!r}: expected {type(current).__name__}") from None
        changes[name] = value
    return replace(size, **changes)


@dataclass
class SuiteResult:
    suite: str  # registry name, e.g. "books"
    title: str  # e.g. "Long-context language modelling (paper table 3)"
    tables: list[str]  # markdown tables, in order
    data: dict  # every number behind the tables (JSON)
    size: dict  # the size it ran at
    plots: list[str] = field(default_factory=list)  # PNG file names in the output folder
    notes: list[str] = field(default_factory=list)  # what a reader must know to read the tables
    seconds: float = 0.0
    provenance: dict = field(default_factory=dict)  # command, commit, date, machine, models (``longmem eval`` fills it)

    def markdown(self, plot_dir: str = ".") -> str:
        parts = [f"## {self.title}", "", *(t + "\n" for t in self.tables)]
        parts += [f"- {n}" for n in self.notes]
        parts += [""] + [f"![{p}]({plot_dir}/{p})" for p in self.plots]
        size = ", ".join(f"{k} {v}" for k, v in self.size.items())
        parts += ["", f"Size: {size}. Wall time {self.seconds / 60:.1f} min."]
        return "\n".join(parts).strip() + "\n"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "SuiteResult":
        """A result as ``to_json`` wrote it, settings renamed since under their current names (size, provenance)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for k in ("size", "provenance"):
            if isinstance(kw.get(k), dict):
                kw[k] = current_names(kw[k])
        return cls(**kw)


class Timer:
    def __init__(self):
        self.t0 = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0


def ppl(nll: float, tokens: int) -> float:
    return math.exp(nll / tokens) if tokens else float("nan")


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    if not values:
        return float("nan"), float("nan")
    m = sum(values) / len(values)
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return m, math.sqrt(var)


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A markdown table; ``align`` one char per column, "l" or "r" (default: first left, the rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
