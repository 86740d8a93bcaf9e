"""Suite 5, efficiency (paper appendix table): tokens/s and peak memory of scoring long documents.

LongMem reads an N-token document with its 1k local window and the rest in memory (the paper's "1k + 3k" and
"1k + 7k" for N = 4k and 8k); the backbone attends to all N tokens at once. Each measurement runs in a fresh
process (``longmem.bench.inference``'s ``score-*`` scenarios) so its peak resident memory is its own; LongMem runs with
this model's chunk size and K. Speed does not depend on the SideNet's weights, so the bench's untrained SideNet stands
in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from longmem.bench import inference as bench
from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, table
from longmem.eval.datasets.books import book_split


@dataclass
class Size:
    documents: list[int] = field(default_factory=lambda: [4096, 8192])  # document lengths N, in tokens


QUICK = Size(documents=[1536])
FULL = Size()


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("efficiency", QUICK, FULL)
    timer = Timer()
    cfg = ctx.model.config
    args = bench.parse_args(["--backbone", cfg.backbone, "--dtype", cfg.dtype, "--chunk-size", str(cfg.chunk_size),
                             "--topk", str(cfg.topk), "--segment-len", str(cfg.segment_len),
                             "--threads", str(torch.get_num_threads()), "--text", str(book_text(ctx)),
                             "--score-tokens", ",".join(map(str, size.documents))])
    runs = {}
    for n in size.documents:
        for which in ("longmem", "backbone"):
            ctx.log(f"efficiency: scoring a {n:,}-token document, {which} (fresh process)")
            runs[f"{which}-{n}"] = bench.spawn(f"score-{which}-{n}", args)
    rows, data = [], {}
    local = cfg.segment_len
    for n in size.documents:
        lm, bb = runs[f"longmem-{n}"], runs[f"backbone-{n}"]
        data[str(n)] = {"longmem_tok_s": lm["tok_s"], "backbone_tok_s": bb["tok_s"],
                        "longmem_peak_rss_mb": lm["process"]["peak_rss_mb"],
                        "backbone_peak_rss_mb": bb["process"]["peak_rss_mb"],
                        "longmem_increment_mb": lm["process"]["peak_increment_mb"],
                        "backbone_increment_mb": bb["process"]["peak_increment_mb"]}
        d = data[str(n)]
        rows.append([f"LongMem, {_k(local)} local + {_k(n - local)} memory", f"{_k(n)}", f"{d['longmem_tok_s']:.0f}",
                     f"{d['longmem_peak_rss_mb']:.0f}", f"{d['longmem_increment_mb']:.0f}"])
        rows.append([f"backbone, {_k(n)} full attention", f"{_k(n)}", f"{d['backbone_tok_s']:.0f}",
                     f"{d['backbone_peak_rss_mb']:.0f}", f"{d['backbone_increment_mb']:.0f}"])
    notes = [f"LongMem reads {cfg.topk} memory tokens per query (chunks of {cfg.chunk_size}); "
             f"{', '.join(_speed(n, data[str(n)]) for n in size.documents)}.",
             "Peak RSS is the process's high-water mark after loading the model; the increment is what scoring "
             "added to it."]
    plot = _plot(ctx, size.documents, data)
    return SuiteResult("efficiency", "Efficiency (paper appendix): scoring a long document", [table(
        ["model", "document", "tokens/s", "peak RSS MiB", "increment MiB"], rows)],
        {"documents": data, "runs": runs, "topk": cfg.topk, "chunk_size": cfg.chunk_size}, asdict(size), [plot], notes,
        timer.seconds)


def book_text(ctx: EvalContext) -> Path:
    """The held-out book the bench scores: The Great Gatsby, else the first held-out book."""
    gatsby = ctx.data_dir / "books" / "pg64317.txt"
    return gatsby if gatsby.is_file() else book_split(ctx.data_dir)[1][0]


def _k(n: int) -> str:
    return f"{n / 1024:g}k"


def _speed(n: int, d: dict) -> str:
    r = d["longmem_tok_s"] / d["backbone_tok_s"]
    return f"at {_k(n)} LongMem runs at {r:.2f}x the backbone's speed"


def _plot(ctx: EvalContext, docs: list[int], data: dict) -> str:
    fig = figure(7.5, 3.2)
    for i, (key, label) in enumerate((("tok_s", "tokens/s"), ("peak_rss_mb", "peak RSS MiB"))):
        ax = fig.add_subplot(1, 2, i + 1)
        xs = range(len(docs))
        ax.bar([x - 0.2 for x in xs], [data[str(n)][f"longmem_{key}"] for n in docs], 0.4, label="LongMem")
        ax.bar([x + 0.2 for x in xs], [data[str(n)][f"backbone_{key}"] for n in docs], 0.4, label="backbone")
        ax.set_xticks(list(xs), [_k(n) for n in docs])
        ax.set_xlabel("document tokens")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "efficiency.png")
    return "efficiency.png"
