"""Suite 6, ablations (paper figure 4): LongMem's memory chunk size on the ICL sets, its memory size on the books.

- **Chunk size** (2, 4, 8 tokens): the in-context-learning task of ``longmem.eval.icl`` at k shots with the same
  memory demonstrations, held in memories of each chunk size; LongMem reads K memory tokens per query either way
  (K / chunk size chunks per head). Label-word scoring, mean over seeds.
- **Memory size** (8k, 16k, 32k, 65k tokens): perplexity of the held-out books (whole, the 10k-100k split) with a
  memory that keeps only the last M tokens (first in, first out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from longmem.eval.books import score_documents, split_of
from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, mean_std, ppl, table
from longmem.eval.datasets.books import Document
from longmem.eval.icl import demo_memory, run_entrant, tasks_for
from longmem.eval.icl_report import Size as IclSize


@dataclass
class Size:
    chunk_sizes: list[int] = field(default_factory=lambda: [2, 4, 8])
    sets: list[str] = field(default_factory=lambda: ["SST-2", "MR", "Subj", "SST-5", "MPQA"])
    shots: int = 20  # k demonstrations in the prompt
    memory_demos: int = 2000
    seeds: int = 3
    test: int = 200
    memory_sizes: list[int] = field(default_factory=lambda: [8192, 16384, 32768, 65536])  # M, in tokens
    books: int = 8  # held-out books scored whole (cut at book_tokens)
    book_tokens: int = 100_000


QUICK = Size(chunk_sizes=[2, 8], sets=["SST-2"], shots=4, memory_demos=100, seeds=1, test=8, memory_sizes=[512, 1024],
             books=1, book_tokens=1536)
FULL = Size()


def chunk_size_ablation(ctx: EvalContext, size: Size) -> dict:
    """{chunk_size: {set: (mean, std) label-word accuracy %}} for LongMem."""
    longmem = ctx.entrant("longmem")
    icl = IclSize(sets=size.sets, shots=[size.shots], memory_demos=size.memory_demos, seeds=size.seeds,
                  test=size.test)
    accs: dict[int, dict[str, list[float]]] = {c: {} for c in size.chunk_sizes}
    for task in tasks_for(ctx, icl):
        for chunk_size in size.chunk_sizes:
            memory = demo_memory(longmem.lm, task.memory, task.preset.template, chunk_size)
            r = run_entrant(longmem, task, size.shots, memory)
            accs[chunk_size].setdefault(task.preset.name, []).append(100 * r.label_acc)
            ctx.log(f"ablation chunk size {chunk_size}, {task.preset.name} seed {task.seed}: {r.label_acc:.3f}")
    return {str(c): {s: mean_std(v) for s, v in by_set.items()} for c, by_set in accs.items()}


def memory_size_ablation(ctx: EvalContext, size: Size) -> dict:
    """{M: perplexity over the books} for LongMem."""
    docs = [Document(b.name, b.ids[: size.book_tokens]) for b in ctx.held_out_books()[: size.books]]
    pairs = [(split_of(len(d.ids)), d) for d in docs]
    out = {}
    for m in size.memory_sizes:
        r = score_documents(ctx.entrant("longmem"), pairs, m, ctx.log)
        nll = sum(s["nll"] for s in r["splits"].values())
        tokens = sum(s["tokens"] for s in r["splits"].values())
        out[str(m)] = {"ppl": ppl(nll, tokens), "tokens": tokens, "documents": r["documents"]}
    return out


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("ablations", QUICK, FULL)
    timer = Timer()
    chunks = chunk_size_ablation(ctx, size)
    memory = memory_size_ablation(ctx, size)
    rows = []
    for c in size.chunk_sizes:
        cells = [chunks[str(c)][s] for s in size.sets]
        avg = sum(m for m, _ in cells) / len(cells)
        rows.append([str(c)] + [f"{m:.1f}" if size.seeds < 2 else f"{m:.1f} ± {sd:.1f}" for m, sd in cells]
                    + [f"{avg:.1f}"])
    t1 = table(["chunk size"] + size.sets + ["Avg"], rows)
    t2 = table(["memory size M (tokens)", "perplexity"], [[f"{m:,}", f"{memory[str(m)]['ppl']:.3f}"]
                                                         for m in size.memory_sizes])
    best_c = max(size.chunk_sizes, key=lambda c: sum(chunks[str(c)][s][0] for s in size.sets))
    best_m = min(size.memory_sizes, key=lambda m: memory[str(m)]["ppl"])
    tokens = memory[str(size.memory_sizes[0])]["tokens"]
    notes = [f"Chunk size: LongMem {size.shots}-shot with {size.memory_demos:,} demonstrations in memory, label-word "
             f"accuracy %; best average at chunk size {best_c}.",
             f"Memory size: perplexity of {size.books} held-out book(s), {tokens:,} tokens scored; lowest at "
             f"M = {best_m:,}."]
    plot = _plot(ctx, size, chunks, memory)
    return SuiteResult("ablations", "Ablations (paper figure 4): chunk size and memory size",
                       [f"**Chunk size** (ICL accuracy %)\n\n{t1}", f"**Memory size** (held-out perplexity)\n\n{t2}"],
                       {"chunk_size": chunks, "memory_size": memory}, asdict(size), [plot], notes, timer.seconds)


def _plot(ctx: EvalContext, size: Size, chunks: dict, memory: dict) -> str:
    fig = figure(8.0, 3.2)
    ax = fig.add_subplot(1, 2, 1)
    for s in size.sets:
        ax.plot(size.chunk_sizes, [chunks[str(c)][s][0] for c in size.chunk_sizes], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(size.chunk_sizes, [str(c) for c in size.chunk_sizes])
    ax.set_xlabel("memory chunk size (tokens)")
    ax.set_ylabel("accuracy %")
    ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 2, 2)
    ax.plot(size.memory_sizes, [memory[str(m)]["ppl"] for m in size.memory_sizes], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xticks(size.memory_sizes, [f"{m // 1024}k" if m >= 1024 else str(m) for m in size.memory_sizes])
    ax.set_xlabel("memory size M (tokens)")
    ax.set_ylabel("perplexity")
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "ablations.png")
    return "ablations.png"
