"""A 4-bit model's one-token projections read as 4 bits: decoding at a quarter of bfloat16's bytes.

Decoding a token runs every projection of the model on one row, and on a CPU that reads each weight once: its speed
is memory bandwidth. A reader fetched as a 4-bit GGUF (the 1.5B is Q4_K_M) is converted to a bfloat16 copy that
transformers can load, so decoding reads 16 bits a weight where the file holds about 4.5. This module finds, in a
loaded model, the projections whose weights are still exactly 4-bit (each group of ``GROUP`` consecutive inputs
of an output row lies on 16 evenly spaced levels, as Q4_K's 32-weight sub-blocks do) and gives each its 4-bit form,
which ``RowLinear`` then reads for a few rows at a time through PyTorch's CPU int4 kernel (``w = (q - 8) * scale +
zero``, bfloat16 scales and zeros, one pair per group). Nothing is re-quantized: a projection whose weights are not
on such a grid (Q6_K's, a float model's) keeps its bfloat16 weights only, and a 4-bit form reproduces each weight
of its projection to within a small fraction of its group's step (``check``); a many-row product (a prompt's
prefill, compute-bound) still reads the bfloat16 weights. The measurement: ``docs/design.md``, "Decoding 4 bits".

The forms are found once per converted copy (seconds to a minute) and kept beside it (``int4-g32.safetensors``,
in a portable layout: two 4-bit levels a byte, low nibble first), so a later load reads them in about a second.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

GROUP = 32  # inputs sharing one scale and zero: Q4_K's sub-block, and a group size torch's int4 kernel takes
LEVELS = 16
# a weight is on its group's grid when it is within this fraction of a step of a level (bfloat16 rounding of the
# copy moves a weight by at most ~2^-8 of its size, a few hundredths of a step; a float weight misses by ~0.25)
ON_GRID = 0.125
SIDECAR = f"int4-g{GROUP}.safetensors"
SIDECAR_FORMAT = 1
MAX_ROWS = 8  # products of up to this many rows read the 4-bit form (memory-bound); more read the bfloat16 weights


@dataclass(frozen=True)
class Int4Weight:
    """A projection's weight (N, K) in 4 bits, as kept: ``levels`` (N, K // 2) uint8, two levels a byte (column 2j
    in the low nibble, 2j + 1 in the high), and ``scales_zeros`` (K // GROUP, N, 2) bfloat16, so that weight[n, k] =
    (level - 8) * scale + zero of group k // GROUP of row n."""

    levels: torch.Tensor
    scales_zeros: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.levels.shape[0], self.levels.shape[1] * 2

    def dequantize(self) -> torch.Tensor:
        """The weight it stands for, (N, K) float32."""
        n, k = self.shape
        q = unpack_levels(self.levels).float().view(n, k // GROUP, GROUP)  # (N, K/G, G)
        scale, zero = self.scales_zeros.float().permute(1, 0, 2).unbind(-1)  # (N, K/G) each
        return ((q - 8) * scale[..., None] + zero[..., None]).view(n, k)

    def for_kernel(self) -> PackedInt4:
        """The same weight laid out for torch's CPU int4 kernel (what a projection keeps: the levels are not)."""
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_levels(self.levels), 1)
        return PackedInt4(packed, self.scales_zeros, self.shape)


@dataclass(frozen=True)
class PackedInt4:
    """An ``Int4Weight`` in torch's CPU int4 kernel layout, for products."""

    packed: torch.Tensor  # (N, K // 2) uint8, the kernel's own order
    scales_zeros: torch.Tensor  # (K // GROUP, N, 2) bfloat16
    shape: tuple[int, int]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) bfloat16 -> x @ weight.T (M, N) bfloat16, on the CPU."""
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)


def pack_levels(q: torch.Tensor) -> torch.Tensor:
    """Levels (N, K) in 0..15 -> (N, K // 2) uint8, column 2j in the low nibble."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_levels(levels: torch.Tensor) -> torch.Tensor:
    """(N, K // 2) uint8 -> levels (N, K) int32 in 0..15."""
    return torch.stack([levels & 15, levels >> 4], dim=-1).view(levels.shape[0], -1).to(torch.int32)


CHUNK = 1 << 22  # weights looked at a time by ``find_grid`` (its float32 temporaries stay near 100 MB)


def _grid(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Groups v (R, G) float32 -> their levels (R, G) uint8, steps (R,) and lowest values (R,), or None where some
    group is on no grid of at most 16 levels."""
    lo, hi = v.amin(-1), v.amax(-1)  # (R,)
    span = hi - lo
    steps = torch.zeros_like(span)  # each group's step; 0 where its values are all equal
    todo = (span > 0).nonzero().squeeze(-1)  # groups whose step is not known yet
    for count in range(LEVELS - 1, 0, -1):  # the finest grid first: most groups of a 4-bit model span all 16 levels
        if todo.numel() == 0:
            break
        step = span[todo] / count  # (T,)
        rel = (v[todo] - lo[todo, None]) / step[:, None]  # (T, G): each value in steps above the lowest
        fits = ((rel - rel.round()).abs() <= ON_GRID).all(-1)
        steps[todo[fits]] = step[fits]
        todo = todo[~fits]
    if todo.numel():
        return None
    q = torch.round((v - lo[:, None]) / steps.clamp(min=1e-30)[:, None]).where(steps[:, None] > 0, 0)
    return q.to(torch.uint8), steps, lo


def find_grid(weight: torch.Tensor) -> Int4Weight | None:
    """The 4-bit form of ``weight`` (N, K) if every group of ``GROUP`` inputs of every row lies on at most 16 evenly
    spaced levels from its lowest value to its highest, else None (some group does not: the weight is not 4-bit,
    and nothing is approximated)."""
    n, k = weight.shape
    if k % GROUP:
        return None
    rows = max(1, CHUNK // k)
    levels, scales_zeros = [], []
    for r in range(0, n, rows):
        found = _grid(weight[r:r + rows].detach().float().reshape(-1, GROUP))  # groups of these rows
        if found is None:
            return None
        q, steps, lo = found
        m = q.shape[0] * GROUP // k  # rows in this chunk
        levels.append(pack_levels(q.view(m, k)))
        zero = lo + 8 * steps  # (q - 8) * step + zero = lo + q * step
        scales_zeros.append(torch.stack([steps, zero], dim=-1).view(m, k // GROUP, 2).to(torch.bfloat16))
    return Int4Weight(torch.cat(levels), torch.cat(scales_zeros).permute(1, 0, 2).contiguous())  # (K/G, N, 2)


def check(form: Int4Weight, weight: torch.Tensor) -> float:
    """The largest distance of a weight from its 4-bit form, in steps of its group (bfloat16's rounding of the
    scales and zeros included); ``find_grid``'s forms are within ``ON_GRID`` plus that rounding."""
    n, k = form.shape
    step = form.scales_zeros.float()[..., 0].t().repeat_interleave(GROUP, dim=1)  # (N, K)
    off = (form.dequantize() - weight.detach().float()).abs()
    return float((off / step.clamp(min=1e-30)).where(step > 0, off).max())


# -- finding them in a model, and keeping them beside its copy ------------------------------------------------------
def projections(model: nn.Module) -> dict[str, nn.Linear]:
    """The model's linear projections by their weight's state-dict name (a tied weight once, by its first name)."""
    seen: set[int] = set()
    out: dict[str, nn.Linear] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            out[f"{name}.weight" if name else "weight"] = module
    return out


def find_forms(model: nn.Module) -> dict[str, Int4Weight]:
    """The 4-bit form of each of ``model``'s projections whose weight is exactly 4-bit."""
    out = {}
    for name, linear in projections(model).items():
        form = find_grid(linear.weight)
        if form is not None:
            out[name] = form
    return out


def save_forms(forms: dict[str, Int4Weight], path: Path, source: dict) -> None:
    """Write ``forms`` to ``path`` (safetensors, atomically) with ``source`` (what they were found in)."""
    from safetensors.torch import save_file

    tensors = {}
    for name, form in forms.items():
        tensors[f"{name}.levels"] = form.levels
        tensors[f"{name}.scales_zeros"] = form.scales_zeros
    meta = {"format": str(SIDECAR_FORMAT), "group": str(GROUP), "source": json.dumps(source, sort_keys=True)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_forms(path: Path, source: dict) -> dict[str, Int4Weight] | None:
    """The forms kept at ``path``, or None where there are none for this ``source`` (absent, another format or
    group, found in another copy, unreadable, or a form not laid out as ``Int4Weight`` says)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if (meta.get("format") != str(SIDECAR_FORMAT) or meta.get("group") != str(GROUP)
                    or json.loads(meta.get("source", "null")) != source):
                return None
            names = {key.rsplit(".", 1)[0] for key in f.keys()}
            # the scales and zeros are copied, as a projection keeps them: a tensor kept from the mapped file would
            # keep every page of it that was read (the levels too) mapped, in the process's RSS
            forms = {name: Int4Weight(f.get_tensor(f"{name}.levels"), f.get_tensor(f"{name}.scales_zeros").clone())
                     for name in sorted(names)}
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError):
        return None
    return forms if all(map(_well_formed, forms.values())) else None


def _well_formed(form: Int4Weight) -> bool:
    levels, sz = form.levels, form.scales_zeros
    if levels.dtype != torch.uint8 or levels.dim() != 2 or sz.dtype != torch.bfloat16:
        return False
    n, k = form.shape
    return k % GROUP == 0 and tuple(sz.shape) == (k // GROUP, n, 2)


def attach(model: nn.Module, forms: dict[str, Int4Weight]) -> int:
    """Give each of ``model``'s projections named in ``forms`` its 4-bit form (``linear.RowLinear.give_int4``; a
    projection that cannot take one, not a ``RowLinear``, or whose shape differs, is left as it is); returns how many
    got one."""
    n = 0
    for name, linear in projections(model).items():
        form, give = forms.get(name), getattr(linear, "give_int4", None)
        if form is not None and give is not None and form.shape == tuple(linear.weight.shape):
            give(form.for_kernel())
            n += 1
    return n


def use_int4(model: nn.Module, folder: Path, source: dict) -> int:
    """Give ``model`` (loaded in bfloat16 on the CPU from the converted copy ``folder``) the 4-bit forms of its exactly
    4-bit projections, found on first use and kept in ``folder`` (``SIDECAR``); returns how many projections read 4
    bits. Nothing is written where ``folder`` cannot be written (the forms are then found again next time)."""
    path = Path(folder) / SIDECAR
    forms = load_forms(path, source)
    if forms is None:
        log.warning("first use: finding the 4-bit projections of %s for decoding (once)", Path(folder).name)
        forms = find_forms(model)
        try:
            save_forms(forms, path, source)
        except OSError as e:
            log.warning("could not keep the 4-bit forms in %s: %s", folder, e)
    return attach(model, forms)
