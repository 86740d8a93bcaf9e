"""The device check's benchmarks: ingestion, the first answer token over a 1M-token memory, and training steps, on a
model of the default backbone's shapes with random weights.

    python -m longmem.bench.gpu --out gpu_bench.json      # on the GPU PyTorch sees (``make gpu-check`` runs it)
    python -m longmem.bench.gpu --device cpu --quick      # small sizes, to see that everything works (seconds)

Speed depends on the shapes, not on the weights: a SmolLM2-135M-Instruct of random weights (``SHAPES``, checked
against the real config by a test) with an untrained SideNet shaped as the shipped one measures what the product
runs, on a machine that has no copy of the backbone's GGUF (the lent GPU reaches no network, and the 98 MB file is
more than one call may carry). What the figures are:

- ``memorize``: tokens/s pushed into memory (``SegmentLM.memorize``: the backbone up to the cached layer, segment by
  segment, K/V moved to host RAM and indexed), the device synchronised at the end;
- ``answer``: a memory of ``bank_tokens`` random keys/values (searched where the model runs, as a loaded bank's
  memory is), then a reading-sized prompt whose last ``question_tokens`` search it: the first token (the prefill)
  and the median time per decoded token after it, greedy, as the chat answers;
- ``train``: forward, backward and AdamW steps of the SideNet on ``train_batch`` x segment_len tokens with a memory
  of ``train_memory`` tokens, in the dtype training runs in (float32 weights, bfloat16 autocast where the
  device computes it), tokens/s after one warm-up step.

The sizes are ``FULL`` (``QUICK`` with ``--quick``). Prints one JSON object, then a markdown table; ``--out`` also
writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import replace

import torch
import transformers

from longmem.memory.memory import Memory
from longmem.model.backbone import DEFAULT_BACKBONE, Backbone, dtype_choice, resolve_dtype
from longmem.model.device import DeviceError, add_device_flag, resolve_device
from longmem.model.lm import Sampling
from longmem.model.longmem import LongMemConfig, LongMemModel, shipped_checkpoint
from longmem.util.report import print_report

# SmolLM2-135M-Instruct's config.json (the GGUF's, as transformers converts it): 30 llama layers, GQA 9/3 of dim 64
SHAPES = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
              rope_theta=100000.0, tie_word_embeddings=True)
QUICK = dict(memorize_tokens=2048, bank_tokens=16384, prompt_tokens=192, question_tokens=16, new_tokens=8,
             train_batch=1, train_memory=2048, train_steps=2, segment_len=256)
FULL = dict(memorize_tokens=65536, bank_tokens=1_000_000, prompt_tokens=700, question_tokens=16, new_tokens=32,
            train_batch=8, train_memory=16384, train_steps=10, segment_len=1024)


def log(msg: str) -> None:
    print(f"[bench.gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model name."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    from longmem.bench.inference import cpu_name

    return cpu_name()


def random_model(device: str, dtype: torch.dtype, segment_len: int = 1024, seed: int = 0) -> LongMemModel:
    """A LongMem model of the default backbone's shapes (``SHAPES``) with random weights, its SideNet untrained and
    shaped as the shipped checkpoint's (memory layer, cached layer, K, chunk size, LoRA scope), on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(**SHAPES)).to(dtype)
    backbone = Backbone(hf, name="SmolLM2-135M-Instruct shapes, random weights")
    shipped = shipped_checkpoint(DEFAULT_BACKBONE)
    base = LongMemConfig.from_dict(json.loads((shipped / "config.json").read_text())["config"]) if shipped else \
        LongMemConfig()
    config = replace(base, backbone="random", dtype=str(dtype).removeprefix("torch."), segment_len=segment_len)
    return LongMemModel(backbone, config).to(device).eval()


def bench_memorize(model: LongMemModel, tokens: int, device: str) -> dict:
    ids = torch.randint(3, SHAPES["vocab_size"], (1, tokens), device=device)
    model.memorize(ids[:, : model.segment_len], model.new_memory(capacity=None))  # warm-up
    memory = model.new_memory(capacity=None)
    sync(device)
    t0 = time.perf_counter()
    model.memorize(ids, memory)
    sync(device)
    seconds = time.perf_counter() - t0
    return {"tokens": tokens, "s": seconds, "tok_s": tokens / seconds}


def random_memory(model: LongMemModel, tokens: int, device: str, seed: int = 0) -> Memory:
    """A one-row memory of ``tokens`` random keys/values (each segment's first token a sink, as ingestion marks it),
    searched where the model runs: what ``Bank.load_memory`` gives, without a bank."""
    spec, C = model.backbone.spec, model.chunk_size
    n = tokens // C
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(spec.n_kv_heads, n, C, spec.head_dim, generator=g).to(model.backbone.dtype)
    v = torch.randn(spec.n_kv_heads, n, C, spec.head_dim, generator=g).to(model.backbone.dtype)
    starts = torch.zeros(n, C, dtype=torch.bool)
    starts[:: model.segment_len // C, 0] = True
    return Memory.from_chunks(k, v, torch.full((n, C), -1, dtype=torch.int64), starts=starts,
                              search_device=model.backbone.device, max_sinks=model.max_sinks)


def search_kind(memory: Memory) -> str:
    """How ``memory`` is searched, in words (``longmem.memory``)."""
    if not memory.matmul:
        return "faiss, CPU"
    where = "CPU" if memory.search_device is None else str(memory.search_device)
    return f"matmul, {where}" + (", bfloat16 re-ranked" if memory.rows[0].mirror_dtype == torch.bfloat16 else "")


def bench_answer(model: LongMemModel, bank_tokens: int, prompt_tokens: int, question_tokens: int, new_tokens: int,
                 device: str, reps: int = 3) -> dict:
    memory = random_memory(model, bank_tokens, device)
    size = len(memory)  # before the answers: a window that overflows moves tokens into memory
    sampling = Sampling(max_new_tokens=new_tokens, temperature=0.0)
    firsts, per_token = [], []
    for rep in range(reps + 1):  # the first round warms up
        prompt = torch.randint(3, SHAPES["vocab_size"], (prompt_tokens,), generator=torch.Generator().manual_seed(rep))
        stamps = []
        sync(device)
        t0 = time.perf_counter()
        for _ in model.generate(prompt, memory, sampling, search_from=prompt_tokens - question_tokens):
            sync(device)
            stamps.append(time.perf_counter())
        if rep:
            firsts.append(stamps[0] - t0)
            per_token.append((stamps[-1] - stamps[0]) / max(1, len(stamps) - 1))
    return {"bank_tokens": size, "prompt_tokens": prompt_tokens, "question_tokens": question_tokens,
            "new_tokens": new_tokens, "search": search_kind(memory),
            "first_token_s": statistics.median(firsts), "first_token_max_s": max(firsts),
            "decode_ms_per_token": 1000 * statistics.median(per_token), "reps": reps}


def bench_train(device: str, batch: int, memory_tokens: int, steps: int, segment_len: int) -> dict:
    model = random_model(device, torch.float32, segment_len)  # training keeps float32 weights
    model.train()
    amp, _ = dtype_choice("auto", device)
    params = [p for _, p in model.named_trainable()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    T = model.segment_len
    memory = model.new_memory(batch_size=batch, capacity=None)
    with torch.no_grad():
        model.memorize(torch.randint(3, SHAPES["vocab_size"], (batch, memory_tokens), device=device), memory)
    times = []
    for step in range(steps + 1):  # step 0 warms up
        ids = torch.randint(3, SHAPES["vocab_size"], (batch, T), device=device)
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=amp, enabled=amp != torch.float32):
            loss = model(ids, memory, labels=ids, update_memory=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if step:
            times.append(time.perf_counter() - t0)
    return {"batch": batch, "segment_len": T, "memory_tokens": memory_tokens, "steps": steps,
            "autocast": str(amp).removeprefix("torch."), "trainable_params": sum(p.numel() for p in params),
            "step_s": statistics.median(times), "tok_s": batch * T / statistics.median(times),
            "loss": float(loss.detach())}


def markdown(r: dict) -> str:
    m, a, t = r["memorize"], r["answer"], r["train"]
    return "\n".join([
        f"Device: {r['device_name']} ({r['device']}), {r['dtype']}, torch {r['torch']}",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| memorize, {m['tokens']:,} tokens | {m['tok_s']:,.0f} tok/s |",
        f"| first answer token, {a['prompt_tokens']}-token prompt, {a['bank_tokens']:,}-token memory "
        f"(median of {a['reps']}, max) | {a['first_token_s']:.3f} s ({a['first_token_max_s']:.3f}) |",
        f"| decoding with that memory | {a['decode_ms_per_token']:.1f} ms/token |",
        f"| training, batch {t['batch']} x {t['segment_len']}, {t['memory_tokens']:,}-token memory, "
        f"{t['autocast']} autocast | {t['tok_s']:,.0f} tok/s ({t['step_s']:.3f} s/step) |",
    ])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m longmem.bench.gpu", description=__doc__.split("\n\n")[0])
    add_device_flag(p)
    p.add_argument("--dtype", default="auto", help="the model's dtype for memorize and answer (auto: bfloat16 where "
                                                   "the device computes it natively)")
    p.add_argument("--quick", action="store_true", help="small sizes, to check that it runs (seconds, also on a CPU)")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as e:
        raise SystemExit(f"error: {e}") from None
    sizes = QUICK if args.quick else FULL
    dtype = resolve_dtype(args.dtype, device)
    t0 = time.perf_counter()
    model = random_model(device, dtype, sizes["segment_len"])
    result = {"device": device, "device_name": device_name(device), "dtype": str(dtype).removeprefix("torch."),
              "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
              "python": platform.python_version(), "sizes": "quick" if args.quick else "full",
              "model": model.backbone.name, "sidenet": {k: getattr(model.config, k) for k in
                                                        ("memory_layer", "cached_layer", "topk", "chunk_size")}}
    log(f"memorize {sizes['memorize_tokens']:,} tokens on {result['device_name']}")
    result["memorize"] = bench_memorize(model, sizes["memorize_tokens"], device)
    log(f"answer over a {sizes['bank_tokens']:,}-token memory")
    result["answer"] = bench_answer(model, sizes["bank_tokens"], sizes["prompt_tokens"], sizes["question_tokens"],
                                    sizes["new_tokens"], device)
    del model
    log("training steps")
    result["train"] = bench_train(device, sizes["train_batch"], sizes["train_memory"], sizes["train_steps"],
                                  sizes["segment_len"])
    if torch.device(device).type == "cuda":
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    result["wall_s"] = time.perf_counter() - t0
    print_report(result, markdown(result), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
