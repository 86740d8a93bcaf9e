"""How a command sets up torch on the CPU before it loads a model: its thread count and huge pages.

Every entry point (CLI, app, training, evaluation, benchmarks) calls ``setup_cpu(args.threads)`` first thing.
Huge pages: PyTorch backs CPU tensors of 2 MB and more with 2 MB transparent huge pages when the environment
variable ``THP_MEM_ALLOC_ENABLE`` is set (it calls ``madvise(MADV_HUGEPAGE)``; kernels in the common ``madvise``
mode otherwise give 4 KB pages). LongMem allocates large short-lived tensors every step (gathered memory keys and
values, attention scores, logits), and with 4 KB pages the kernel faulted and zeroed each of them page by page:
a MemTRM training step spent about 15% of its CPU time in the kernel. Measured on this project's 2-core machine
(``python -m training --model memtrm ...``, the run in ``training/runs/memtrm-l18``): median step 16.2 s over
56 steps without, 13.7 s with (the same run resumed), kernel time 832 -> 288 clock ticks per 30 s.
"""

from __future__ import annotations

import os

import torch

THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"


def setup_cpu(threads: int | None = None) -> None:
    """Use ``threads`` torch threads (None or 0: torch's default, every core) and huge pages for large tensors.

    Call it before the first large tensor is allocated: PyTorch reads the variable when it allocates. A value
    already in the environment wins (``THP_MEM_ALLOC_ENABLE=0`` turns huge pages off)."""
    os.environ.setdefault(THP_VARIABLE, "1")
    if threads:
        torch.set_num_threads(threads)
