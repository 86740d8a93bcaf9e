"""Suite 3, memory-augmented in-context learning (paper table 5): SST-2, MR, Subj, SST-5, MPQA.

For each set and seed: k demonstrations (k = 4 and 20) go into the prompt, ``memory_demos`` (2,000) more into
LongMem's memory (chunk size 2, as the paper's), and test sentences from the set's evaluation file are classified
with the paper's templates (``longmem.classifiers.PRESETS``). Every model reads the same k-shot prompt:

- the 1k backbone reads the k demonstrations only (the paper's k-shot GPT-2*);
- the full-context backbone (8k) also reads as many of the memory demonstrations as fit before them;
- LongMem reads the k demonstrations with the 2,000 in memory.

Two protocols, both from one forward pass per test sentence: the paper's (the greedy next token must start the gold
label word: " pos" or " positive" for " positive"), and label-word scoring (the label word with the highest
log-probability wins, ``longmem.tasks.Classifier``'s rule). Accuracy is the mean over seeds, with the standard
deviation; the majority class of each test sample is the floor.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from ..classifiers import PRESETS, Example, Preset, demo_stream, format_demo, majority_accuracy, split_examples
from ..lm import SegmentLM
from ..memory import MemoryBank
from .core import (WITH_MEMORY, EvalContext, Entrant, SuiteResult, Timer, figure, legend_below, mean_std, memory_empty,
                   table, versus)
from .scoring import Prefix

SEPARATOR = "\n"  # between the prompt's demonstrations (and before the test sentence)
MEMORY_SEPARATOR = "\n\n"  # between demonstrations in memory, as a bank ingests them
TEST_ROOM = 256  # window tokens kept free after the demonstrations, for a test sentence and its label


@dataclass
class Size:
    sets: list[str] = field(default_factory=lambda: ["SST-2", "MR", "Subj", "SST-5", "MPQA"])  # as table 5
    shots: list[int] = field(default_factory=lambda: [4, 20])  # k: demonstrations in the prompt
    memory_demos: int = 2000  # demonstrations in LongMem's memory
    csz: int = 2  # memory chunk size for demonstrations (the paper's)
    seeds: int = 6  # runs per set, each with its own demonstrations and test sample
    test: int = 200  # test sentences per set and seed, from the evaluation file (0 = all)


QUICK = Size(sets=["SST-2"], shots=[4], memory_demos=100, seeds=1, test=8)
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

    @property
    def greedy_acc(self) -> float:
        return sum(self.greedy) / len(self.greedy) if self.greedy else float("nan")

    @property
    def label_acc(self) -> float:
        return sum(self.label) / len(self.label) if self.label else float("nan")

    @property
    def agree(self) -> int:
        """Test sentences on which the two protocols give the same verdict."""
        return sum(g == w for g, w in zip(self.greedy, self.label))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def prompt_parts(template: str, text: str) -> tuple[str, str]:
    """(the template up to the label, without trailing whitespace; the whitespace that goes with the label word)."""
    prefix = template.split("{label}")[0].format(text=text.strip())
    own = prefix.rstrip()
    return own, prefix[len(own):]


def starts_label(piece: str, gap: str, label: str) -> bool:
    """The paper's protocol: the greedy next token (decoded ``piece``) begins the gold label word as written after
    the prompt (``gap`` + ``label``, e.g. " positive"): " pos" and " positive" do, "pos", " " and " positively" do
    not."""
    return bool(piece.strip()) and (gap + label).startswith(piece)


def classify(lm: SegmentLM, memory: MemoryBank | None, context_ids: list[int], template: str, labels: list[str],
             test: Sequence[Example]) -> Scored:
    """Both protocols for every test sentence after ``context_ids`` (read once), with ``memory``."""
    tok = lm.backbone.tokenizer
    prefix = Prefix.read(lm, context_ids, memory) if context_ids else None
    out = Scored([], [], [])
    for ex in test:
        own, gap = prompt_parts(template, ex.text)
        ids = encode(tok, own)
        words = {w: encode(tok, gap + w) for w in labels}
        longest = max(len(t) for t in words.values())
        if prefix is not None and len(ids) + longest <= prefix.room:
            state = prefix.extend(ids)
        else:  # a long sentence: read context + sentence afresh, cut from the left to fit the window
            state = Prefix.read(lm, (list(context_ids) + ids)[-(lm.segment_len - longest):], memory)
        logp = state.next_logprobs()
        scores = {w: float(logp[t[0]]) if len(t) == 1 else float(state.logprobs(t).sum()) for w, t in words.items()}
        predicted = max(scores, key=scores.get)
        out.greedy.append(starts_label(tok.decode([int(logp.argmax())]), gap, ex.label))
        out.label.append(predicted == ex.label)
        out.predictions.append(predicted)
    return out


def context_ids(tokenizer, template: str, demos: Sequence[Example]) -> list[int]:
    """The prompt's demonstrations, each followed by the separator (the test sentence comes next)."""
    return encode(tokenizer, "".join(format_demo(template, e) + SEPARATOR for e in demos)) if demos else []


def memory_bank(lm: SegmentLM, demos: Sequence[Example], template: str, csz: int) -> MemoryBank:
    """A memory of chunk size ``csz`` holding ``demos`` (none: an empty memory)."""
    bank = lm.new_memory(capacity=None, csz=csz)
    if demos:
        lm.memorize(encode(lm.backbone.tokenizer, demo_stream(template, demos, MEMORY_SEPARATOR)), bank)
    return bank


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


def run_entrant(entrant: Entrant, task: Task, k: int, bank: MemoryBank | None) -> Scored:
    """One model on one task at k shots (``bank``: LongMem's memory of the task's memory demonstrations)."""
    lm, tok, preset = entrant.lm, entrant.lm.backbone.tokenizer, task.preset
    if entrant.key == "backbone_full":
        ids = full_context_ids(tok, task, k, lm.segment_len - TEST_ROOM)
    else:
        ids = context_ids(tok, preset.template, task.shots(k))[-(lm.segment_len - TEST_ROOM):]
    return classify(lm, bank if lm.uses_memory else None, ids, preset.template, preset.labels, task.test)


def tasks_for(ctx: EvalContext, size: Size) -> list[Task]:
    out = []
    for name in size.sets:
        if name not in PRESETS:
            raise ValueError(f"unknown ICL set {name!r} (known: {', '.join(PRESETS)})")
        train, evaluation = PRESETS[name].read(ctx.data_dir)
        out += [make_task(PRESETS[name], train, evaluation, max(size.shots), size.memory_demos, size.test,
                          ctx.seed + s) for s in range(size.seeds)]
    return out


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("icl", QUICK, FULL)
    timer = Timer()
    runs: list[dict] = []  # one per (task, k, model)
    entrants = ctx.entrants + memory_empty(ctx.entrants)
    for task in tasks_for(ctx, size):
        banks: dict[str, MemoryBank] = {}  # each memory model's own keys/values of the memory demonstrations
        for k in size.shots:
            for e in entrants:
                if e.lm.uses_memory and e.key not in banks:
                    banks[e.key] = memory_bank(e.lm, task.memory if e.fills_memory else [], task.preset.template,
                                               size.csz)
                r = run_entrant(e, task, k, banks.get(e.key))
                runs.append({"set": task.preset.name, "seed": task.seed, "k": k, "model": e.key,
                             "greedy": r.greedy_acc, "label": r.label_acc, "agree": r.agree, "n": len(task.test)})
                ctx.log(f"icl {task.preset.name} seed {task.seed} k={k} {e.key}: greedy {r.greedy_acc:.3f}, "
                        f"label words {r.label_acc:.3f}")
        runs += [{"set": task.preset.name, "seed": task.seed, "k": 0, "model": "majority",
                  "greedy": majority_accuracy(task.test), "label": majority_accuracy(task.test),
                  "n": len(task.test)}]
    summary = summarize(runs)
    rows_for = [("majority", 0, "majority class")] + [(e.key, k, f"{e.label}, {k}-shot") for k in size.shots
                                                       for e in entrants]
    tables = [f"**{title}**\n\n" + results_table(summary, rows_for, size.sets, protocol)
              for protocol, title in (("greedy", "The paper's protocol: the greedy next token starts the gold label"),
                                      ("label", "Label-word scoring: the likeliest label word wins"))]
    scored = [r for r in runs if r["model"] != "majority"]
    notes = [verdict(summary, entrants, size.sets, max(size.shots)),
             f"The two protocols gave the same verdict on {sum(r['agree'] for r in scored):,} of "
             f"{sum(r['n'] for r in scored):,} test sentences (every model, shot count and seed): they differ only "
             "where the greedy next token is not a label word.",
             f"LongMem holds {size.memory_demos:,} demonstrations in memory (chunk size {size.csz}); the "
             f"full-context backbone reads as many of them as fit before its k-shot prompt."]
    plot = plot_icl(ctx.out_dir, summary, rows_for, size.sets)
    return SuiteResult("icl", "Memory-augmented in-context learning (paper table 5): accuracy %, mean ± std over seeds",
                       tables, {"runs": runs, "summary": summary, "models": {e.key: e.label for e in ctx.entrants}},
                       asdict(size), [plot], notes, timer.seconds)


def summarize(runs: list[dict]) -> dict:
    """{"<model>/<k>/<set>": {"greedy": (mean, std), "label": (mean, std), "seeds": n}} over seeds, in %, plus
    "<model>/<k>/Avg": the mean of the sets' means (the paper's average column; no std)."""
    out: dict = {}
    keys = sorted({(r["model"], r["k"], r["set"]) for r in runs})
    for model, k, s in keys:
        sel = [r for r in runs if (r["model"], r["k"], r["set"]) == (model, k, s)]
        out[f"{model}/{k}/{s}"] = {p: mean_std([100 * r[p] for r in sel]) for p in ("greedy", "label")}
        out[f"{model}/{k}/{s}"]["seeds"] = len(sel)
    for model, k in sorted({(m, k) for m, k, _ in keys}):
        per_set = [v for key, v in out.items() if key.startswith(f"{model}/{k}/") and not key.endswith("/Avg")]
        out[f"{model}/{k}/Avg"] = {p: (sum(v[p][0] for v in per_set) / len(per_set), float("nan"))
                                   for p in ("greedy", "label")}
    return out


def results_table(summary: dict, rows_for: list[tuple[str, int, str]], sets: list[str], protocol: str) -> str:
    rows = []
    for model, k, label in rows_for:
        cells = []
        for s in sets + ["Avg"]:
            v = summary.get(f"{model}/{k}/{s}")
            if v is None:
                cells.append("")
                continue
            mean, std = v[protocol]
            plain = s == "Avg" or v.get("seeds", 1) < 2
            cells.append(f"{mean:.1f}" if plain else f"{mean:.1f} ± {std:.1f}")
        rows.append([label] + cells)
    return table(["model"] + sets + ["Avg"], rows)


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
