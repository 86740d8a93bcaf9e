"""Training curves: metrics.jsonl (one JSON object per step) -> a PNG of train loss and held-out perplexity ratios."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def plot_metrics(metrics: Path, out: Path, smooth: int = 20) -> Path | None:
    """Plot the training loss (raw and a moving average) and, when evaluated, held-out perplexity of LongMem (with
    and without memory) relative to the backbone with the same local window. Returns the PNG path, or None when
    there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics) if Path(metrics).exists() else []
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    loss = [r["loss"] for r in rows]
    avg = [sum(loss[max(0, i - smooth + 1):i + 1]) / len(loss[max(0, i - smooth + 1):i + 1]) for i in range(len(loss))]
    evals = [(r["step"], r["eval"]) for r in rows if r.get("eval", {}).get("tokens")]
    fig, axes = plt.subplots(1, 2 if evals else 1, figsize=(11 if evals else 6, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot(steps, loss, alpha=0.3, label="train loss")
    ax.plot(steps, avg, label=f"moving average ({smooth})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    if evals:
        ax = axes[0][1]
        at = [st for st, _ in evals]  # as ratios to the backbone: comparable across differently sized evaluations
        ax.plot(at, [e["longmem_ppl"] / e["backbone_ppl"] for _, e in evals], marker="o",
                label="LongMem (local + memory)")
        nomem = [(st, e["no_memory_ppl"] / e["backbone_ppl"]) for st, e in evals if "no_memory_ppl" in e]
        if nomem:
            ax.plot(*zip(*nomem), marker="^", label="LongMem, memory empty")
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
