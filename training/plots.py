"""Training curves: metrics.jsonl (one JSON object per step) -> a PNG of train loss, recall answers' NLL and held-out
perplexity ratios."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def _weighted_average(rows: list[dict], kind: str, smooth: int) -> tuple[list[int], list[float]]:
    """(steps, NLL) of the answers (``answer_nll<kind>``), averaged over the last ``smooth`` rows by token count."""
    nll = [r[f"answer_nll{kind}"] * r[f"answer_tokens{kind}"] for r in rows]
    count = [r[f"answer_tokens{kind}"] for r in rows]
    window = [slice(max(0, i - smooth + 1), i + 1) for i in range(len(rows))]
    return [r["step"] for r in rows], [sum(nll[w]) / sum(count[w]) for w in window]


def plot_metrics(metrics: Path, out: Path, smooth: int = 20, model: str = "LongMem") -> Path | None:
    """Plot the training loss (raw and a moving average); when the run has recall answers (``answer_nll``), their NLL
    (token-weighted moving averages: all answers, and names and numbers apart when the metrics split them); and,
    when evaluated, held-out perplexity of the trained ``model`` ("LongMem" or "MemTRM", with and without memory)
    relative to the backbone with the same local window. Returns the PNG path, or None when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics) if Path(metrics).exists() else []
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    loss = [r["loss"] for r in rows]
    avg = [sum(loss[max(0, i - smooth + 1):i + 1]) / len(loss[max(0, i - smooth + 1):i + 1]) for i in range(len(loss))]
    answered = [r for r in rows if r.get("answer_tokens")]
    evals = [(r["step"], r["eval"]) for r in rows if r.get("eval", {}).get("tokens")]
    n = 1 + bool(answered) + bool(evals)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    panels = iter(axes[0])
    ax = next(panels)
    ax.plot(steps, loss, alpha=0.3, label="train loss")
    ax.plot(steps, avg, label=f"moving average ({smooth})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    if answered:
        ax = next(panels)
        ax.plot([r["step"] for r in answered], [r["answer_nll"] for r in answered], alpha=0.3, label="per step")
        ax.plot(*_weighted_average(answered, "", smooth), label=f"moving average ({smooth} steps with answers)")
        for kind in ("_names", "_numbers"):  # the trainer splits them when the backbone has a tokenizer
            some = [r for r in answered if r.get(f"answer_tokens{kind}")]
            if some:
                ax.plot(*_weighted_average(some, kind, smooth), linestyle="--", label=f"{kind[1:]}, moving average")
        ax.set_xlabel("step")
        ax.set_ylabel("recall answers' NLL (nats/token)")
        ax.legend()
        ax.grid(alpha=0.3)
    if evals:
        ax = next(panels)
        at = [st for st, _ in evals]  # as ratios to the backbone: comparable across differently sized evaluations
        ax.plot(at, [e["longmem_ppl"] / e["backbone_ppl"] for _, e in evals], marker="o",
                label=f"{model} (local + memory)")
        nomem = [(st, e["no_memory_ppl"] / e["backbone_ppl"]) for st, e in evals if "no_memory_ppl" in e]
        if nomem:
            ax.plot(*zip(*nomem), marker="^", label=f"{model}, memory empty")
        ax.axhline(1.0, color="gray", linestyle="--", label="backbone, same local window")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out perplexity / backbone's")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
