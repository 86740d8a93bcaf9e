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
(paired).
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from longmem.eval.core import (
    WITH_MEMORY,
    Entrant,
    EvalContext,
    SuiteResult,
    Timer,
    figure,
    legend_below,
    mean_std,
    memory_empty,
    table,
    versus,
)
from longmem.eval.scoring import Prefix
from longmem.memory.memory import Memory
from longmem.model.lm import SegmentLM
from longmem.storage import BankDirectory
from longmem.tasks.classify import Choice, calibrate
from longmem.tasks.demos import DemoFinder, grow_bank
from longmem.tasks.examples import PRESETS, Example, Preset, demo_stream, format_demo, prompt_parts, split_examples
from longmem.tasks.head import FEATURES, Featurizer
from longmem.tasks.measure import (
    ANCHOR_LABEL,
    anchor_results,
    fitted_results,
    majority_accuracy,
    paired_gap,
    wilson,
)
from longmem.tasks.readout import FOLDS, L2_GRID

SEPARATOR = "\n"  # between the prompt's demonstrations (and before the test sentence)
MEMORY_SEPARATOR = "\n\n"  # between demonstrations in memory, as a bank ingests them
TEST_ROOM = 256  # window tokens kept free after the demonstrations, for a test sentence and its label
CONTENT_FREE = "N/A"  # the content-free input of contextual calibration (Zhao et al. 2021)
ANCHOR = "embeddings_lr"  # the rows of the classifier a user would build: sentence embeddings + logistic regression
ANCHOR_FIT = {"folds": FOLDS, "l2_grid": list(L2_GRID)}  # how its penalty is chosen: a recorded anchor unit made
#                                                          otherwise is made again
HEAD = "longmem_head"  # the rows of LongMem's classifier head (``tasks.head``)
HEAD_LABEL = "LongMem's head (its state + embeddings)"


@dataclass
class Size:
    sets: list[str] = field(default_factory=lambda: ["SST-2", "MR", "Subj", "SST-5", "MPQA"])  # as table 5
    shots: list[int] = field(default_factory=lambda: [4, 20])  # k: demonstrations in the prompt
    memory_demos: int = 2000  # demonstrations in LongMem's memory
    chunk_size: int = 2  # memory chunk size for demonstrations (the paper's)
    seeds: int = 3  # runs per set, each with its own demonstrations and test sample
    test: int = 100  # test sentences per set and seed, from the evaluation file (0 = all)
    finders: list[str] = field(default_factory=lambda: ["fused"])  # how LongMem finds its prompt's demonstrations
    balance: bool = False  # found demonstrations take the labels in turn
    curve: list[int] = field(default_factory=lambda: [100, 500])  # memory sizes below memory_demos for the curve


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


PROTOCOLS = ("greedy", "label", "calibrated")


def summarize(runs: list[dict]) -> dict:
    """{"<model>/<k>/<set>": {p: (mean, std) over seeds, "ci": {p: (low, high)}, "seeds": n}} in % for each
    protocol p the runs have: the interval is Wilson's over the set's pooled test sentences. "<model>/<k>/Avg": the
    mean of the sets' means (the paper's average column; no std), its interval from the sets' binomial variances."""
    out: dict = {}
    keys = sorted({(r["model"], r["k"], r["set"]) for r in runs})
    pooled: dict = {}
    for model, k, s in keys:
        sel = [r for r in runs if (r["model"], r["k"], r["set"]) == (model, k, s)]
        protocols = [p for p in PROTOCOLS if all(p in r for r in sel)]
        n = sum(r.get("n", 0) for r in sel)
        entry = {p: mean_std([100 * r[p] for r in sel]) for p in protocols}
        entry["ci"] = {p: tuple(100 * x for x in wilson(round(sum(r[p] * r["n"] for r in sel)), n))
                       for p in protocols if n}
        entry["seeds"] = len(sel)
        out[f"{model}/{k}/{s}"] = entry
        pooled[(model, k, s)] = (n, {p: sum(r[p] * r["n"] for r in sel) / n for p in protocols} if n else {})
    for model, k in sorted({(m, k) for m, k, _ in keys}):
        per_set = [(key, v) for key, v in out.items() if key.startswith(f"{model}/{k}/") and not key.endswith("/Avg")]
        protocols = [p for p in PROTOCOLS if all(p in v for _, v in per_set)]
        avg = {p: (sum(v[p][0] for _, v in per_set) / len(per_set), float("nan")) for p in protocols}
        ci = {}
        for p in protocols:
            var = [q[p] * (1 - q[p]) / n for n, q in (pooled[(model, k, key.rsplit("/", 1)[1])] for key, _ in per_set)
                   if n]
            if len(var) == len(per_set):
                half = 100 * 1.96 * math.sqrt(sum(var)) / len(per_set)
                ci[p] = (avg[p][0] - half, avg[p][0] + half)
        out[f"{model}/{k}/Avg"] = {**avg, "ci": ci}
    return out


def cell(v: dict | None, protocol: str) -> str:
    if v is None or protocol not in v:
        return ""
    mean = v[protocol][0]
    ci = v.get("ci", {}).get(protocol)
    return f"{mean:.1f}" if not ci else f"{mean:.1f} ±{(ci[1] - ci[0]) / 2:.1f}"


def results_table(summary: dict, rows_for: list[tuple[str, int, str]], sets: list[str], protocol: str) -> str:
    rows = [[label] + [cell(summary.get(f"{model}/{k}/{s}"), protocol) for s in sets + ["Avg"]]
            for model, k, label in rows_for]
    return table(["model"] + sets + ["Avg"], rows)


def curve_points(summary: dict, size: Size, top: int, model: str) -> list[tuple[int, dict | None]]:
    """(demonstrations in memory, the 5-set average entry) for ``model``'s line at ``top`` shots: 0 is LongMem with
    its memory empty (fixed demonstrations), the full size the table's row, the sizes between the curve's."""
    steps = sorted({n for n in size.curve if 0 < n < size.memory_demos})
    return ([(0, summary.get(f"longmem_empty/{top}/Avg"))] + [(n, summary.get(f"{model}@{n}/{top}/Avg")) for n in steps]
            + [(size.memory_demos, summary.get(f"{model}/{top}/Avg"))])


def fitted_points(summary: dict, size: Size, model: str = ANCHOR) -> list[tuple[int, dict | None]]:
    """(examples, the 5-set average entry) of the line of a classifier fitted on the memory demonstrations (the
    anchor, LongMem's head), at the memory sizes of ``curve_points``."""
    steps = sorted({n for n in size.curve if 0 < n < size.memory_demos})
    return ([(0, None)] + [(n, summary.get(f"{model}@{n}/0/Avg")) for n in steps]
            + [(size.memory_demos, summary.get(f"{model}/0/Avg"))])


def curve_lines(size: Size) -> list[tuple[str, str]]:
    return [("longmem", "fixed demonstrations")] + [(f"longmem_{how}", f"found by {how}") for how in size.finders[:1]]


def curve_table(summary: dict, size: Size, top: int) -> str:
    lines = curve_lines(size)
    points = {m: curve_points(summary, size, top, m) for m, _ in lines}
    if not any(v is not None for pts in points.values() for _, v in pts[1:-1]):
        return ""
    header = ["in prompt"] + [f"{n:,} in memory" for n, _ in points["longmem"]]
    rows = [[f"{top} {name}" + (", calibrated" if p == "calibrated" else "")]
            + [cell(v, p) for _, v in points[m]] for m, name in lines for p in ("label", "calibrated")]
    for model, label in ((HEAD, HEAD_LABEL), (ANCHOR, ANCHOR_LABEL)):
        fitted = fitted_points(summary, size, model)
        if any(v is not None for _, v in fitted):
            rows.append([f"({label}, as many examples)"] + [cell(v, "label") for _, v in fitted])
    return table(header, rows)


def paired(runs: list[dict], a: tuple[str, int], b: tuple[str, int], pa: str = "label",
           pb: str = "label") -> tuple[float, float, int] | None:
    """Mean difference in points of (model, k) ``a`` under protocol ``pa`` minus ``b`` under ``pb`` over the same
    test sentences (every set and seed both ran), with the half-width of its 95% interval, and the sentences."""
    def items(key, p):
        return {(r["set"], r["seed"]): r["items"][p] for r in runs
                if (r["model"], r["k"]) == key and "items" in r}
    xa, xb = items(a, pa), items(b, pb)
    units = sorted(set(xa) & set(xb))
    if not any(xa[u] for u in units):
        return None
    return paired_gap([c == "1" for u in units for c in xa[u]], [c == "1" for u in units for c in xb[u]])


def head_targets(runs: list[dict], summary: dict, size: Size) -> list[str]:
    """Issue 86's targets for LongMem's head: at or above the anchor on every set and >= 3 points above it on
    average (paired over the same sentences, with its interval), and rising from 100 to 500 to all the examples."""
    d = paired(runs, (HEAD, 0), (ANCHOR, 0))
    if d is None:
        return []
    per_set = {s: summary[f"{HEAD}/0/{s}"]["label"][0] - summary[f"{ANCHOR}/0/{s}"]["label"][0] for s in size.sets
               if f"{HEAD}/0/{s}" in summary and f"{ANCHOR}/0/{s}" in summary}
    every = all(v >= 0 for v in per_set.values())
    out = [f"LongMem's head minus the anchor ({ANCHOR_LABEL}), on the same examples and sentences: "
           f"{d[0]:+.1f} ± {d[1]:.1f} points "
           f"(paired, {d[2]:,} test sentences); by set " + ", ".join(f"{s} {v:+.1f}" for s, v in per_set.items())
           + f". The target (at or above on every set, >= 3 points on average) is "
           f"{'met' if every and d[0] >= 3 else 'not met'}."]
    pts = [(n, v) for n, v in fitted_points(summary, size, HEAD) if v is not None]
    if len(pts) > 1:
        accs = [v["label"][0] for _, v in pts]
        rising = all(b > a for a, b in zip(accs, accs[1:]))
        out.append("LongMem's head by examples: " + ", ".join(f"{n:,} → {a:.1f}" for (n, _), a in zip(pts, accs))
                   + (" (rises at every step)." if rising else " (does not rise at every step)."))
    return out


def targets(runs: list[dict], summary: dict, size: Size) -> list[str]:
    """The issue's two targets: LongMem's best configuration against the backbone at the most shots (>= 5 points,
    the gap outside its interval), and accuracy rising with demonstrations in memory."""
    top = max(size.shots)
    base = ("backbone_1k", top)
    mine = [(m, k, p) for m in ["longmem"] + [f"longmem_{h}" for h in size.finders] for k in size.shots
            for p in ("label", "calibrated") if f"{m}/{k}/Avg" in summary and p in summary[f"{m}/{k}/Avg"]]
    if not mine or f"backbone_1k/{top}/Avg" not in summary:
        return []
    best = max(mine, key=lambda c: summary[f"{c[0]}/{c[1]}/Avg"][c[2]][0])
    name = f"{best[0]} at {best[1]} shots ({'calibrated' if best[2] == 'calibrated' else 'label words'})"
    out = []
    for rival, rp, what in ((base, "label", f"the backbone at {top} shots"),
                            (base, "calibrated", f"the backbone at {top} shots, calibrated"),
                            (("backbone_1k_lexical", top), "label", f"the backbone reading {top} found by BM25"),
                            (("backbone_1k_lexical", top), "calibrated",
                             f"the backbone reading {top} found by BM25, calibrated"),
                            ((ANCHOR, 0), "label", ANCHOR_LABEL + " on the same examples")):
        d = paired(runs, best[:2], rival, best[2], rp)
        if d is None:
            continue
        met = d[0] >= 5 and d[0] - d[1] > 0
        out.append(f"Best LongMem configuration, {name}, minus {what}: {d[0]:+.1f} ± {d[1]:.1f} points (paired, "
                   f"{d[2]:,} test sentences)" + (f"; the >= 5-point target is {'met' if met else 'not met'}."
                                                  if rival == base and rp == "label" else "."))
    pts = [(n, v) for n, v in fitted_points(summary, size) if v is not None]
    if len(pts) > 1:
        accs = [v["label"][0] for _, v in pts]
        out.append(f"The anchor ({ANCHOR_LABEL}) by examples: " + ", ".join(f"{n:,} → {a:.1f}" for (n, _), a in
                                                                           zip(pts, accs)) + ".")
    for m, line in curve_lines(size):
        pts = [(n, v) for n, v in curve_points(summary, size, top, m) if v is not None]
        if len(pts) > 1:
            accs = [v["label"][0] for _, v in pts]
            rising = all(b >= a for a, b in zip(accs, accs[1:]))
            d = paired(runs, (m, top), ("longmem_empty", top))
            out.append(f"LongMem at {top} shots, {line}, by demonstrations in memory: "
                       + ", ".join(f"{n:,} → {a:.1f}" for (n, _), a in zip(pts, accs))
                       + (" (rises at every step" if rising else " (does not rise at every step")
                       + (f"; {size.memory_demos:,} minus 0: {d[0]:+.1f} ± {d[1]:.1f} points, paired)." if d else ")."))
    out.append("The best configuration is picked after seeing the results (of "
               f"{len(mine)}), so its gap is an optimistic estimate.")
    return out


def verdict(summary: dict, entrants: list[Entrant], sets: list[str], k: int) -> str:
    """Every model's average at ``k`` shots for both protocols; LongMem against the same k-shot 1k backbone (and
    MemTRM); what memory adds to each model that has a memory-empty twin among ``entrants``."""
    avg = {e.key: {name: summary[f"{e.key}/{k}/Avg"][p][0] for p, name in (("greedy", "the paper's protocol"),
                                                                          ("label", "label-word scoring"))}
           for e in entrants if f"{e.key}/{k}/Avg" in summary}
    numbers = "; ".join(f"{m} " + ", ".join(f"{v:.1f}" for v in cols.values()) for m, cols in avg.items())
    out = f"At {k}-shot, average over {len(sets)} sets (paper's protocol, label words): {numbers}. " + versus(
        {e.key: avg[e.key] for e in entrants if e.key in avg and e.fills_memory}, lambda v: v, False)
    for e in entrants:
        if e.empty_of in avg and e.key in avg:
            gain = [avg[e.empty_of][p] - avg[e.key][p] for p in avg[e.key]]
            out += (f" What memory adds ({WITH_MEMORY[e.empty_of][0]} minus its memory-empty self): {gain[0]:+.1f}, "
                    f"{gain[1]:+.1f} points.")
    return out


def plot_icl(out_dir: Path, summary: dict, rows_for: list[tuple[str, int, str]], sets: list[str]) -> str:
    from matplotlib import colormaps

    fig = figure(2.0 + 1.3 * (len(sets) + 1), 3.0 + 0.09 * len(rows_for))
    ax = fig.add_subplot()
    cols = sets + ["Avg"]
    width = 0.85 / len(rows_for)
    colours = colormaps["tab20"]  # 20 distinct colours: the default cycle repeats after 10 bars
    for i, (model, k, label) in enumerate(rows_for):
        vals = [summary.get(f"{model}/{k}/{s}", {}).get("label", (float("nan"), 0))[0] for s in cols]
        ax.bar([j + i * width for j in range(len(cols))], vals, width, label=label, color=colours(i % 20))
    ax.set_xticks([j + 0.425 - width / 2 for j in range(len(cols))], cols)
    ax.set_ylabel("accuracy % (label-word scoring)")
    ax.set_ylim(0, 100)
    legend_below(ax, ncol=2)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "icl.png", bbox_inches="tight")  # the legend below may be wider than the axes
    return "icl.png"


def plot_curve(out_dir: Path, summary: dict, size: Size, top: int) -> str:
    """The 5-set average against demonstrations in memory, each point with its 95% interval; the backbone's
    rows as horizontal lines."""
    fig = figure(6.5, 4.5)
    ax = fig.add_subplot()
    for m, line in curve_lines(size):
        for p, style in (("label", "o-"), ("calibrated", "s--")):
            pts = [(n, v) for n, v in curve_points(summary, size, top, m) if v is not None and p in v]
            if not pts:
                continue
            xs, ys = [n for n, _ in pts], [v[p][0] for _, v in pts]
            err = [[y - v["ci"].get(p, (y, y))[0] for y, (_, v) in zip(ys, pts)],
                   [v["ci"].get(p, (y, y))[1] - y for y, (_, v) in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, fmt=style, capsize=3,
                        label=f"LongMem, {top} {line}" + (", calibrated" if p == "calibrated" else ""))
    for model, label, fmt, colour in ((HEAD, HEAD_LABEL, "D-", "tab:purple"), (ANCHOR, ANCHOR_LABEL, "^-.", "black")):
        pts = [(n, v) for n, v in fitted_points(summary, size, model) if v is not None]
        if pts:
            ys = [v["label"][0] for _, v in pts]
            err = [[max(0.0, y - v["ci"].get("label", (y, y))[0]) for y, (_, v) in zip(ys, pts)],
                   [max(0.0, v["ci"].get("label", (y, y))[1] - y) for y, (_, v) in zip(ys, pts)]]
            ax.errorbar([n for n, _ in pts], ys, yerr=err, fmt=fmt, color=colour, capsize=3,
                        label=f"{label}, as many examples")
    for key, label, style in ((f"backbone_1k/{top}/Avg", f"backbone, {top} fixed", ":"),
                              (f"backbone_1k_lexical/{top}/Avg", f"backbone, {top} found by BM25", "-."),
                              ("majority/0/Avg", "majority class", "-")):
        if key in summary:
            ax.axhline(summary[key]["label"][0], color="gray", linestyle=style, linewidth=1, label=label)
    ax.set_xscale("symlog", linthresh=100)
    ax.set_xlim(-10, size.memory_demos * 1.3)  # symlog's default margin leaves a blank stretch left of 0
    ax.set_ylim(0, 100)
    ax.set_xlabel("demonstrations in memory")
    ax.set_ylabel(f"accuracy %, average of {len(size.sets)} sets")
    legend_below(ax, ncol=2, gap=0.16)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "icl-curve.png", bbox_inches="tight")
    return "icl-curve.png"
