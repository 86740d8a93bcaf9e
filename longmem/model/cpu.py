"""How a command sets up torch on the CPU before it loads a model: its thread count, huge pages, and the ``--dtype``
flag every command that loads a model shares.

Every entry point (CLI, app, training, evaluation, benchmarks) calls ``setup_cpu(args.threads)`` before its model.
It turns on 2 MB transparent huge pages for large tensors (PyTorch's ``THP_MEM_ALLOC_ENABLE``); why, with the
measurement: ``docs/design.md``.
"""

from __future__ import annotations

import argparse
import os

import torch

from longmem.model.backbone import DTYPE_VARIABLE, DTYPES

THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
    """``--dtype`` for a command that loads a model (``longmem.model.backbone.dtype_choice`` resolves it)."""
    p.add_argument("--dtype", default="auto", choices=["auto", *sorted(DTYPES)],
                   help=f"weights dtype; auto: ${DTYPE_VARIABLE} when set, else bfloat16 where the CPU (AVX512-BF16, "
                        "AMX) or GPU computes it natively and float32 elsewhere")


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    """The flags every command that loads a model shares: ``--dtype`` and ``--threads`` (``setup_cpu`` reads it)."""
    add_dtype_flag(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


def setup_cpu(threads: int | None = None) -> None:
    """Use ``threads`` torch threads (None or 0: torch's default, every core) and huge pages for large tensors.

    Call it before the first large tensor is allocated: PyTorch reads the variable when it allocates. A value
    already in the environment wins (``THP_MEM_ALLOC_ENABLE=0`` turns huge pages off)."""
    os.environ.setdefault(THP_VARIABLE, "1")
    if threads:
        torch.set_num_threads(threads)
