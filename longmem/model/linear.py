"""One token's projections on a CPU in bfloat16, as a matrix-vector product.

Decoding runs every linear projection of the model on one row: the backbone's token-by-token passes (an answer's
drafts, Continue's sampling) and the SideNet's one-token steps. On a CPU in bfloat16, ``F.linear`` on one row reads
the weights at about 10 GB/s while ``torch.mv`` on the same weights reads them at about 14 GB/s; both accumulate in
float32 and round once (the same bits on the CPU measured; within rounding where kernels sum in another order).
``RowLinear`` is an ``nn.Linear`` that takes the second path for exactly that case (one row, bfloat16, CPU) and
``F.linear`` for every other; ``use_row_linears`` puts it in place of a model's plain ``nn.Linear`` modules, sharing
their parameters (tied weights stay tied, state dicts keep their keys). The measurement: ``docs/design.md``, "One
token's projections".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RowLinear(nn.Linear):
    """``nn.Linear`` whose single-row bfloat16 product on a CPU is ``torch.mv`` (``torch.addmv`` with a bias)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dim() >= 2 and x.shape[:-1].numel() == 1 and w.dtype == torch.bfloat16 == x.dtype
                and w.device.type == "cpu" == x.device.type):
            flat = x.reshape(-1)  # (E,)
            y = torch.mv(w, flat) if self.bias is None else torch.addmv(self.bias, w, flat)  # (O,)
            return y.view(*x.shape[:-1], w.shape[0])
        return F.linear(x, w, self.bias)

    @classmethod
    def sharing(cls, linear: nn.Linear) -> RowLinear:
        """A ``RowLinear`` that is ``linear`` in all but its class: the same parameters (not copies), hooks, training
        mode and attributes (its ``__dict__``'s entries; ``linear`` is meant to be dropped for it)."""
        row = cls.__new__(cls)
        row.__dict__.update(linear.__dict__)
        return row


def use_row_linears(module: nn.Module) -> int:
    """Put a ``RowLinear`` sharing its parameters in place of every plain ``nn.Linear`` inside ``module`` (subclasses,
    such as LoRA's wrappers or quantized linears, are left as they are); returns how many were replaced."""
    n = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, RowLinear.sharing(child))
                n += 1
    return n
