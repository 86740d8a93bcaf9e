"""Which device a command runs its model on: ``--device`` (auto, cpu, cuda, cuda:N), checked before anything loads.

On a GPU the backbone, the SideNet and ingestion run there, and the memory is searched there (``longmem.memory``:
the chunk keys mirrored on the device); the memory's keys and values, the faiss indexes and the banks stay in host
RAM and on disk, so a bank made on a GPU opens on a CPU and the other way round.
"""

from __future__ import annotations

import argparse
import re

import torch

DEVICES = "auto, cpu, cuda or cuda:N"


class DeviceError(ValueError):
    """A device that does not exist here, named so that the user can pick another."""


def resolve_device(name: str = "auto") -> str:
    """``name`` as a torch device string: "auto" is the first GPU when PyTorch sees one, else the CPU; "cuda" and
    "cuda:N" are refused at once, with what to do, where PyTorch has no CUDA or no such GPU."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    m = re.fullmatch(r"cuda(?::(\d+))?", name)
    if m is None:
        raise DeviceError(f"unknown device {name!r}; use {DEVICES}")
    if not torch.cuda.is_available():
        why = ("a CPU-only build" if torch.version.cuda is None else
               f"built for CUDA {torch.version.cuda}, but it sees no GPU (driver, or CUDA_VISIBLE_DEVICES?)")
        raise DeviceError(f"--device {name}: this PyTorch ({torch.__version__}) is {why}. On a machine with an NVIDIA "
                          "GPU, install the GPU build with `make install-gpu` (README); else use --device cpu")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise DeviceError(f"--device {name}: there is no GPU {m.group(1)}; PyTorch sees "
                          f"{torch.cuda.device_count()} (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return name


def add_device_flag(p: argparse.ArgumentParser) -> None:
    """``--device`` for a command that loads a model (``resolve_device`` checks it)."""
    p.add_argument("--device", default="auto",
                   help=f"where the model runs and the memory is searched: {DEVICES} (auto: the GPU when PyTorch "
                        "sees one, else the CPU)")
