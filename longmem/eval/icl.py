"""Suite 3, memory-augmented in-context learning (paper table 5): SST-2, MR, Subj, SST-5, MPQA.

For each set and seed (a *unit*, recorded as it finishes, ``--resume``): k demonstrations (k = 4 and 20) go into the
prompt, ``memory_demos`` (2,000) more into memory (chunk size 2, as the paper's), and test sentences from the set's
evaluation file are classified with the paper's templates (``longmem.tasks.examples.PRESETS``). The rows:

- the 1k backbone reads the k fixed demonstrations only (the paper's k-shot GPT-2*);
- the full-context backbone (8k) also reads as many of the memory demonstrations as fit before them;
- LongMem as the paper runs it: the k fixed demonstrations, the 2,000 in memory (a bank, as the app writes one);
- LongMem reading the k demonstrations its bank finds for each sentence (``longmem.tasks.demos``: memory, words, fused),
  the 2,000 in memory;
- the backbone reading the k demonstrations BM25 finds (retrieval-augmented prompting, what a user would pick
  instead of a memory model: KATE's method with a lexical retriever);
- MemTRM and the memory-empty twins; the majority class of each test sample, the floor;
- the classifier a user would build instead from the same labelled examples (``ANCHOR``): sentence embeddings of the
  memory demonstrations (the shipped all-MiniLM-L6-v2) and a logistic regression fitted on them, its penalty chosen
  by cross-validation on those demonstrations (``tasks.readout``), at each memory size of the curve too. Its units are
  recorded apart (``<set>/<seed>/anchor``), so a record made before it existed gains it without running again;
- LongMem's classifier head (``HEAD``, the app's default classifier, ``tasks.head``): the LongMem model's backbone
  state at each text's prompt end stacked with its sentence embedding, a logistic regression fitted the same way on
  the same memory demonstrations (at each size of the curve too); its units apart as well (``<set>/<seed>/head``).

LongMem's bank grows through ``curve`` (100, 500) to ``memory_demos``: at each size, the fixed and the found rows at
the most shots are scored again, for the accuracy-vs-demonstrations curve (0 = the memory-empty twin).

Three protocols, all from one forward pass per test sentence after its demonstrations: the paper's (the greedy next
token must start the gold label word: " pos" or " positive" for " positive"), label-word scoring (the label word with
the highest log-probability wins, ``longmem.tasks.classify.Classifier``'s rule), and label-word scoring calibrated
against the content-free input "N/A" after the same demonstrations (``classify.calibrate``). Accuracy is the mean over
seeds with a 95% interval over the pooled test sentences; the targets compare configurations on the same sentences
(paired). This module runs the suite and records its rows; ``eval.icl_report`` turns them into its tables, targets and
plots.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from longmem.eval.core import Entrant, EvalContext, SuiteResult, Timer, memory_empty
from longmem.eval.icl_report import (
    ANCHOR,
    HEAD,
    HEAD_LABEL,
    Size,
    curve_table,
    fitted_points,
    head_targets,
    plot_curve,
    plot_icl,
    results_table,
    summarize,
    targets,
    verdict,
)
from longmem.eval.scoring import Prefix
from longmem.memory.memory import Memory
from longmem.model.lm import SegmentLM
from longmem.storage import BankDirectory
from longmem.tasks.classify import Choice, calibrate
from longmem.tasks.demos import DemoFinder, grow_bank
from longmem.tasks.examples import PRESETS, Example, Preset, demo_stream, format_demo, prompt_parts, split_examples
from longmem.tasks.head import FEATURES, Featurizer
from longmem.tasks.measure import ANCHOR_LABEL, anchor_results, fitted_results, majority_accuracy
from longmem.tasks.readout import FOLDS, L2_GRID

SEPARATOR = "\n"  # between the prompt's demonstrations (and before the test sentence)
MEMORY_SEPARATOR = "\n\n"  # between demonstrations in memory, as a bank ingests them
TEST_ROOM = 256  # window tokens kept free after the demonstrations, for a test sentence and its label
CONTENT_FREE = "N/A"  # the content-free input of contextual calibration (Zhao et al. 2021)
ANCHOR_FIT = {"folds": FOLDS, "l2_grid": list(L2_GRID)}  # how the anchor's penalty is chosen: a recorded anchor unit
#                                                          made otherwise is made again

QUICK = Size(sets=["SST-2"], shots=[4], memory_demos=100, seeds=1, test=8, curve=[40])
FULL = Size()


@dataclass
class Task:
    """One set under one seed: the demonstrations and the test sample every model sees."""

    preset: Preset
    seed: int
    context: list[Example]  # the largest k's demonstrations (smaller k: ``shots``)
    memory: list[Example]
    test: list[Example]

    def shots(self, k: int) -> list[Example]:
        """k of the context demonstrations, one of each label first where k allows, in their context order."""
        first: dict[str, int] = {}
        for i, e in enumerate(self.context):
            first.setdefault(e.label, i)
        chosen = list(first.values())[:k]
        chosen += [i for i in range(len(self.context)) if i not in chosen][: k - len(chosen)]
        return [self.context[i] for i in sorted(chosen)]


def make_task(preset: Preset, train: Sequence[Example], evaluation: Sequence[Example], k: int, n_memory: int,
              n_test: int, seed: int) -> Task:
    """Disjoint context and memory demonstrations from ``train`` and a test sample of ``evaluation``, by seed."""
    split = split_examples(train, n_context=k, n_memory=n_memory, n_test=0, seed=seed)
    test = list(evaluation)
    if n_test and n_test < len(test):
        test = random.Random(seed).sample(test, n_test)
    return Task(preset, seed, split.context, split.memory, test)


@dataclass
class Scored:
    greedy: list[bool]  # the paper's protocol, per test sentence
    label: list[bool]  # label-word scoring, per test sentence
    predictions: list[str]  # label-word predictions
    calibrated: list[bool] = field(default_factory=list)  # label-word scoring after contextual calibration

    @property
    def greedy_acc(self) -> float:
        return sum(self.greedy) / len(self.greedy) if self.greedy else float("nan")

    @property
    def label_acc(self) -> float:
        return sum(self.label) / len(self.label) if self.label else float("nan")

    @property
    def calibrated_acc(self) -> float:
        return sum(self.calibrated) / len(self.calibrated) if self.calibrated else float("nan")

    @property
    def agree(self) -> int:
        """Test sentences on which the two protocols give the same verdict."""
        return sum(g == w for g, w in zip(self.greedy, self.label))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def starts_label(piece: str, gap: str, label: str) -> bool:
    """The paper's protocol: the greedy next token (decoded ``piece``) begins the gold label word as written after
    the prompt (``gap`` + ``label``, e.g. " positive"): " pos" and " positive" do, "pos", " " and " positively" do
    not."""
    return bool(piece.strip()) and (gap + label).startswith(piece)


def label_scores(lm: SegmentLM, memory: Memory | None, prefix: Prefix | None, context: list[int], text: str,
                 template: str, labels: list[str]):
    """(log P of each label word, (V,) next-token log-probabilities) for ``text`` after ``context`` (read once as
    ``prefix``; None when the context is empty)."""
    tok = lm.backbone.tokenizer
    own, gap = prompt_parts(template, text)
    ids = encode(tok, own)
    words = {w: encode(tok, gap + w) for w in labels}
    longest = max(len(t) for t in words.values())
    if prefix is not None and len(ids) + longest <= prefix.room:
        state = prefix.extend(ids)
    else:  # a long sentence: read context + sentence afresh, cut from the left to fit the window
        state = Prefix.read(lm, (list(context) + ids)[-(lm.segment_len - longest):], memory)
    logp = state.next_logprobs()
    return {w: float(logp[t[0]]) if len(t) == 1 else float(state.logprobs(t).sum()) for w, t in words.items()}, logp


def classify(lm: SegmentLM, memory: Memory | None, context_ids: list[int], template: str, labels: list[str],
             test: Sequence[Example], contexts: Sequence[list[int]] | None = None) -> Scored:
    """Both protocols, and label-word scoring calibrated against the content-free input "N/A" read after the same
    demonstrations (``classify.calibrate``), for every test sentence after ``context_ids`` (read once), with ``memory``;
    ``contexts``: one context per test sentence instead (demonstrations found for it; a context equal to the one
    before is read once)."""
    tok = lm.backbone.tokenizer
    out = Scored([], [], [], [])
    last, prefix, prior = None, None, None
    for i, ex in enumerate(test):
        context = list(contexts[i]) if contexts is not None else context_ids
        if context != last:
            prefix = Prefix.read(lm, context, memory) if context else None
            prior = label_scores(lm, memory, prefix, context, CONTENT_FREE, template, labels)[0]
            last = context
        scores, logp = label_scores(lm, memory, prefix, context, ex.text, template, labels)
        predicted = max(scores, key=scores.get)
        fair = calibrate(scores, prior)
        gap = prompt_parts(template, ex.text)[1]
        out.greedy.append(starts_label(tok.decode([int(logp.argmax())]), gap, ex.label))
        out.label.append(predicted == ex.label)
        out.calibrated.append(max(fair, key=fair.get) == ex.label)
        out.predictions.append(predicted)
    return out


def context_ids(tokenizer, template: str, demos: Sequence[Example]) -> list[int]:
    """The prompt's demonstrations, each followed by the separator (the test sentence comes next)."""
    return encode(tokenizer, "".join(format_demo(template, e) + SEPARATOR for e in demos)) if demos else []


def demo_memory(lm: SegmentLM, demos: Sequence[Example], template: str, chunk_size: int) -> Memory:
    """A memory of chunk size ``chunk_size`` holding ``demos`` (none: an empty memory)."""
    memory = lm.new_memory(capacity=None, chunk_size=chunk_size)
    if demos:
        lm.memorize(encode(lm.backbone.tokenizer, demo_stream(template, demos, MEMORY_SEPARATOR)), memory)
    return memory


def full_context_ids(tokenizer, task: Task, k: int, budget: int) -> list[int]:
    """The k-shot prompt preceded by as many of the memory demonstrations as fit in ``budget`` tokens."""
    shots = context_ids(tokenizer, task.preset.template, task.shots(k))
    extra: list[int] = []
    for e in reversed(task.memory):
        ids = encode(tokenizer, format_demo(task.preset.template, e) + SEPARATOR)
        if len(shots) + len(extra) + len(ids) > budget:
            break
        extra = ids + extra
    return extra + shots


def run_entrant(entrant: Entrant, task: Task, k: int, memory: Memory | None) -> Scored:
    """One model on one task at k shots (``memory``: LongMem's memory of the task's memory demonstrations)."""
    lm, tok, preset = entrant.lm, entrant.lm.backbone.tokenizer, task.preset
    if entrant.key == "backbone_full":
        ids = full_context_ids(tok, task, k, lm.segment_len - TEST_ROOM)
    else:
        ids = context_ids(tok, preset.template, task.shots(k))[-(lm.segment_len - TEST_ROOM):]
    return classify(lm, memory if lm.uses_memory else None, ids, preset.template, preset.labels, task.test)


def tasks_for(ctx: EvalContext, size: Size) -> list[Task]:
    """Every set under every seed, seed by seed: a run cut off after n units has each set's first seeds."""
    read = {}
    for name in size.sets:
        if name not in PRESETS:
            raise ValueError(f"unknown ICL set {name!r} (known: {', '.join(PRESETS)})")
        read[name] = PRESETS[name].read(ctx.data_dir)
    return [make_task(PRESETS[name], *read[name], max(size.shots), size.memory_demos, size.test, ctx.seed + s)
            for s in range(size.seeds) for name in size.sets]


def found_contexts(finder: DemoFinder, task: Task, k: int, how: str, balance: bool, window: int) -> list[list[int]]:
    """For each test sentence, the prompt of the ``k`` demonstrations ``how`` finds for it in the bank (closest
    last), cut from the left to leave ``TEST_ROOM`` tokens of the window."""
    tok, choice = finder.model.backbone.tokenizer, Choice(how, k, balance)
    out = []
    for ex in task.test:
        demos = finder.context(ex.text, choice)
        out.append(encode(tok, "".join(d + SEPARATOR for d in demos))[-(window - TEST_ROOM):] if demos else [])
    return out


def run_task(ctx: EvalContext, size: Size, task: Task, entrants: list[Entrant]) -> list[dict]:
    """Every row of one set under one seed (see the module doc): the fixed-demonstration rows of every model, then
    LongMem's rows from a bank of the memory demonstrations that grows through ``size.curve``."""
    rows: list[dict] = []
    preset, n_memory = task.preset, len(task.memory)

    def record(model: str, k: int, memory: int, r: Scored) -> None:
        rows.append({"set": preset.name, "seed": task.seed, "k": k, "model": model, "memory": memory,
                     "greedy": r.greedy_acc, "label": r.label_acc, "calibrated": r.calibrated_acc, "agree": r.agree,
                     "n": len(task.test), "items": {p: "".join("1" if x else "0" for x in getattr(r, p))
                                                    for p in ("label", "calibrated")}})
        ctx.log(f"icl {preset.name} seed {task.seed} k={k} {model}: greedy {r.greedy_acc:.3f}, label words "
                f"{r.label_acc:.3f}, calibrated {r.calibrated_acc:.3f}")

    memories: dict[str, Memory] = {}  # each other memory model's own keys/values of the memory demonstrations
    for k in size.shots:
        for e in entrants:
            if e.key == "longmem":
                continue  # below: LongMem reads its bank's memory
            if e.lm.uses_memory and e.key not in memories:
                memories[e.key] = demo_memory(e.lm, task.memory if e.fills_memory else [], preset.template,
                                              size.chunk_size)
            filled = n_memory if e.lm.uses_memory and e.fills_memory else 0
            record(e.key, k, filled, run_entrant(e, task, k, memories.get(e.key)))
    longmem, backbone = ctx.entrant("longmem"), ctx.entrant("backbone_1k")
    if longmem is not None:
        lm, top = longmem.lm, max(size.shots)
        steps = sorted({n for n in size.curve if 0 < n < n_memory} | {n_memory})
        root = ctx.out_dir / "icl-banks"
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp, BankDirectory(tmp).create("demos", lm) as bank:
            for n in grow_bank(bank, lm, task.memory, steps, preset.template, Path(tmp)):
                memory = bank.load_memory(lm).rechunk(size.chunk_size)
                finder = DemoFinder(bank, lm, memory, preset.template, preset.labels)
                full, at = n == n_memory, ("" if n == n_memory else f"@{n}")
                for k in size.shots if full else [top]:
                    record(f"longmem{at}", k, n, run_entrant(longmem, task, k, memory))
                    for how in size.finders if full else size.finders[:1]:
                        found = found_contexts(finder, task, k, how, size.balance, lm.segment_len)
                        record(f"longmem_{how}{at}", k, n, classify(lm, memory, [], preset.template, preset.labels,
                                                                   task.test, found))
                    if full and backbone is not None:  # what a user would pick instead: the backbone reading the
                        found = found_contexts(finder, task, k, "lexical", size.balance, backbone.lm.segment_len)
                        record("backbone_1k_lexical", k, 0, classify(  # demonstrations BM25 finds
                            backbone.lm, None, [], preset.template, preset.labels, task.test, found))
    majority = majority_accuracy(task.test)
    rows.append({"set": preset.name, "seed": task.seed, "k": 0, "model": "majority", "memory": 0, "greedy": majority,
                 "label": majority, "calibrated": majority, "n": len(task.test)})
    return rows


def anchor_rows(task: Task, size: Size, embed: Callable[[list[str]], np.ndarray]) -> list[dict]:
    """The anchor's rows (``ANCHOR``) for one set under one seed: at each memory size of the curve and the full
    one, a logistic regression on ``embed``'s vectors (texts -> (N, E)) of the first that many memory demonstrations
    (as LongMem's bank holds them, ``grow_bank``), its penalty chosen by cross-validation on them, classifies the
    test sample (``measure.anchor_results``). One protocol: the three columns are the same accuracy."""
    n_memory = len(task.memory)
    sizes = sorted({n for n in size.curve if 0 < n < n_memory} | {n_memory})
    return fitted_rows(task, ANCHOR, anchor_results(embed, task.preset.labels, task.memory, task.test, sizes,
                                                    task.seed))


def head_rows(task: Task, size: Size, featurizer: Featurizer) -> list[dict]:
    """LongMem's head's rows (``HEAD``) for one set under one seed: at each memory size of the curve and the full
    one, a head fitted on the ``featurizer``'s features of the first that many memory demonstrations (its penalty by
    cross-validation on them, as the app fits it) classifies the test sample (``measure.fitted_results``)."""
    n_memory = len(task.memory)
    sizes = sorted({n for n in size.curve if 0 < n < n_memory} | {n_memory})
    x = featurizer([e.text for e in task.memory] + [e.text for e in task.test])  # (M + T, F)
    results = fitted_results(x[:n_memory], x[n_memory:], task.preset.labels, task.memory, task.test, sizes,
                             task.seed)
    return fitted_rows(task, HEAD, results)


def fitted_rows(task: Task, model: str, results: list) -> list[dict]:
    """Rows of a classifier fitted on the memory demonstrations (``model`` at the full size, ``model@n`` below):
    one protocol, so the three columns are the same accuracy."""
    rows = []
    for n, result in results:
        hits = "".join("1" if p == t else "0" for p, t in zip(result.predictions, result.truths))
        rows.append({"set": task.preset.name, "seed": task.seed, "k": 0, "memory": n,
                     "model": model if n == len(task.memory) else f"{model}@{n}", "greedy": result.accuracy,
                     "label": result.accuracy, "calibrated": result.accuracy, "n": len(task.test),
                     "items": {"label": hits, "calibrated": hits}})
    return rows


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("icl", QUICK, FULL)
    for how in size.finders:
        Choice(how)  # a bad --set fails before any work
    timer = Timer()
    units = ctx.task_log("icl", size, selects=("sets", "seeds"))  # a unit: one set under one seed
    runs: list[dict] = []  # one per (task, k, model)
    seconds = 0.0  # of every unit, those reused from an earlier run included
    entrants = ctx.entrants + memory_empty(ctx.entrants)
    tasks = tasks_for(ctx, size)
    embedder = None
    for task in tasks:
        key = f"{task.preset.name}/{task.seed}"  # the seed itself, not its rank: ctx.seed + s
        unit = units.get(key)
        if unit is None:
            t0 = time.perf_counter()
            unit = {"runs": run_task(ctx, size, task, entrants), "seconds": time.perf_counter() - t0}
            units.put(key, unit)
        if embedder is None:  # the anchor's, and the head's sentence embeddings
            from longmem.model.embedder import Embedder
            embedder = Embedder.load()
        anchor = units.get(f"{key}/anchor")
        if anchor is None or anchor.get("fit") != ANCHOR_FIT:
            t0 = time.perf_counter()
            anchor = {"runs": anchor_rows(task, size, embedder.encode), "seconds": time.perf_counter() - t0,
                      "fit": ANCHOR_FIT}
            units.put(f"{key}/anchor", anchor)
            ctx.log(f"icl {task.preset.name} seed {task.seed} {ANCHOR}: "
                    + ", ".join(f"{r['memory']:,} examples {r['label']:.3f}" for r in anchor["runs"]))
        featurizer = Featurizer(ctx.model, task.preset.template, embedder.encode, FEATURES)
        head_fit = {**ANCHOR_FIT, "signature": featurizer.signature()}  # a unit made otherwise is made again
        head = units.get(f"{key}/head")
        if head is None or head.get("fit") != head_fit:
            t0 = time.perf_counter()
            head = {"runs": head_rows(task, size, featurizer), "seconds": time.perf_counter() - t0, "fit": head_fit}
            units.put(f"{key}/head", head)
            ctx.log(f"icl {task.preset.name} seed {task.seed} {HEAD}: "
                    + ", ".join(f"{r['memory']:,} examples {r['label']:.3f}" for r in head["runs"]))
        runs += unit["runs"] + anchor["runs"] + head["runs"]
        seconds += unit["seconds"] + anchor["seconds"] + head["seconds"]
    summary = summarize(runs)
    top, n_memory = max(size.shots), size.memory_demos
    rows_for = [("majority", 0, "majority class"), (ANCHOR, 0, f"{ANCHOR_LABEL}, {n_memory:,} examples"),
                (HEAD, 0, f"{HEAD_LABEL}, {n_memory:,} examples")]
    for k in size.shots:
        rows_for += [(e.key, k, f"{e.label}, {k}-shot") for e in entrants if e.key != "longmem"]
        rows_for += [("longmem", k, f"LongMem, {k} fixed in context + {n_memory:,} in memory (the paper's)")]
        rows_for += [(f"longmem_{how}", k, f"LongMem, {k} found by {how} + {n_memory:,} in memory")
                     for how in size.finders]
        rows_for += [("backbone_1k_lexical", k, f"backbone, {k} found by words (BM25), no memory")]
    rows_for = [r for r in rows_for if f"{r[0]}/{r[1]}/Avg" in summary]
    titles = {"greedy": "The paper's protocol: the greedy next token starts the gold label",
              "label": "Label-word scoring: the likeliest label word wins",
              "calibrated": "Label-word scoring, calibrated: divided by each label's probability for \"N/A\""}
    tables = [f"**{title}** (accuracy %, ± the half-width of a 95% interval over the pooled test sentences)\n\n"
              + results_table(summary, rows_for, size.sets, protocol) for protocol, title in titles.items()]
    curve = curve_table(summary, size, top)
    if curve:
        tables.append(f"**Accuracy vs demonstrations in memory** (LongMem at {top} shots, average of "
                      f"{len(size.sets)} sets, %, ± the half-width of a 95% interval)\n\n" + curve)
    scored = [r for r in runs if "agree" in r]  # the language models' rows
    notes = [verdict(summary, entrants, size.sets, top), *head_targets(runs, summary, size),
             *targets(runs, summary, size),
             f"The two protocols gave the same verdict on {sum(r['agree'] for r in scored):,} of "
             f"{sum(r['n'] for r in scored):,} test sentences (every model, shot count and seed): they differ only "
             "where the greedy next token is not a label word.",
             f"LongMem's memory is a bank of the {n_memory:,} memory demonstrations (as the app writes one, K/V "
             f"stored in bfloat16), read at chunk size {size.chunk_size}; MemTRM's is in RAM. Found demonstrations "
             f"come from that bank ({', '.join(size.finders)}; the backbone's by BM25 from the same bank), never the "
             "test sentence itself, closest last; the full-context backbone reads as many memory demonstrations as fit "
             "before its k-shot prompt.",
             f"The anchor ({ANCHOR_LABEL}) is fitted on the same {n_memory:,} memory demonstrations (the first "
             f"{', '.join(f'{n:,}' for n, _ in fitted_points(summary, size)[1:-1]) or 'none'} for the curve) with its "
             f"penalty chosen by {FOLDS}-fold cross-validation on them, and classifies the same test sentences; it has "
             "one protocol (its three columns are one accuracy). LongMem's head (the app's default classifier) is "
             "fitted the same way on the same demonstrations, on the LongMem model's backbone state at each text's "
             "prompt end (the template up to its label, no demonstrations, no memory) stacked with the same sentence "
             "embeddings.",
             f"Units (set x seed): {len(tasks)}, made at {', '.join(units.commits())}; "
             f"{seconds / 60:.1f} min of work in all, {timer.seconds / 60:.1f} min in this run."]
    plots = [plot_icl(ctx.out_dir, summary, rows_for, size.sets)]
    if curve:
        plots.append(plot_curve(ctx.out_dir, summary, size, top))
    return SuiteResult("icl", "Memory-augmented in-context learning (paper table 5): accuracy %, with 95% intervals",
                       tables, {"runs": runs, "summary": summary,
                                "models": {**{e.key: e.label for e in ctx.entrants}, ANCHOR: ANCHOR_LABEL}},
                       asdict(size), plots, notes, seconds)
