"""Low-rank updates (LoRA) for the SideNet's copied layers: the compact training mode.

``add_lora(module, rank)`` wraps every linear projection inside ``module`` (``nn.Linear``, or GPT-2's ``Conv1D``
whose weight is stored transposed) so that it computes ``base(x) + scale * (x A^T) B^T`` with A (r, in) random and
B (out, r) zero: at init the layer is unchanged, and training touches only r * (in + out) numbers per projection.
The frozen base weight is a copy of the backbone's, so a checkpoint needs only A, B and what else was trained.

Dtypes: A and B stay float32 whatever the backbone's dtype (bfloat16 has too few bits for small low-rank updates);
the wrapper is the one place where they meet the frozen weights: the input reaches ``base`` in the base weight's dtype,
the update is computed in float32 and added in that dtype. ``compute_dtype`` tells the dtype a wrapped module computes
in, which is no longer the dtype of its first parameter (now a float32 factor).

Inference (the module in eval mode, no gradients) multiplies once by the merged weight ``W + scale * B A`` (computed in
float32, kept in the base weight's dtype): one matmul per projection instead of three and the casts between them. It
is made again after a switch of mode (``train()`` / ``eval()``), a move or cast, and whenever a factor or the base
weight was changed in place by an op that counts (``load_state_dict``, a plain optimizer step; a fused optimizer
step does not count, but it runs in training, and the switch back to eval drops the merged weight). It rounds
differently from the separate update, by the base dtype's precision; training always takes the separate path, so the
factors' gradients are what they were.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LoRA(nn.Module):
    def __init__(self, base: nn.Module, rank: int, alpha: float | None = None):
        super().__init__()
        w = base.weight
        transposed = not isinstance(base, nn.Linear)  # transformers' Conv1D: weight (in, out)
        n_in, n_out = (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])
        self.base = base
        self.scale = (alpha if alpha is not None else rank) / rank
        self.lora_a = nn.Parameter(torch.empty(rank, n_in, dtype=torch.float32))
        self.lora_b = nn.Parameter(torch.zeros(n_out, rank, dtype=torch.float32))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.transposed = transposed
        self._merged: tuple[tuple, torch.Tensor] | None = None  # (what it was made from, W + scale * B A)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) in the base weight's dtype -> (..., out) in that dtype."""
        if not self.training and not torch.is_grad_enabled():
            w = self.merged_weight()  # (out, in)
            return F.linear(x, w, self.base.bias)
        update = (x.to(self.lora_a.dtype) @ self.lora_a.t()) @ self.lora_b.t()
        return self.base(x) + (self.scale * update).to(x.dtype)

    def merged_weight(self) -> torch.Tensor:
        """W + scale * B A (out, in) in the base weight's dtype, made again when a factor or the base weight changed
        (in place, or replaced, moved or cast)."""
        w = self.base.weight
        made_from = tuple((t.data_ptr(), 0 if t.is_inference() else t._version, t.dtype, t.device)
                          for t in (w, self.lora_a, self.lora_b))
        if self._merged is None or self._merged[0] != made_from:
            with torch.no_grad():
                base = (w.t() if self.transposed else w).float()
                self._merged = made_from, (base + self.scale * (self.lora_b @ self.lora_a)).to(w.dtype).contiguous()
        return self._merged[1]

    def train(self, mode: bool = True) -> "LoRA":
        self._merged = None
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        self._merged = None
        return super()._apply(fn, recurse)


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype ``module`` computes in: that of its weights other than LoRA factors (the backbone's copy)."""
    for name, p in module.named_parameters():
        if not name.rsplit(".", 1)[-1].startswith("lora_"):
            return p.dtype
    raise ValueError(f"{type(module).__name__} has no weights besides LoRA factors")


def add_lora(module: nn.Module, rank: int) -> list[LoRA]:
    """Wrap the linear projections under ``module`` in place; returns the wrappers."""
    added = []
    for name, child in list(module.named_children()):
        is_linear = isinstance(child, nn.Linear) or type(child).__name__ == "Conv1D"
        if is_linear and not isinstance(module, LoRA):
            wrapped = LoRA(child, rank)
            setattr(module, name, wrapped)
            added.append(wrapped)
        elif not isinstance(child, LoRA):
            added += add_lora(child, rank)
    return added
