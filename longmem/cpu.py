"""How a command sets up torch on the CPU before it loads a model: its thread count, huge pages, and the ``--dtype``
flag every command that loads a model shares.

Every entry point (CLI, app, training, evaluation, benchmarks) calls ``setup_cpu(args.threads)`` before its model.
Huge pages: PyTorch backs CPU tensors of 2 MB and more with 2 MB transparent huge pages when the environment
variable ``THP_MEM_ALLOC_ENABLE`` is set (it calls ``madvise(MADV_HUGEPAGE)``; kernels in the common ``madvise``
mode otherwise give 4 KB pages). LongMem allocates large short-lived tensors every step (gathered memory keys and
values, attention scores, logits), and with 4 KB pages the kernel faulted and zeroed each of them page by page:
a MemTRM training step spent about 15% of its CPU time in the kernel. Measured on this project's 2-core machine
(``python -m training --model memtrm ...``, the run in ``training/runs/memtrm-l18``, resumed at step 926 with them):
median step 16.2 s over steps 871-926 without, 13.2 s over 928-1,021 with; the process's kernel time fell from 832 to
288 clock ticks per 30 s and its user time rose from 4,836 to 5,511 (``/proc/PID/stat``).
"""

from __future__ import annotations

import argparse
import os

import torch

from .backbone import DTYPE_VARIABLE, DTYPES

THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
    """``--dtype`` for a command that loads a model (``longmem.backbone.dtype_choice`` resolves it)."""
    p.add_argument("--dtype", default="auto", choices=["auto", *sorted(DTYPES)],
                   help=f"weights dtype; auto: ${DTYPE_VARIABLE} when set, else bfloat16 where the CPU (AVX512-BF16, "
                        "AMX) or GPU computes it natively and float32 elsewhere")


def setup_cpu(threads: int | None = None) -> None:
    """Use ``threads`` torch threads (None or 0: torch's default, every core) and huge pages for large tensors.

    Call it before the first large tensor is allocated: PyTorch reads the variable when it allocates. A value
    already in the environment wins (``THP_MEM_ALLOC_ENABLE=0`` turns huge pages off)."""
    os.environ.setdefault(THP_VARIABLE, "1")
    if threads:
        torch.set_num_threads(threads)
