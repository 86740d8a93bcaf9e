"""Speed and memory of LongMem next to the frozen backbone, on real text, in one run.

    python -m longmem.bench.inference                  # full run (M = 65,536 memory tokens; about 7 minutes on 2 cores)
    python -m longmem.bench.inference --quick          # small sizes, to see that everything works (about a minute)
    python -m longmem.bench.inference --out bench.json # also write the JSON to a file

Each scenario runs in a fresh Python process (``--scenario NAME``) so that its peak resident memory is its own:

- ``bank``: memorize throughput, then one bank filled with M tokens serves the 1k-token local forward (LongMem vs
  backbone), the retrieval itself (``Memory.search``) and greedy generation (LongMem with memory vs backbone);
- ``score-longmem-N`` / ``score-backbone-N``: negative log-likelihood of an N-token document, LongMem with a 1k
  local window plus memory (the paper's "1k + (N-1)k") vs the backbone attending to all N tokens at once.

Every timed item is run once untimed first; times are medians over ``--reps`` runs. Peak memory is the process's
VmHWM after the model is loaded (the load's own transient is reset via /proc/self/clear_refs). The parent prints
one JSON object (stdout), then a markdown table; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import faiss
import torch
import transformers
from tqdm import tqdm

from longmem.memory.memory import Memory
from longmem.model.backbone import Backbone, dtype_choice, int4_wanted, load_backbone
from longmem.model.baselines import BackboneLM
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.lm import Sampling, SegmentLM
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.util.cpu import cpu_bf16_features
from longmem.util.data import data_dir
from longmem.util.report import print_report

DEFAULT_BOOK = "books/pg64317.txt"  # a held-out book of the project's shared data (The Great Gatsby)


def default_text() -> str:
    """The benchmarks' default text: ``DEFAULT_BOOK`` in the shared data folder (``longmem.util.data``)."""
    return str(data_dir() / DEFAULT_BOOK)
TARGETS = {"memorize_tok_s": 1300.0, "retrieval_fraction": 0.25, "score_speedup": 1.3, "generation_ratio": 0.55}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# Process facts: resident memory and CPU steal (this machine is a VM; steal says how noisy the timings are)


def status_mb(field: str) -> float:
    """VmRSS / VmHWM of this process in MiB (ru_maxrss, KiB on Linux, when /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    """Restart peak-RSS accounting (VmHWM and ru_maxrss) from the current RSS; Linux >= 4.0."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 1
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine_facts(dtype: str, threads: int) -> dict:
    """The machine a measurement ran on, and the dtype ``dtype`` ("auto" or a name) gave its model, and why."""
    chosen, why = dtype_choice(dtype)
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "faiss": faiss.__version__,
            "dtype_requested": dtype, "dtype": str(chosen).removeprefix("torch."), "dtype_reason": why,
            "cpu_bf16": ", ".join(cpu_bf16_features()) or "none",
            "int4": int4_wanted() and chosen == torch.bfloat16}  # 4-bit models decode 4 bits (``model.int4``)


def report(results: dict, table: str, out: str | None) -> None:
    """A benchmark's output (``longmem.util.report.print_report``: JSON, a blank line, the table), then its time."""
    print_report(results, table, out)
    if out:
        log(f"wrote {out}")
    log(f"done in {results['wall_s']:.0f} s")


# ----------------------------------------------------------------------------------------------------------------
# Timing


def median_times(runs: dict[str, Callable[[], object]], reps: int,
                 warmups: dict[str, Callable[[], object]] | None = None) -> dict[str, float]:
    """Median wall seconds of each run over ``reps`` rounds, after one untimed warm-up each (``warmups[name]`` or
    the run itself). The runs alternate within a round, so a noisy machine slows all of them alike."""
    for name, run in runs.items():
        (warmups or {}).get(name, run)()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def time_generation(lm: SegmentLM, prompt: torch.Tensor, memory: Memory | None, n: int) -> dict:
    """Greedy generation of ``n`` tokens: total tokens/s, time to first token and steady decode tokens/s."""
    list(lm.generate(prompt, memory, Sampling(max_new_tokens=min(4, n), temperature=0)))  # warm-up
    t0 = time.perf_counter()
    first, count = 0.0, 0
    for _ in lm.generate(prompt, memory, Sampling(max_new_tokens=n, temperature=0)):
        count += 1
        if count == 1:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    decode = (count - 1) / (total - first) if count > 1 else float("nan")
    return {"tokens": count, "s": total, "tok_s": count / total, "first_token_s": first, "decode_tok_s": decode}


# ----------------------------------------------------------------------------------------------------------------
# Scenarios (each in its own process)


@dataclass
class Ctx:
    args: argparse.Namespace
    backbone: Backbone
    ids: torch.Tensor  # (1, T) real text, long enough for every item


def make_longmem(ctx: Ctx) -> LongMemModel:
    a = ctx.args
    cfg = LongMemConfig(backbone=a.backbone, dtype=a.dtype, segment_len=a.segment_len, chunk_size=a.chunk_size,
                        topk=a.topk, capacity=max(65536, a.memory_tokens))
    return LongMemModel(ctx.backbone, cfg).eval()


@torch.no_grad()
def scenario_bank(ctx: Ctx) -> dict:
    a, ids, out = ctx.args, ctx.ids, {}
    model, base = make_longmem(ctx), BackboneLM(ctx.backbone, a.segment_len)
    out["config"] = asdict(model.config)

    log(f"memorize throughput on {a.ingest_tokens:,} tokens")
    s = median_times({"memorize": lambda: model.memorize(ids[:, :a.ingest_tokens], model.new_memory())}, a.reps,
                     {"memorize": lambda: model.memorize(ids[:, :a.segment_len], model.new_memory())})["memorize"]
    out["memorize"] = {"tokens": a.ingest_tokens, "s": s, "tok_s": a.ingest_tokens / s}

    memory = model.new_memory()
    bar = tqdm(total=a.memory_tokens, unit="tok", desc="filling memory", file=sys.stderr, leave=False)
    t0 = time.perf_counter()
    model.memorize(ids[:, :a.memory_tokens], memory, progress=lambda done, _total: bar.update(done - bar.n))
    s = time.perf_counter() - t0
    bar.close()
    out["fill"] = {"tokens": len(memory), "s": s, "tok_s": a.memory_tokens / s, "rss_mb": status_mb("VmRSS")}
    log(f"memory holds {len(memory):,} tokens ({a.memory_tokens / s:.0f} tok/s)")

    seg = ids[:, a.memory_tokens:a.memory_tokens + a.segment_len]  # the text that follows the memorized part
    # real retrieval queries: what the (untrained, ReZero) memory layer sees is the backbone state at its boundary
    mem_idx, n_chunks = model.config.memory_layer, a.topk // a.chunk_size
    block, ops = model.sidenet.layers[mem_idx].block, ctx.backbone.ops
    h = ctx.backbone(seg, n_layers=model.sidenet.boundaries[mem_idx]).hidden[-1]
    q, _, _ = ops.qkv(block, ops.attn_norm(block, h))  # (1, Hq, T, d), pre-RoPE
    log(f"forward of {seg.shape[1]} tokens: LongMem (memory {len(memory):,}), backbone, and the retrieval alone "
        f"({tuple(q.shape)} queries, top {n_chunks} chunks)")
    t = median_times({"longmem": lambda: model(seg, memory, update_memory=False), "backbone": lambda: base(seg),
                      "search": lambda: memory.search(q, n_chunks=n_chunks)}, a.reps)
    per_1k = 1000 / seg.shape[1]
    out["forward"] = {"tokens": seg.shape[1], "longmem_s": t["longmem"], "backbone_s": t["backbone"],
                      "longmem_tok_s": seg.shape[1] / t["longmem"], "backbone_tok_s": seg.shape[1] / t["backbone"]}
    out["retrieval"] = {"queries": list(q.shape), "n_chunks": n_chunks, "memory_tokens": len(memory),
                        "ms_per_1k": 1e3 * t["search"] * per_1k,
                        "backbone_forward_ms_per_1k": 1e3 * t["backbone"] * per_1k,
                        "fraction_of_backbone_forward": t["search"] / t["backbone"]}

    prompt = ids[:, a.memory_tokens + a.segment_len:a.memory_tokens + a.segment_len + a.prompt_tokens]
    log(f"generation: {a.gen_tokens} tokens after a {prompt.shape[1]}-token prompt, LongMem with memory")
    gen_lm = time_generation(model, prompt, memory, a.gen_tokens)
    log("generation: backbone alone")
    gen_bb = time_generation(base, prompt, None, a.gen_tokens)
    out["generation"] = {"prompt_tokens": prompt.shape[1], "memory_tokens": len(memory), "longmem": gen_lm,
                         "backbone": gen_bb, "ratio": gen_lm["tok_s"] / gen_bb["tok_s"]}
    return out


@torch.no_grad()
def scenario_score(ctx: Ctx, which: str, n: int) -> dict:
    a, doc = ctx.args, ctx.ids[:, :n]
    lm = make_longmem(ctx) if which == "longmem" else BackboneLM(ctx.backbone, n)
    new_mem = (lambda: lm.new_memory()) if which == "longmem" else (lambda: None)
    log(f"scoring a {n:,}-token document: {which}"
        + (f" ({a.segment_len} local + memory)" if which == "longmem" else f" (full {n}-token attention)"))
    lm.nll(doc[:, :a.segment_len], new_mem())  # warm-up on one window
    t0 = time.perf_counter()
    nll, count = lm.nll(doc, new_mem())
    s = time.perf_counter() - t0
    return {"model": which, "tokens": n, "s": s, "tok_s": n / s, "ppl": float(torch.tensor(nll / count).exp())}


def run_scenario(args: argparse.Namespace) -> dict:
    """Load the backbone, run one scenario here, and return its numbers with this process's memory facts."""
    steal0, total0 = cpu_times()
    t0 = time.perf_counter()
    backbone = load_backbone(args.backbone, dtype=args.dtype)
    text = Path(args.text).read_text(encoding="utf-8", errors="replace")
    need = max(args.memory_tokens + args.segment_len + args.prompt_tokens, args.ingest_tokens,
               max(args.score_tokens))
    ids = torch.tensor(backbone.tokenizer(text[: 12 * need], add_special_tokens=False).input_ids)
    ids = ids.repeat(-(-need // len(ids)))[:need].view(1, -1)  # repeat a short text until it is long enough
    rss_load, peak_load = status_mb("VmRSS"), status_mb("VmHWM")
    load_s = time.perf_counter() - t0
    reset_peak_rss()
    ctx = Ctx(args, backbone, ids)
    name = args.scenario
    if name == "bank":
        out = scenario_bank(ctx)
    else:
        _, which, n = name.split("-")
        out = scenario_score(ctx, which, int(n))
    steal1, total1 = cpu_times()
    out["process"] = {"load_s": load_s, "rss_after_load_mb": rss_load, "peak_rss_during_load_mb": peak_load,
                      "peak_rss_mb": status_mb("VmHWM"), "wall_s": time.perf_counter() - t0,
                      "cpu_steal_pct": 100 * (steal1 - steal0) / max(1, total1 - total0)}
    out["process"]["peak_increment_mb"] = out["process"]["peak_rss_mb"] - rss_load
    return out


# ----------------------------------------------------------------------------------------------------------------
# The parent: one process per scenario, then ratios, targets and the table

CHILD_FLAGS = ("backbone", "dtype", "threads", "text", "segment_len", "chunk_size", "topk", "memory_tokens",
               "ingest_tokens", "gen_tokens", "prompt_tokens", "reps")


def spawn(name: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "longmem.bench.inference", "--scenario", name,
            "--score-tokens", ",".join(map(str, args.score_tokens))]
    for flag in CHILD_FLAGS:
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    return child_json(argv, f"scenario {name!r}")


def child_json(argv: list[str], what: str) -> dict:
    """Run a benchmark's child process (``argv``, this checkout on its path) and return the JSON object its last line
    of stdout prints; its stderr (progress) passes through. ``what`` names it in the error when it fails."""
    root = str(Path(__file__).resolve().parents[2])  # the checkout, for the child process
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def target(value: float, goal: float, higher_is_better: bool, **extra) -> dict:
    met = value >= goal if higher_is_better else value <= goal
    return {"value": value, "target": goal, "op": ">=" if higher_is_better else "<=", "met": bool(met), **extra}


def summarize(runs: dict[str, dict], score_tokens: list[int]) -> tuple[dict, dict]:
    """Ratios and targets from the scenarios' raw numbers."""
    bank = runs["bank"]
    scoring = {}
    for n in score_tokens:
        lm, bb = runs[f"score-longmem-{n}"], runs[f"score-backbone-{n}"]
        scoring[str(n)] = {"longmem_tok_s": lm["tok_s"], "backbone_tok_s": bb["tok_s"],
                           "speedup": lm["tok_s"] / bb["tok_s"], "longmem_peak_rss_mb": lm["process"]["peak_rss_mb"],
                           "backbone_peak_rss_mb": bb["process"]["peak_rss_mb"],
                           "peak_rss_ratio": lm["process"]["peak_rss_mb"] / bb["process"]["peak_rss_mb"],
                           "longmem_ppl": lm["ppl"], "backbone_ppl": bb["ppl"]}
    big = str(max(score_tokens))
    targets = {
        "memorize_tok_s": target(bank["memorize"]["tok_s"], TARGETS["memorize_tok_s"], True),
        "retrieval_fraction": target(bank["retrieval"]["fraction_of_backbone_forward"],
                                     TARGETS["retrieval_fraction"], False),
        "score_speedup": target(scoring[big]["speedup"], TARGETS["score_speedup"], True, doc_tokens=int(big)),
        "score_peak_rss_lower": {"value": scoring[big]["peak_rss_ratio"], "target": 1.0, "op": "<",
                                 "met": scoring[big]["peak_rss_ratio"] < 1.0, "doc_tokens": int(big)},
        "generation_ratio": target(bank["generation"]["ratio"], TARGETS["generation_ratio"], True),
    }
    return scoring, targets


def markdown(results: dict) -> str:
    bank, tg, seg = results["scenarios"]["bank"], results["targets"], results["config"]["segment_len"]
    fwd, ret, gen, mem = bank["forward"], bank["retrieval"], bank["generation"], bank["retrieval"]["memory_tokens"]

    def goal(key: str) -> tuple[str, str]:
        t = tg[key]
        return f"{t['op']} {t['target']:g}", "yes" if t["met"] else "**no**"

    rows = [("memorize (ingestion), tok/s", f"{bank['memorize']['tok_s']:.0f}", "", "", *goal("memorize_tok_s")),
            (f"fill memory with {bank['fill']['tokens']:,} tokens, tok/s", f"{bank['fill']['tok_s']:.0f}", "", "",
             "", ""),
            (f"forward {fwd['tokens']} tokens (memory {mem:,}), tok/s", f"{fwd['longmem_tok_s']:.0f}",
             f"{fwd['backbone_tok_s']:.0f}", f"{fwd['longmem_tok_s'] / fwd['backbone_tok_s']:.2f}x", "", ""),
            (f"retrieval (M={mem:,}) vs backbone forward, ms / 1k tokens", f"{ret['ms_per_1k']:.0f}",
             f"{ret['backbone_forward_ms_per_1k']:.0f}", f"{ret['fraction_of_backbone_forward']:.3f}",
             *goal("retrieval_fraction")),
            (f"generate {gen['longmem']['tokens']} tokens (memory {mem:,} / none), tok/s",
             f"{gen['longmem']['tok_s']:.1f}", f"{gen['backbone']['tok_s']:.1f}", f"{gen['ratio']:.2f}x",
             *goal("generation_ratio"))]
    for n, s in results["scoring"].items():
        main_doc = int(n) == tg["score_speedup"]["doc_tokens"]
        label = f"score {int(n):,}-token doc ({seg} local + {int(n) - seg} memory vs {n} full)"
        rows.append((f"{label}, tok/s", f"{s['longmem_tok_s']:.0f}", f"{s['backbone_tok_s']:.0f}",
                     f"{s['speedup']:.2f}x", *(goal("score_speedup") if main_doc else ("", ""))))
        rows.append((f"{label}, peak RSS MiB", f"{s['longmem_peak_rss_mb']:.0f}", f"{s['backbone_peak_rss_mb']:.0f}",
                     f"{s['peak_rss_ratio']:.2f}x", *(goal("score_peak_rss_lower") if main_doc else ("", ""))))
        rows.append((f"{label}, perplexity", f"{s['longmem_ppl']:.2f}", f"{s['backbone_ppl']:.2f}", "", "", ""))
    m = results["machine"]
    lines = [f"LongMem vs backbone: {m['dtype']}, {m['threads']} threads, {m['cpu']}", "",
             "| measurement | LongMem | backbone | ratio | target | met |", "|---|---:|---:|---:|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "| scenario (own process) | wall s | RSS after load MiB | peak RSS MiB | increment MiB "
                  "| CPU steal % |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in results["scenarios"].items():
        p = r["process"]
        lines.append(f"| {name} | {p['wall_s']:.0f} | {p['rss_after_load_mb']:.0f} | {p['peak_rss_mb']:.0f} | "
                     f"{p['peak_increment_mb']:.0f} | {p['cpu_steal_pct']:.1f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m longmem.bench.inference", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small sizes (8,192 memory tokens, 16 generated tokens, a 2k document, 1 rep) to check "
                        "in about a minute that everything runs")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    p.add_argument("--backbone", default="default",
                   help="'default' (SmolLM2-135M-Instruct), a .gguf file or an HF model dir")
    add_runtime_flags(p)
    p.add_argument("--text", default=default_text(), help="UTF-8 text to tokenize (repeated when too short)")
    p.add_argument("--segment-len", type=int, default=1024, help="LongMem local window (and backbone window)")
    p.add_argument("--chunk-size", "--csz", type=int, default=4, help="memory chunk size in tokens")
    p.add_argument("--topk", type=int, default=64,
                   help="memory tokens retrieved per query token (in topk / chunk size chunks)")
    p.add_argument("--memory-tokens", type=int, default=None,
                   help="tokens memorized into the bank for forward/retrieval/generation (default 65536; quick 8192)")
    p.add_argument("--ingest-tokens", type=int, default=None,
                   help="tokens for the memorize-throughput item (default 8192; quick 2048)")
    p.add_argument("--gen-tokens", type=int, default=None, help="tokens to generate (default 64; quick 16)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt length for generation")
    p.add_argument("--score-tokens", default=None,
                   help="comma-separated document lengths to score (default 4096,8192; quick 2048)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per short item, median reported "
                                                          "(default 3; quick 1)")
    p.add_argument("--scenario", default=None,
                   help="internal: run one scenario in this process ('bank', 'score-longmem-N', "
                        "'score-backbone-N') and print its JSON on one line")
    args = p.parse_args(argv)
    q = args.quick
    args.memory_tokens = args.memory_tokens or (8192 if q else 65536)
    args.ingest_tokens = args.ingest_tokens or (2048 if q else 8192)
    args.gen_tokens = args.gen_tokens or (16 if q else 64)
    args.reps = args.reps or (1 if q else 3)
    args.score_tokens = [int(x) for x in (args.score_tokens or ("2048" if q else "4096,8192")).split(",")]
    return finish_shared_args(p, args)


def finish_shared_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """What every benchmark settles the same way: ``--threads`` defaults to every core, and ``--text`` must exist."""
    args.threads = args.threads or os.cpu_count() or 1
    if not Path(args.text).is_file():
        p.error(f"text file {args.text} not found; give one with --text")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    setup_cpu(args.threads)
    if args.scenario is not None:
        result = run_scenario(args)
        print(json.dumps(result))
        return result

    t0 = time.perf_counter()
    names = ["bank"] + [f"score-{m}-{n}" for n in args.score_tokens for m in ("longmem", "backbone")]
    runs = {}
    for i, name in enumerate(names, 1):
        log(f"scenario {i}/{len(names)}: {name} (fresh process)")
        runs[name] = spawn(name, args)
    scoring, targets = summarize(runs, args.score_tokens)
    results = {"machine": machine_facts(args.dtype, args.threads), "config": runs["bank"].pop("config"),
               "quick": args.quick, "scoring": scoring, "targets": targets, "scenarios": runs,
               "all_targets_met": all(t["met"] for t in targets.values()), "wall_s": time.perf_counter() - t0}
    report(results, markdown(results), args.out)
    return results


if __name__ == "__main__":
    main()
