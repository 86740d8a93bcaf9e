"""``longmem eval <suite>``: run evaluation suites, write their JSON, markdown and plots, and the results document.

    longmem eval books --quick                      # one suite at CI size (seconds to minutes on a 2-core CPU)
    longmem eval all --quick                        # every suite, CI size
    longmem eval all --docs docs/results.md         # every suite, full size: the record (hours on a CPU)
    longmem eval icl --set icl.seeds=2 --set icl.test=100   # change one size setting of a suite

Every run writes ``<out>/<suite>.json`` (all numbers, sizes, wall time) and ``<out>/<suite>.md`` (the tables),
plus its PNG plots; ``--docs`` also writes one markdown document with every suite run, the exact command, commit,
hardware and wall time, and copies the plots next to it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import SUITES
from .core import EvalContext, SuiteResult, data_dir_default, lineup


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="longmem eval", description="The paper's evaluation suites on this backbone.")
    p.add_argument("suite", choices=[*SUITES, "all"], help="the suite to run, or all of them in order")
    p.add_argument("--quick", action="store_true", help="CI size: every suite in seconds to a few minutes")
    p.add_argument("--out", default="runs/eval", help="folder for the suites' JSON, markdown and PNG files")
    p.add_argument("--docs", default=None, metavar="PATH",
                   help="also write the results document here (e.g. docs/results.md), plots in PATH's folder")
    p.add_argument("--data", default=None, help="shared data folder: books/, icl/, squad/, arxiv/, MANIFEST.md "
                                                "(default: $LONGMEM_DATA_DIR or ../shared/data)")
    p.add_argument("--backbone", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct) or a local Hugging Face model directory")
    p.add_argument("--checkpoint", default=None,
                   help="SideNet checkpoint to evaluate (default: the one shipped for the backbone)")
    p.add_argument("--untrained", action="store_true", help="evaluate the untrained SideNet")
    p.add_argument("--memtrm", default=None, metavar="CKPT",
                   help="a trained MemTRM baseline checkpoint (python -m training --model memtrm) to compare too")
    p.add_argument("--full-context", type=int, default=None,
                   help="context of the full-attention backbone row (default: the backbone's native context)")
    p.add_argument("--set", action="append", default=[], metavar="SUITE.FIELD=VALUE",
                   help="change one size setting, e.g. icl.seeds=2 or books.books=4 (lists: comma-separated)")
    p.add_argument("--seed", type=int, default=0, help="first seed (demonstrations, test samples, items)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    return p.parse_args(argv)


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        suite, dot, name = key.partition(".")
        if not sep or not dot or suite not in SUITES:
            raise ValueError(f"--set {item!r}: expected SUITE.FIELD=VALUE with SUITE one of {', '.join(SUITES)}")
        out.setdefault(suite, {})[name] = value
    return out


def load_model(args: argparse.Namespace):
    from ..model import LongMemConfig, LongMemModel

    if args.checkpoint:
        return LongMemModel.load(args.checkpoint).eval()
    return LongMemModel.from_config(LongMemConfig(backbone=args.backbone), pretrained=not args.untrained).eval()


def run_suite(name: str, ctx: EvalContext) -> SuiteResult:
    """Run one suite and write its JSON and markdown into the context's output folder."""
    module = importlib.import_module(SUITES[name])
    changed = ctx.overrides.get(name)
    ctx.log(f"suite {name}: {'quick' if ctx.quick else 'full'} size" + (f", changed: {changed}" if changed else ""))
    result = module.run(ctx)
    (ctx.out_dir / f"{name}.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    (ctx.out_dir / f"{name}.md").write_text(result.markdown())
    ctx.log(f"suite {name}: done in {result.seconds / 60:.1f} min")
    return result


def provenance(model, argv: list[str], seconds: float) -> dict:
    """What the results document states about the run: command, commit, hardware, model, wall time."""
    from ..bench import machine_facts

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    return {"command": "longmem eval " + " ".join(argv), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine_facts("auto", torch.get_num_threads()),
            "platform": platform.platform(), "backbone": model.backbone.name,
            "sidenet": model.provenance.get("source") or model.provenance.get("run") or "see model card",
            "wall_s": seconds}


def results_document(results: list[SuiteResult], prov: dict, plot_dir: str) -> str:
    m = prov["machine"]
    head = ["# LongMem evaluation results", "",
            "Generated by `longmem eval` (do not edit by hand; run the command below again).", "",
            f"- command: `{prov['command']}`",
            f"- commit: `{prov['commit']}`{' (with uncommitted changes)' if prov['dirty'] else ''}, {prov['date']}",
            f"- hardware: {m['cpu']}, {m['cores']} cores, {m['threads']} torch threads, dtype {m['dtype']}, "
            f"torch {m['torch']}, faiss {m['faiss']}",
            f"- backbone: {prov['backbone']}; wall time {prov['wall_s'] / 60:.1f} min",
            f"- MemTRM baseline: `{prov['memtrm']}`" if prov.get("memtrm") else
            "- MemTRM baseline: not in these tables (no trained MemTRM checkpoint was given: `--memtrm`)", ""]
    return "\n".join(head) + "\n" + "\n".join(r.markdown(plot_dir) for r in results)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        overrides = parse_overrides(args.set)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(args)
    memtrm = None
    if args.memtrm:
        from ..baselines import MemTRM

        memtrm = MemTRM.load(args.memtrm, backbone=model.backbone).eval()
    log = lambda m: print(f"[eval {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    data = Path(args.data) if args.data else data_dir_default()
    ctx = EvalContext(model, lineup(model, args.full_context, memtrm), data, out, quick=args.quick, seed=args.seed,
                      overrides=overrides, log=log)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    results = []
    for name in names:
        results.append(run_suite(name, ctx))
        print(results[-1].markdown())
    if args.docs:
        docs = Path(args.docs)
        plot_dir = docs.parent / docs.stem  # docs/results.md -> docs/results/*.png
        plot_dir.mkdir(parents=True, exist_ok=True)
        for r in results:
            for plot in r.plots:
                shutil.copyfile(out / plot, plot_dir / plot)
        prov = provenance(model, argv, time.perf_counter() - t0)
        prov["memtrm"] = args.memtrm
        docs.write_text(results_document(results, prov, plot_dir.name))
        log(f"wrote {docs}")
    return 0
