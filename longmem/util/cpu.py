"""What this CPU computes natively (asked once per call; no state kept)."""

from __future__ import annotations

from pathlib import Path

import torch


def cpu_bf16_features() -> list[str]:
    """The CPU's features that multiply bfloat16 natively: "AVX512-BF16" and/or "AMX" (empty: PyTorch emulates bf16
    matmuls, far slower than float32: ``docs/design.md``).
    Asked of PyTorch's own CPU probe (cpuinfo, any OS), or read from /proc/cpuinfo where this torch lacks it."""
    probes = {"AVX512-BF16": getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              "AMX": getattr(torch.cpu, "_is_amx_tile_supported", None)}
    if all(callable(f) for f in probes.values()):
        return [name for name, f in probes.items() if f()]
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [name for name, flag in (("AVX512-BF16", "avx512_bf16"), ("AMX", "amx_bf16")) if flag in flags]
