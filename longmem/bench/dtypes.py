"""Both benchmarks in bfloat16 and in float32 on this machine, side by side with their ratios, in one run.

    python -m longmem.bench.dtypes                # full sizes of both benchmarks (about 30 minutes on 2 cores)
    python -m longmem.bench.dtypes --quick        # their quick sizes (about 6 minutes)
    python -m longmem.bench.dtypes --out dtypes.json

Runs ``python -m longmem.bench.inference`` and ``python -m longmem.bench.bank`` once per dtype (each runs its own
scenarios in fresh processes) and prints one JSON object, then a markdown table: every measurement in bfloat16, in
float32, and bfloat16 / float32. The header names the CPU and its native bfloat16 features, which decide what ``--dtype
auto`` picks here (``longmem.model.backbone.dtype_choice``). Perplexities are in the table too: the two dtypes score
the same text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from longmem.bench.inference import log, machine_facts, report

DTYPES = ("bfloat16", "float32")
# (label, benchmark, path into its JSON, higher is better); "{n}" stands for each scored document length
ROWS = [
    ("memorize (ingestion), tok/s", "bench.inference", "scenarios.bank.memorize.tok_s", True),
    ("LongMem forward, 1k tokens with memory, tok/s", "bench.inference", "scenarios.bank.forward.longmem_tok_s", True),
    ("backbone forward, 1k tokens, tok/s", "bench.inference", "scenarios.bank.forward.backbone_tok_s", True),
    ("retrieval (memory search), ms per 1k tokens", "bench.inference", "scenarios.bank.retrieval.ms_per_1k", False),
    ("LongMem generation with memory, tok/s", "bench.inference", "scenarios.bank.generation.longmem.tok_s", True),
    ("backbone generation, tok/s", "bench.inference", "scenarios.bank.generation.backbone.tok_s", True),
    ("LongMem scoring a {n}-token document, tok/s", "bench.inference", "scoring.{n}.longmem_tok_s", True),
    ("backbone scoring a {n}-token document, tok/s", "bench.inference", "scoring.{n}.backbone_tok_s", True),
    ("LongMem scoring a {n}-token document, peak RSS MiB", "bench.inference", "scoring.{n}.longmem_peak_rss_mb", False),
    ("LongMem perplexity of the {n}-token document", "bench.inference", "scoring.{n}.longmem_ppl", False),
    ("backbone perplexity of the {n}-token document", "bench.inference", "scoring.{n}.backbone_ppl", False),
    ("bank: bare memorize, tok/s", "bench.bank", "ingest.memorize_tok_s", True),
    ("bank: ingest end to end (file, tokenise, backbone, SQLite, faiss), tok/s", "bench.bank",
     "ingest.ingest_tok_s", True),
]  # a bank's reopen time is left out: it loads no model, and its keys/values are bfloat16 whatever the model's


def dig(obj: dict, path: str):
    for key in path.split("."):
        obj = obj[key]
    return obj


def run_benchmark(module: str, dtype: str, args: argparse.Namespace, out: Path) -> dict:
    """``python -m longmem.<module> --dtype DTYPE`` in its own process; its JSON (its progress goes to stderr)."""
    argv = [sys.executable, "-m", f"longmem.{module}", "--dtype", dtype, "--out", str(out)]
    argv += (["--quick"] if args.quick else []) + (["--threads", str(args.threads)] if args.threads else [])
    root = str(Path(__file__).resolve().parents[2])  # the checkout, for the child process
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} --dtype {dtype} failed (exit {proc.returncode})")
    return json.loads(out.read_text())


def side_by_side(runs: dict[str, dict[str, dict]]) -> list[dict]:
    """One row per measurement: its value in each dtype and bfloat16 / float32."""
    lengths = list(runs["bfloat16"]["bench.inference"]["scoring"])
    rows = []
    for label, bench, path, higher in ROWS:
        for n in (lengths if "{n}" in path else [None]):
            values = {d: dig(runs[d][bench], path.format(n=n)) for d in DTYPES}
            rows.append({"measurement": label.format(n=f"{int(n):,}" if n else ""), "benchmark": bench,
                         **values, "bf16_over_fp32": values["bfloat16"] / values["float32"],
                         "higher_is_better": higher})
    return rows


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"bfloat16 vs float32 on {m['cpu']} ({m['cores']} cores, {m['threads']} torch threads); native bfloat16: "
             f"{m['cpu_bf16']}; `--dtype auto` picks {m['dtype_reason']}", "",
             "| measurement | bfloat16 | float32 | bf16 / fp32 |", "|---|---:|---:|---:|"]
    for r in results["rows"]:
        fmt = (lambda v: f"{v:.2f}") if max(r["bfloat16"], r["float32"]) < 100 else (lambda v: f"{v:,.0f}")
        better = (r["bf16_over_fp32"] > 1) == r["higher_is_better"]
        same = "perplexity" in r["measurement"] or abs(r["bf16_over_fp32"] - 1) < 0.005
        note = "" if same else (" (bf16 better)" if better else " (fp32 better)")
        lines.append(f"| {r['measurement']} | {fmt(r['bfloat16'])} | {fmt(r['float32'])} | "
                     f"{r['bf16_over_fp32']:.2f}x{note} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m longmem.bench.dtypes", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="both benchmarks at their quick sizes")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    runs: dict[str, dict[str, dict]] = {d: {} for d in DTYPES}
    with tempfile.TemporaryDirectory(prefix="longmem-bench-dtypes-") as tmp:
        for module in ("bench.inference", "bench.bank"):
            for dtype in DTYPES:
                log(f"{module} in {dtype}")
                runs[dtype][module] = run_benchmark(module, dtype, args, Path(tmp) / f"{module}-{dtype}.json")
    results = {"machine": machine_facts("auto", args.threads or os.cpu_count() or 1), "quick": args.quick,
               "rows": side_by_side(runs), "runs": runs, "wall_s": time.perf_counter() - t0}
    report(results, markdown(results), args.out)
    return results


if __name__ == "__main__":
    main()
