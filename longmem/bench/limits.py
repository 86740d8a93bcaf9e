"""What the machine could do for ingestion: the model's work per token, and the CPU's matmul rate on its shapes.

    flops = ingest_flops(model)             # FLOPs a token costs when a book is read into memory
    rate = matmul_rate(model)               # GFLOP/s torch reaches on the model's own matmuls, in its dtype
    share = tokens_per_s * flops.per_token / (rate.gflops * 1e9)
    top = ceiling(flops, rate, attention_rate(model))  # the best share torch's own kernels allow

Reading a book into memory runs each segment through the backbone's first ``cached_layer`` layers, then the K/V
projections of layer m (``SegmentLM.encode_memory``). Its work is counted from the model itself, not typed in:
every 2-D weight of those layers is one matmul (2 FLOPs per weight and token; what ``Backbone.layers`` holds, so
llama, Qwen2 and GPT-2 alike), the attention's two products over a causal segment (``4 * Hq * d * (T + 1) / 2``
per token and layer: on average a token attends to half the segment), and layer m's K and V projections
(``4 * E * Hkv * d``). Norms, RoPE, softmax and the rest are not matmuls and are left out: they are the overhead
that the share exposes.

The rate is measured, not looked up: ``torch.nn.functional.linear`` on copies of layer 0's weights (the shapes and
dtype ingestion uses) with as many rows as one segment (``segment_len`` tokens, what ingestion multiplies), the best
of a few timed blocks after a warm-up, in the thread count this process runs with. So the share is against what
this CPU does for these shapes: its bfloat16 units where the run is bfloat16, its float32 rate where it is float32.

The attention's two products do not run in those matmuls but in torch's fused attention kernel, which on a CPU
reaches a fraction of the matmul rate for a head dimension of 64. ``attention_rate`` times that kernel on the model's
own attention shapes, and ``ceiling`` is the share ingestion would reach if nothing but the two kinds of kernel ran,
each at its measured rate: the most that removing overhead (norms, RoPE, casts, copies, Python) can give without a
faster attention kernel.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class IngestFlops:
    """FLOPs per token of reading a book into memory (``ingest_flops``), by part."""

    linear: float  # the weight matmuls of the layers run (2 FLOPs per weight)
    attention: float  # scores and weighted values over a causal segment
    kv: float  # layer m's K and V projections
    layers: int  # backbone layers run in full
    segment_len: int

    @property
    def per_token(self) -> float:
        return self.linear + self.attention + self.kv

    def to_dict(self) -> dict:
        return {**asdict(self), "per_token": self.per_token}


@dataclass(frozen=True)
class MatmulRate:
    """What torch reaches on the model's matmul shapes (``matmul_rate``)."""

    gflops: float  # GFLOP/s over all shapes, timed together: the best block
    rows: int  # tokens per matmul (one segment by default)
    shapes: list  # (in, out) of each weight, once per layer
    dtype: str
    threads: int
    seconds: float  # time measured (after the warm-up)
    mean_gflops: float  # over all the blocks: below ``gflops`` by as much as the machine's rate swings

    def to_dict(self) -> dict:
        return asdict(self)


def _weights(layer: torch.nn.Module) -> list[torch.Tensor]:
    """The layer's matmul weights: its 2-D parameters (biases and norms are 1-D)."""
    return [p for p in layer.parameters() if p.dim() == 2]


def ingest_flops(model) -> IngestFlops:
    """FLOPs per token to read text into ``model``'s memory (a ``SegmentLM``): see the module docstring."""
    bb, spec = model.backbone, model.backbone.spec
    n, T = model.cached_layer, model.segment_len
    linear = sum(2.0 * w.numel() for layer in list(bb.layers)[:n] for w in _weights(layer))
    attention = n * 4.0 * spec.n_heads * spec.head_dim * (T + 1) / 2
    kv = 4.0 * spec.hidden * spec.n_kv_heads * spec.head_dim
    return IngestFlops(linear=linear, attention=attention, kv=kv, layers=n, segment_len=T)


def best_rate(run: Callable[[], None], flops: float, min_seconds: float, blocks: int) -> tuple[float, float, float]:
    """(GFLOP/s, seconds timed, GFLOP/s over all the blocks) of ``run``, which does ``flops`` of work: one warm-up
    call, then the best of ``blocks`` timed blocks of about ``min_seconds / blocks`` each (the machine's rate, not a
    moment when another process had the core), and the rate over them all (a VM's matrix units can swing two-fold
    within seconds: the two apart say by how much)."""
    run()
    best, total, work = 0.0, 0.0, 0.0
    for _ in range(blocks):
        calls, t0 = 0, time.perf_counter()
        while True:
            run()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds / blocks:
                break
        best, total, work = max(best, flops * calls / elapsed / 1e9), total + elapsed, work + flops * calls
    return best, total, work / total / 1e9


@torch.no_grad()
def matmul_rate(model, batch_segments: int = 1, min_seconds: float = 2.0, blocks: int = 5) -> MatmulRate:
    """GFLOP/s of ``F.linear`` on layer 0's weight shapes in the model's dtype, ``batch_segments * segment_len`` rows
    each (one segment: what ingestion multiplies), after one warm-up round: the best of ``blocks`` timed blocks of
    about ``min_seconds / blocks`` each (the machine's rate, not a moment when another process had the core)."""
    layer = model.backbone.layers[0]
    weights = [w.detach().clone() for w in _weights(layer)]
    rows = batch_segments * model.segment_len
    dtype = weights[0].dtype
    # GPT-2's Conv1D stores (in, out), nn.Linear (out, in): multiply by whichever side matches, same FLOPs
    inputs = [torch.randn(rows, w.shape[1], dtype=dtype, device=w.device) for w in weights]
    flops_round = sum(2.0 * rows * w.numel() for w in weights)
    on_gpu = weights[0].device.type == "cuda"

    def one_round() -> None:
        for x, w in zip(inputs, weights):
            F.linear(x, w)
        if on_gpu:  # the time of the products, not of their launch
            torch.cuda.synchronize()

    best, total, mean = best_rate(one_round, flops_round, min_seconds, blocks)
    return MatmulRate(gflops=best, rows=rows, shapes=[tuple(w.shape[::-1]) for w in weights],
                      dtype=str(dtype).replace("torch.", ""), threads=torch.get_num_threads(), seconds=total,
                      mean_gflops=mean)


@torch.no_grad()
def attention_rate(model, min_seconds: float = 1.0, blocks: int = 5) -> MatmulRate:
    """GFLOP/s of ``F.scaled_dot_product_attention`` on one causal segment of the model's attention shapes (its query
    heads and head dimension, ``segment_len`` tokens, its dtype: what each layer of ingestion runs), counted as
    ``ingest_flops`` counts attention, the best of ``blocks`` timed blocks after a warm-up."""
    spec, T = model.backbone.spec, model.segment_len
    dtype, device = model.backbone.dtype, model.backbone.device
    q, k, v = (torch.randn(1, spec.n_heads, T, spec.head_dim, dtype=dtype, device=device) for _ in range(3))
    flops_call = 4.0 * spec.n_heads * spec.head_dim * T * (T + 1) / 2
    on_gpu = device.type == "cuda"

    def one_call() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if on_gpu:
            torch.cuda.synchronize()

    best, total, mean = best_rate(one_call, flops_call, min_seconds, blocks)
    return MatmulRate(gflops=best, rows=T, shapes=[(spec.n_heads, T, spec.head_dim)],
                      dtype=str(dtype).replace("torch.", ""), threads=torch.get_num_threads(), seconds=total,
                      mean_gflops=mean)


def ceiling(flops: IngestFlops, rate: MatmulRate, attention: MatmulRate) -> float:
    """The share of ``rate`` that ingestion reaches when its weight matmuls run at ``rate`` and its attention at the
    attention kernel's ``attention`` rate, with nothing else taking time: the bound that removing overhead cannot
    pass."""
    seconds = (flops.linear + flops.kv) / (rate.gflops * 1e9) + flops.attention / (attention.gflops * 1e9)
    return flops.per_token / seconds / (rate.gflops * 1e9)


def share(tokens_per_s: float, flops: IngestFlops, rate: MatmulRate) -> float:
    """Ingestion's FLOP rate as a share of the matmul rate (1.0: every cycle a matmul of the model's shapes)."""
    return tokens_per_s * flops.per_token / (rate.gflops * 1e9)


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math")


@torch.no_grad()
def profile_segment(model, reps: int = 3, top: int = 12) -> dict:
    """Where one segment's encoding (``encode_memory`` on ``segment_len`` tokens, what ingestion runs per segment)
    spends its time: torch's profiler over ``reps`` segments after a warm-up, each op's self CPU time, the ``top``
    ops listed, and the share of matmul and attention kernels (``MATMUL_OPS``) against everything else."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(10, model.backbone.spec.vocab_size - 10, (1, model.segment_len))
    model.encode_memory(ids)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            model.encode_memory(ids)
    wall = (time.perf_counter() - t0) / reps
    ops = sorted(((e.key, e.self_cpu_time_total / reps / 1e6, e.count // reps) for e in prof.key_averages()),
                 key=lambda x: -x[1])
    total = sum(s for _, s, _ in ops)
    matmul = sum(s for k, s, _ in ops if k in MATMUL_OPS)
    return {"segment_s": wall, "self_cpu_s": total, "matmul_share": matmul / total if total else 0.0,
            "top": [{"op": k, "s": s, "share": s / total, "calls": c} for k, s, c in ops[:top]]}


@torch.no_grad()
def compiled_segments(model, batch_segments: int = 4, reps: int = 3) -> dict:
    """What ``torch.compile`` of the decoder layers' forward (the layers ingestion runs) does to encoding
    ``batch_segments`` segments at once: tok/s eager and compiled, the compile's own seconds, the largest difference in
    the keys stored (``Backbone.compiled_layers``, which refuses by name where there is no C++ compiler)."""
    ids = torch.randint(10, model.backbone.spec.vocab_size - 10, (batch_segments, model.segment_len))

    def timed() -> tuple[float, torch.Tensor]:
        k, _ = model.encode_memory(ids)
        t0 = time.perf_counter()
        for _ in range(reps):
            model.encode_memory(ids)
        return ids.numel() * reps / (time.perf_counter() - t0), k

    eager_tok_s, k_eager = timed()
    with model.backbone.compiled_layers(model.cached_layer):  # as ``ingest(compile=True)`` runs a full segment
        t0 = time.perf_counter()
        model.encode_memory(ids)
        compile_s = time.perf_counter() - t0
        compiled_tok_s, k_compiled = timed()
    return {"segments": batch_segments, "eager_tok_s": eager_tok_s, "compiled_tok_s": compiled_tok_s,
            "compile_s": compile_s, "max_key_difference": (k_eager.float() - k_compiled.float()).abs().max().item(),
            "max_key": k_eager.float().abs().max().item()}


def main(argv: list[str] | None = None) -> dict:
    """``python -m longmem.bench.limits``: the model's ingestion work per token, this CPU's matmul rate on its shapes
    (one segment and a batch of four) and its attention kernel's rate, the ceiling they set, and a profile of one
    segment's encoding; JSON, then markdown."""
    import argparse
    import json

    from longmem.bench.inference import log, machine_facts
    from longmem.model.cpu import add_runtime_flags, setup_cpu
    from longmem.model.longmem import LongMemConfig, LongMemModel

    p = argparse.ArgumentParser(prog="python -m longmem.bench.limits", description=main.__doc__.split(":", 1)[1])
    p.add_argument("--backbone", default="default", help="'default', a .gguf file or a Hugging Face model folder")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--compile", action="store_true",
                   help="also time torch.compile of the decoder layers (four segments at once; needs a C++ compiler)")
    add_runtime_flags(p)
    args = p.parse_args(argv)
    setup_cpu(args.threads)
    model = LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype)).eval()
    flops = ingest_flops(model)
    rates = {b: matmul_rate(model, batch_segments=b) for b in (1, 4)}
    attention = attention_rate(model)
    log("profiling one segment's encoding")
    prof = profile_segment(model)
    seg_tok_s = model.segment_len / prof["segment_s"]
    out = {"machine": machine_facts(args.dtype, args.threads or torch.get_num_threads()), "flops": flops.to_dict(),
           "matmul": {str(b): r.to_dict() for b, r in rates.items()}, "profile": prof,
           "attention": attention.to_dict(), "ceiling": ceiling(flops, rates[1], attention),
           "segment_tok_s": seg_tok_s, "segment_share": share(seg_tok_s, flops, rates[1])}
    rows = [f"Ingestion's limits: {model.backbone.name}, {out['machine']['dtype']}, {out['machine']['threads']} "
            f"threads, {out['machine']['cpu']}", "",
            "| measure | value |", "|---|---:|",
            f"| work per token, GFLOP ({flops.layers} layers, attention {100 * flops.attention / flops.per_token:.0f}%)"
            f" | {flops.per_token / 1e9:.3f} |"]
    rows += [f"| matmul rate, {r.rows:,} rows, GFLOP/s: best block (over all blocks) | {r.gflops:,.0f} "
             f"({r.mean_gflops:,.0f}) |" for r in rates.values()]
    rows += [f"| attention kernel rate, one causal segment, GFLOP/s: best block (over all blocks) | "
             f"{attention.gflops:,.0f} ({attention.mean_gflops:,.0f}) |",
             f"| ceiling: the share with matmuls ({rates[1].rows:,} rows) and attention at those rates, nothing else | "
             f"{out['ceiling']:.2f} |"]
    rows += [f"| one segment encoded, tok/s (as a share of the {rates[1].rows:,}-row rate) | {seg_tok_s:,.0f} "
             f"({out['segment_share']:.2f}) |",
             f"| matmul and attention kernels, share of the segment's CPU time | {prof['matmul_share']:.2f} |",
             "", "| op (self CPU time per segment) | ms | share | calls |", "|---|---:|---:|---:|"]
    rows += [f"| `{t['op']}` | {1e3 * t['s']:.1f} | {t['share']:.2f} | {t['calls']} |" for t in prof["top"]]
    if args.compile:
        log("compiling the decoder layers (torch.compile)")
        c = out["compiled"] = compiled_segments(model)
        rows += ["", f"torch.compile, {c['segments']} segments at once: {c['eager_tok_s']:,.0f} tok/s eager, "
                 f"{c['compiled_tok_s']:,.0f} compiled ({share(c['compiled_tok_s'], flops, rates[1]):.2f} of the rate) "
                 f"after {c['compile_s']:.0f} s of compiling; largest key difference {c['max_key_difference']:.3g} "
                 f"(keys up to {c['max_key']:.3g})"]
    print(json.dumps(out, indent=2, default=str))
    print("\n" + "\n".join(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return out


if __name__ == "__main__":
    main()
