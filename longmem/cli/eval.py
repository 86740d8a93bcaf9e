"""``longmem eval <suite>``: run evaluation suites, write their JSON, markdown and plots, and the results document.

    longmem eval books --quick                      # one suite at CI size (seconds to minutes on a 2-core CPU)
    longmem eval all --quick                        # every suite, CI size
    longmem eval all --docs docs/results.md         # every suite, full size: the record (hours on a CPU)
    longmem eval icl --set icl.seeds=2 --set icl.test=100   # change one size setting of a suite
    longmem eval report --out runs/eval --docs docs/results.md   # the document from suites run before
    longmem eval report --out docs/results --docs docs/results.md  # the document again from its own copy of the data

Every run writes ``<out>/<suite>.json`` (all numbers, sizes, wall time, and the command, commit and machine that made
them) and ``<out>/<suite>.md`` (the tables), plus its PNG plots. ``--docs`` writes one markdown document from the suite
results in ``<out>`` and those the document already holds (so suites run at different times, or re-run alone, make one
document), each with its exact command, commit, hardware and wall time, and copies the suites' JSON (gzipped,
``<suite>.json.gz``: the per-item answers make it large) and plots next to it. ``report`` and ``compare`` read either
form.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from longmem.eval import SUITES
from longmem.eval.core import SIZE_ADDED_LATER, EvalContext, SuiteResult, lineup
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.device import DeviceError, add_device_flag, resolve_device
from longmem.util.data import add_data_flag
from longmem.util.files import write_file_atomic


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="longmem eval", description="The paper's evaluation suites on this backbone.")
    p.add_argument("suite", choices=[*SUITES, "all", "report", "compare"],
                   help="the suite to run, all of them in order, report: only write --docs from the results "
                        "already in --out, or compare: pair the answers in --out with those in --against, item by "
                        "item (bookqa, facts, natural)")
    p.add_argument("--quick", action="store_true", help="CI size: every suite in seconds to a few minutes")
    p.add_argument("--out", default="runs/eval", help="folder for the suites' JSON, markdown and PNG files")
    p.add_argument("--against", default=None, metavar="DIR", help="compare: the other run's --out folder")
    p.add_argument("--docs", default=None, metavar="PATH",
                   help="also write the results document here (e.g. docs/results.md), plots in PATH's folder")
    add_data_flag(p, "books/, icl/, squad/, arxiv/, MANIFEST.md")
    p.add_argument("--backbone", default="default",
                   help="'default' (embedded SmolLM2-135M-Instruct), a local .gguf file or Hugging Face model dir")
    p.add_argument("--checkpoint", default=None,
                   help="SideNet checkpoint to evaluate (default: the one shipped for the backbone)")
    p.add_argument("--untrained", action="store_true", help="evaluate the untrained SideNet")
    p.add_argument("--memtrm", default=None, metavar="CKPT",
                   help="a trained MemTRM baseline checkpoint (python -m training --model memtrm) to compare too")
    p.add_argument("--segment-len", type=int, default=None, metavar="TOKENS",
                   help="LongMem's local window, and the same-window backbone's (default: the checkpoint's, 1024); "
                        "a chat reads its passages into it")
    p.add_argument("--topk", type=int, default=None, metavar="K",
                   help="memory tokens each query token attends to (default: the checkpoint's; the shipped "
                        "SideNet's is 1,024); part of a resumed unit's signature")
    p.add_argument("--full-context", type=int, default=None,
                   help="context of the full-attention backbone row (default: the backbone's native context)")
    p.add_argument("--reader", default=None, metavar="MODEL",
                   help="the model the reading suites' app entrants and RAG baselines read with (natural, bookqa, "
                        "facts: their reader setting), memory off, over the banks of --backbone: a name as `longmem "
                        "chat --reader` takes it (auto: the best installed)")
    p.add_argument("--set", action="append", default=[], metavar="SUITE.FIELD=VALUE",
                   help="change one size setting, e.g. icl.seeds=2 or books.books=4 (lists: comma-separated)")
    p.add_argument("--seed", type=int, default=0, help="first seed (demonstrations, test samples, items)")
    p.add_argument("--resume", action="store_true",
                   help="go on from the work units an earlier run into the same --out finished (same sizes, seed, "
                        "dtype and models, the SideNet by its weights; icl records one unit per set and seed, bookqa "
                        "and facts one per block of questions at one distance, natural and finding one per set and "
                        "book)")
    add_runtime_flags(p)
    add_device_flag(p)
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
    from longmem.model.longmem import LongMemConfig, LongMemModel

    window = {"segment_len": args.segment_len} if args.segment_len else {}
    if args.topk is not None:
        if args.topk < 1:
            raise SystemExit(f"longmem eval: --topk must be >= 1, got {args.topk}")
        window["topk"] = args.topk
    device = resolve_device(args.device)
    if args.checkpoint:
        return LongMemModel.load(args.checkpoint, device=device, runtime={"dtype": args.dtype, **window}).eval()
    return LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype, **window), device=device,
                                    pretrained=not args.untrained).eval()


def run_suite(name: str, ctx: EvalContext) -> SuiteResult:
    """Run one suite and write its JSON and markdown into the context's output folder."""
    module = importlib.import_module(SUITES[name])
    changed = ctx.overrides.get(name)
    ctx.log(f"suite {name}: {'quick' if ctx.quick else 'full'} size" + (f", changed: {changed}" if changed else ""))
    result = module.run(ctx)
    result.provenance = ctx.provenance
    (ctx.out_dir / f"{name}.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    (ctx.out_dir / f"{name}.md").write_text(result.markdown())
    ctx.log(f"suite {name}: done in {result.seconds / 60:.1f} min")
    return result


def provenance(model, argv: list[str], sidenet: str, memtrm: str | None, dtype: str = "auto",
               sidenet_sha256: str | None = None) -> dict:
    """What a suite's result states about the run that made it: command, commit, date, hardware, models (the
    SideNet named as asked and by its weights' sha256, 16 hex digits; None when untrained), and the dtype: ``dtype``
    as asked (``--dtype``), the one the models ran in, and why."""
    from longmem.bench.inference import machine_facts

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    machine = machine_facts(dtype, torch.get_num_threads())
    machine["dtype"] = str(model.backbone.dtype).removeprefix("torch.")  # what the models ran in
    return {"command": "longmem eval " + " ".join(argv), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine,
            "platform": platform.platform(), "backbone": model.backbone.name,
            "sidenet": sidenet, "sidenet_sha256": sidenet_sha256, "topk": model.config.topk,
            "chunk_size": model.config.chunk_size, "segment_len": model.segment_len, "memtrm": memtrm}


def reduced_from_full(result: SuiteResult) -> dict[str, tuple]:
    """{size field: (value run, full-size value)} where ``result`` ran at other than the suite's full size."""
    full = json.loads(json.dumps(asdict(importlib.import_module(SUITES[result.suite]).FULL)))  # tuples -> lists
    made = {**{k: v for k, v in SIZE_ADDED_LATER.items() if k in full}, **result.size}  # a result older than a field
    return {k: (v, full[k]) for k, v in made.items() if k in full and v != full[k]}


def size_cell(result: SuiteResult) -> str:
    gaps = reduced_from_full(result)
    if not gaps:
        return "full"
    show = lambda v: (",".join(map(str, v)) or "all") if isinstance(v, list) else str(v)  # noqa: E731
    return "reduced: " + "; ".join(f"{k} {show(v)} (full {show(f)})" for k, (v, f) in gaps.items())


def results_document(results: list[SuiteResult], plot_dir: str) -> str:
    """The markdown document of suite results: how each was made (command, commit, date, wall time), the machine,
    then every suite's tables, notes and plots."""
    head = ["# LongMem evaluation results", "",
            "Generated by `longmem eval ... --docs` from the suites' JSON (do not edit by hand: run the commands "
            "again).", "", f"{sum(not reduced_from_full(r) for r in results)} of {len(results)} suites ran at the "
            "full size; the others at the reduced size their row names.", "",
            "| suite | size | command | commit | date | wall time |", "|---|---|---|---|---|---:|"]
    machines, memtrm, sidenets, backbones = [], set(), set(), set()
    for r in results:
        p = r.provenance
        dirty = " (uncommitted changes)" if p.get("dirty") else ""
        head.append(f"| {r.suite} | {size_cell(r)} | `{p.get('command', '?')}` | `{p.get('commit', '?')}`{dirty} "
                    f"| {p.get('date', '?')} | {r.seconds / 60:.1f} min |")
        m = p.get("machine")
        if m:
            line = (f"{m['cpu']}, {m['cores']} cores, {m['threads']} torch threads, dtype {m['dtype']}, "
                    f"torch {m['torch']}, faiss {m['faiss']}")
            machines += [line] if line not in machines else []
        memtrm.add(p.get("memtrm"))
        backbones.add(p.get("backbone", "?"))
        sidenets.add(f"{p.get('sidenet', '?')} (K = {p.get('topk', '?')} memory tokens per query, chunks of "
                     f"{p.get('chunk_size', '?')})")
    head += [""] + [f"Hardware: {m}." for m in machines] + [f"Backbone: {b}." for b in sorted(backbones)]
    head += [f"LongMem SideNet: {s}." for s in sorted(sidenets)]
    head.append("MemTRM baseline: " + (", ".join(f"`{m}`" for m in sorted(memtrm - {None})) + " (`--memtrm`)."
                                       if memtrm - {None} else
                                       "not in these tables (no trained MemTRM checkpoint was given: `--memtrm`)."))
    return "\n".join(head) + "\n\n" + "\n".join(r.markdown(plot_dir) for r in results)


def result_file(folder: Path, name: str) -> Path | None:
    """Where ``folder`` holds suite ``name``'s result: ``<name>.json`` (a run's folder) or ``<name>.json.gz`` (a
    document's copy); None where it holds neither."""
    for file in (folder / f"{name}.json", folder / f"{name}.json.gz"):
        if file.is_file():
            return file
    return None


def result_json(file: Path) -> bytes:
    """The JSON text of a suite result file, plain or gzipped."""
    return gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()


def read_result(file: Path) -> SuiteResult:
    """A suite result from its JSON file, plain or gzipped; ValueError naming the file where it is not one."""
    try:
        return SuiteResult.from_json(json.loads(result_json(file)))
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{file}: not a readable suite result ({type(e).__name__}: {e})") from e


def write_document(out: Path, docs: Path) -> Path:
    """``docs`` from the suite results in ``out`` and those the document already holds (in suite order). Each suite's
    JSON is kept gzipped in ``docs``'s folder (docs/results.md -> docs/results/; the same bytes for the same result)
    with its plots, so the document can be written again from there alone: ``longmem eval report --out docs/results
    --docs docs/results.md``. A suite in ``out`` replaces the document's copy of it; the other suites stay, so a long
    record can be run suite by suite, each in a folder of its own (to drop a suite, delete its copy and report again).
    Run from that folder, a plain ``<suite>.json`` copied into it replaces the suite's gzipped copy."""
    data_dir = docs.parent / docs.stem
    run = {name: file for name in SUITES if (file := result_file(out, name))}
    if not run:
        raise FileNotFoundError(f"{out}: no suite results (<suite>.json) to write a document from")
    files = {name: file for name in SUITES if (file := run.get(name) or result_file(data_dir, name))}
    results = [read_result(file) for file in files.values()]
    data_dir.mkdir(parents=True, exist_ok=True)
    for (name, file), r in zip(files.items(), results):
        copy = data_dir / f"{name}.json.gz"
        if file != copy:
            write_file_atomic(copy, gzip.compress(result_json(file), mtime=0))
            (data_dir / f"{name}.json").unlink(missing_ok=True)  # its plain copy, where there was one
        for plot in r.plots if file.parent.resolve() != data_dir.resolve() else []:
            shutil.copyfile(file.parent / plot, data_dir / plot)
    write_file_atomic(docs, results_document(results, data_dir.name).encode())
    return docs


def compare_runs(out: Path, against: str | None) -> int:
    """Print, for each item-scored suite that both folders hold, its entrants paired item by item."""
    from longmem.eval.compare import PAIRED_SUITES, markdown

    if not against:
        print("error: compare pairs --out with another run's folder; give --against DIR", file=sys.stderr)
        return 2
    other = Path(against)
    names = [n for n in PAIRED_SUITES if result_file(out, n) and result_file(other, n)]
    if not names:
        print(f"error: {out} and {other} hold no result of the same item-scored suite "
              f"({', '.join(PAIRED_SUITES)})", file=sys.stderr)
        return 2
    for name in names:
        try:
            a, b = (read_result(result_file(d, name)) for d in (out, other))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(markdown(a, b, str(out), str(other)) + "\n")
    return 0


READING_SUITES = ("natural", "bookqa", "facts")  # the suites whose entrants answer by reading (``ReadingSize``)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.reader:
        args.set += [f"{suite}.reader={args.reader}" for suite in READING_SUITES]
    try:
        overrides = parse_overrides(args.set)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if args.suite == "report":
        if not args.docs:
            print("error: report writes the --docs document; give --docs PATH", file=sys.stderr)
            return 2
        try:
            print(f"wrote {write_document(out, Path(args.docs))}")
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.suite == "compare":
        return compare_runs(out, args.against)
    try:
        args.device = resolve_device(args.device)  # a GPU that is not there fails before anything is written
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_cpu(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(args)
    from longmem.model.longmem import checkpoint_digest, shipped_checkpoint

    weights = args.checkpoint or (None if args.untrained else shipped_checkpoint(model.config.backbone))
    sidenet = args.checkpoint or ("shipped with the package" if weights else
                                  "untrained" + ("" if args.untrained else ": none ships for this backbone"))
    memtrm = None
    if args.memtrm:
        from longmem.model.baselines import MemTRM

        memtrm = MemTRM.load(args.memtrm, backbone=model.backbone, device=str(model.backbone.device)).eval()
    log = lambda m: print(f"[eval {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    data = args.data
    made_by = provenance(model, argv, sidenet, args.memtrm, args.dtype,
                         checkpoint_digest(weights)[:16] if weights else None)
    ctx = EvalContext(model, lineup(model, args.full_context, memtrm), data, out, quick=args.quick, seed=args.seed,
                      overrides=overrides, log=log, provenance=made_by, resume=args.resume)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    results = []
    for name in names:
        results.append(run_suite(name, ctx))
        print(results[-1].markdown())
    if args.docs:
        log(f"wrote {write_document(out, Path(args.docs))}")
    return 0
