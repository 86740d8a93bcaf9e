"""Ship a trained SideNet as the package's default: checkpoint files + a model card, at most 32 MB.

    python -m training.evaluate --checkpoint runs/smol/checkpoint --out runs/smol/eval.json
    python -m training.ship --run runs/smol --eval runs/smol/eval.json

Copies ``sidenet.safetensors`` and ``config.json`` of the run's checkpoint into ``longmem/checkpoints/<name>/``
(where ``LongMemModel.from_config`` finds it for the embedded backbone) and writes ``MODEL_CARD.md`` from the run's
``trainer.json``, ``metrics.jsonl`` and the evaluation JSON: data, steps, tokens seen, wall time, hardware,
held-out results. The optimizer state is not shipped. ``--dtype bfloat16`` stores the weights in bf16: half the
size (the compact checkpoint drops from 22 to 11 MiB, under the 16 MiB a file may have to come back from a GPU
machine), and no loss where the model runs in bf16 anyway (CPUs with native bf16, GPUs). ``--topk`` ships another
K (memory tokens each query reads) than the run trained with: a run-time setting, not a weight; the evaluation
must have used the same K.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from longmem.model.longmem import SHIPPED, SHIPPED_DIR
from longmem.util.files import atomic_directory
from longmem.util.names import current_names

from .plots import read_metrics

MAX_BYTES = 32 * 2**20  # the shipped checkpoint's budget
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _trainer_state(run: Path) -> dict:
    """A run's ``trainer.json``: in its ``checkpoint/`` (a live run) or beside its metrics (a committed record)."""
    for path in (run / "checkpoint" / "trainer.json", run / "trainer.json"):
        if path.is_file():
            return json.loads(path.read_text())
    raise SystemExit(f"{run}: no trainer.json (in checkpoint/ or the run directory)")


def training_facts(run: Path, parents: list[Path] = ()) -> dict:
    """Steps, tokens, hours and the last losses of ``run``, plus ``totals`` over the ``parents`` it continues (runs
    whose final SideNet it started from with ``--init``, oldest first) and itself."""
    state = _trainer_state(run)
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    rows = [r for r in rows if r["step"] <= state["step"]]  # a resumed run may have logged steps twice
    last = {r["step"]: r for r in rows}  # the last record of every step
    evals = [r for r in last.values() if r.get("eval", {}).get("tokens")]
    tail = list(last.values())[-50:]
    facts = {"run": run.name, "steps": state["step"], "config": state["config"], "data": state.get("data", {}),
             "tokens_seen": sum(r["tokens"] for r in last.values()),
             "train_hours": sum(r["s"] for r in last.values()) / 3600,
             "final_train_loss": sum(r["loss"] for r in tail) / max(1, len(tail)),
             "last_eval": evals[-1]["eval"] if evals else None}
    lineage = [training_facts(p) for p in parents] + [facts]
    facts["lineage"] = [{k: f[k] for k in ("run", "steps", "tokens_seen", "train_hours")} for f in lineage]
    facts["totals"] = {k: sum(f[k] for f in lineage) for k in ("steps", "tokens_seen", "train_hours")}
    return facts


def model_card(name: str, facts: dict, evaluation: dict | None, hardware: str,
               topk: tuple[int, int] | None = None) -> str:
    """The model card; ``topk`` = (K trained with, K shipped) when they differ."""
    c, d, t, lineage = facts["config"], facts["data"], facts["totals"], facts["lineage"]
    read = (f"- memory read at run time: K = {topk[1]} tokens per query (trained with K = {topk[0]}; K is a run-time "
            "setting, `LongMemConfig(topk=...)`, not a weight)" if topk and topk[0] != topk[1] else None)
    has_quotes = bool(d.get("quote_documents"))  # runs before quote documents existed did not count them
    quotes = " and quote documents (book passages quoted again a segment or more later)" if has_quotes else ""
    n_quotes = f", {d['quote_documents']:,} quote" if has_quotes else ""
    if d.get("reading_documents"):  # questions about books in the app's reading prompt (training/reading.py)
        quotes += (" and reading documents (a book in memory, then questions about it in the app's reading prompt "
                   "with an answer to each, the frozen backbone's or the question writer's)")
        n_quotes += f", {d['reading_documents']:,} reading"
    runs = "; ".join(f"`{r['run']}` ({r['steps']:,} steps, {r['tokens_seen']:,} tokens, {r['train_hours']:.1f} h)"
                     for r in lineage)
    lines = [f"# LongMem SideNet for SmolLM2-135M-Instruct ({name})", "",
             "A residual SideNet trained by memory-augmented adaptation (the LongMem paper, section 3.1) on top of the "
             "frozen SmolLM2-135M-Instruct. `LongMemModel.from_config()` loads it by default for the embedded backbone;"
             " `--untrained` gives the untrained SideNet (which reproduces the backbone).", "",
             "## Training", "",
             f"- data{' (of the last run)' if len(lineage) > 1 else ''}: books of the `train` split of "
             f"`shared/data/books` (Project Gutenberg, 2020-2022; the 8 `test` "
             f"books are held out) and synthetic long-range recall documents{quotes}: {d.get('documents', '?')} "
             f"documents ({d.get('recall_documents', '?')} recall{n_quotes}), {d.get('tokens', 0):,} tokens",
             f"- scope: `{c['train_scope']}` (LoRA rank {c['lora_rank']}), {c['batch_size']} rows x "
             f"{c['segment_len']} tokens per step, memory {c['memory_tokens']:,} tokens per row",
             f"- optimizer: AdamW (0.9, 0.98), eps 1e-6, weight decay {c['weight_decay']}, lr {c['lr']} "
             f"(warm-up {c['warmup_steps']}, polynomial power {c['lr_power']}), clipping {c['grad_clip']}",
             f"- steps: {t['steps']:,}; tokens seen: {t['tokens_seen']:,}; training time: {t['train_hours']:.1f} h; "
             f"hardware: {hardware}",
             *([f"- runs: {runs}; each started from the SideNet the one before it ended with"]
               if len(lineage) > 1 else []),
             *([read] if read else []),
             f"- final training loss (mean of the last 50 steps): {facts['final_train_loss']:.3f}",
             "- commands: in each run's record (`docs/runs/<run>/README.md` for the runs this project ships)", ""]
    if evaluation is not None:
        from .evaluate import markdown

        a = evaluation["args"]
        command = (f"python -m training.evaluate --checkpoint CHECKPOINT --books {a['books']} --tokens {a['tokens']} "
                   f"--recall {a['recall']} --distance {a['distance']} --seed {a['seed']}"
                   + (f" --topk {a['topk']}" if a.get("topk") is not None else ""))
        lines += ["## Held-out results", "",
                  f"On {a['books']} held-out books ({a['tokens']:,} tokens each) and {a['recall']} recall items, with",
                  "", "```bash", command, "```", "", markdown(evaluation, a["long_context"], a["distance"]), ""]
    return "\n".join(lines) + "\n"


def ship(run: Path, evaluation: Path | None, name: str | None = None, dest_root: Path = SHIPPED_DIR,
         hardware: str | None = None, dtype: str = "float32", parents: list[Path] = (),
         topk: int | None = None) -> Path:
    ckpt = run / "checkpoint"
    name = name or SHIPPED["default"]
    if dtype not in DTYPES:
        raise SystemExit(f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    files = [ckpt / "sidenet.safetensors", ckpt / "config.json"]
    weights = {k: v.to(DTYPES[dtype]) for k, v in load_file(str(files[0])).items()}
    size = sum(v.numel() * v.element_size() for v in weights.values()) + files[1].stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{ckpt}: {size / 2**20:.1f} MiB is over the {MAX_BYTES // 2**20} MiB budget; train with "
                         "--train-scope compact or a smaller --lora-rank")
    config = json.loads(files[1].read_text())
    config["config"] = current_names(config["config"])  # a run made before a setting was renamed ships the new name
    trained = config["config"]["topk"]
    if topk is not None:
        if topk < 1 or topk % config["config"]["chunk_size"]:
            raise SystemExit("--topk must be a positive multiple of the chunk size "
                             f"({config['config']['chunk_size']}), got {topk}")
        config["config"]["topk"] = topk
    facts = training_facts(run, parents)
    result = json.loads(evaluation.read_text()) if evaluation else None
    used = trained if result is None or result["args"].get("topk") is None else result["args"]["topk"]
    if used != config["config"]["topk"]:
        raise SystemExit(f"{evaluation} measured K = {used} memory tokens per query, the checkpoint would ship "
                         f"K = {config['config']['topk']}: evaluate with --topk {config['config']['topk']}")
    hardware = hardware or f"{platform.processor() or platform.machine()}, {platform.system()}"
    dest = dest_root / name
    with atomic_directory(dest) as tmp:
        save_file(weights, str(tmp / files[0].name), metadata={"format": "pt", "dtype": dtype})
        (tmp / files[1].name).write_text(json.dumps(config, indent=2) + "\n")
        card = model_card(name, facts, result, hardware, (trained, config["config"]["topk"]))
        (tmp / "MODEL_CARD.md").write_text(card)
        (tmp / "training.json").write_text(json.dumps({**facts, "evaluation": result}, indent=2))
    return dest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m training.ship", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="training run directory (with checkpoint/ and metrics.jsonl)")
    p.add_argument("--eval", default=None, help="JSON written by `python -m training.evaluate --out`")
    p.add_argument("--name", default=None, help="checkpoint directory name (default: the embedded backbone's)")
    p.add_argument("--hardware", default=None, help="what it was trained on, for the model card")
    p.add_argument("--dest", default=str(SHIPPED_DIR), help="where shipped checkpoints live")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="dtype of the shipped weights")
    p.add_argument("--parent", action="append", default=[],
                   help="an earlier run this one continues (--init from its final SideNet), counted in the model "
                        "card's steps, tokens and time; repeat oldest first")
    p.add_argument("--topk", type=int, default=None,
                   help="K, memory tokens each query reads, to ship (default: the run's); evaluate with the same")
    args = p.parse_args(argv)
    out = ship(Path(args.run), Path(args.eval) if args.eval else None, args.name, Path(args.dest), args.hardware,
               args.dtype, [Path(x) for x in args.parent], args.topk)
    print(f"shipped {out} ({sum(f.stat().st_size for f in out.iterdir()) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
