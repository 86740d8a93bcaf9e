"""The report of suite 3 (``longmem.eval.icl``), memory-augmented in-context learning: from the rows a run records
to the suite's summaries, tables, targets, verdict and plots. Nothing here runs a model.

A row is one model at one shot count ``k`` on one set under one seed: ``{"set", "seed", "k", "model", "memory", "n",
"greedy", "label", "calibrated"}``, the three protocols' accuracies as fractions over ``n`` test sentences; a language
model's row also has ``"agree"`` (sentences on which the first two protocols agree) and, like a fitted classifier's,
``"items"``: the per-sentence hits ("1"/"0") of ``"label"`` and ``"calibrated"``, which ``paired`` compares over the
same sentences. A model is an entrant's key, ``longmem_<finder>`` (LongMem reading the demonstrations it finds),
``backbone_1k_lexical``, ``majority``, or a classifier fitted on the memory demonstrations (``ANCHOR``, ``HEAD``: k =
0); ``<model>@<n>`` is its row at a smaller memory of the curve.

``Size`` is defined here, not in ``eval.icl``, because the report reads it as the run does (``eval.icl`` imports this
module, never the other way round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from longmem.eval.core import WITH_MEMORY, Entrant, figure, legend_below, mean_std, table, versus
from longmem.tasks.measure import ANCHOR_LABEL, paired_gap, wilson

ANCHOR = "embeddings_lr"  # the rows of the classifier a user would build: sentence embeddings + logistic regression
HEAD = "longmem_head"  # the rows of LongMem's classifier head (``tasks.head``)
HEAD_LABEL = "LongMem's head (its state + embeddings)"
PROTOCOLS = ("greedy", "label", "calibrated")  # a row's three accuracies (the protocols of ``eval.icl``'s doc)


@dataclass
class Size:
    """The suite's sizes (``longmem eval icl --set icl.<name>=<value>``): what a run makes, so what its report reads."""

    sets: list[str] = field(default_factory=lambda: ["SST-2", "MR", "Subj", "SST-5", "MPQA"])  # as table 5
    shots: list[int] = field(default_factory=lambda: [4, 20])  # k: demonstrations in the prompt
    memory_demos: int = 2000  # demonstrations in LongMem's memory
    chunk_size: int = 2  # memory chunk size for demonstrations (the paper's)
    seeds: int = 3  # runs per set, each with its own demonstrations and test sample
    test: int = 100  # test sentences per set and seed, from the evaluation file (0 = all)
    finders: list[str] = field(default_factory=lambda: ["fused"])  # how LongMem finds its prompt's demonstrations
    balance: bool = False  # found demonstrations take the labels in turn
    curve: list[int] = field(default_factory=lambda: [100, 500])  # memory sizes below memory_demos for the curve


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
