"""One token's projections on a CPU in bfloat16, as a matrix-vector product.

Decoding runs every linear projection of the model on one row: the backbone's token-by-token passes (an answer's
drafts, Continue's sampling) and the SideNet's one-token steps. On a CPU in bfloat16, ``F.linear`` on one row reads
the weights at about 10 GB/s while ``torch.mv`` on the same weights reads them at about 14 GB/s; both accumulate in
float32 and round once (the same bits on the CPU measured; within rounding where kernels sum in another order).
``RowLinear`` is an ``nn.Linear`` that takes the second path for exactly that case (one row, bfloat16, CPU) and
``F.linear`` for every other; ``use_row_linears`` puts it in place of a model's plain ``nn.Linear`` modules, sharing
their parameters (tied weights stay tied, state dicts keep their keys). The measurement: ``docs/design.md``, "One
token's projections". A ``RowLinear`` whose weight is exactly 4-bit can also be given its 4-bit form
(``give_int4``, ``longmem.model.int4``): then products of up to ``int4.MAX_ROWS`` bfloat16 rows on a CPU read that
form instead, at about a quarter of the bytes ("Decoding 4 bits").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longmem.model.int4 import MAX_ROWS, PackedInt4


class RowLinear(nn.Linear):
    """``nn.Linear`` whose single-row bfloat16 product on a CPU is ``torch.mv`` (``torch.addmv`` with a bias), or,
    where the weight is exactly 4-bit and has its 4-bit form (``int4``, ``longmem.model.int4``), whose products of
    up to ``int4.MAX_ROWS`` bfloat16 rows on a CPU read that form."""

    int4: PackedInt4 | None = None  # the weight's 4-bit form (``give_int4``)
    _int4_of: tuple[int, int] | None = None  # the weight it was given for: (id, in-place version)

    def give_int4(self, form: PackedInt4) -> None:
        """Read ``form`` for few rows from now on, while the weight is this very tensor, unchanged: a copy of the
        module (the SideNet's layers, copied from the backbone's) or weights loaded or trained into it read their
        own weights again."""
        self.int4, self._int4_of = form, (id(self.weight), self.weight._version)

    def __getstate__(self) -> dict:
        """A copy (``copy.deepcopy``, pickling) leaves the 4-bit form behind: it is of this module's weight only."""
        state = dict(super().__getstate__())
        state.pop("int4", None)
        state.pop("_int4_of", None)
        return state

    def has_int4(self) -> bool:
        """Whether few rows read the 4-bit form (given, and the weight unchanged since)."""
        return self.int4 is not None and self._int4_of == (id(self.weight), self.weight._version)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.shape[:-1].numel() if x.dim() >= 2 else 0
        cpu_bf16 = w.dtype == torch.bfloat16 == x.dtype and w.device.type == "cpu" == x.device.type
        if cpu_bf16 and 1 <= rows <= MAX_ROWS and self.has_int4():
            y = self.int4.matmul(x.reshape(rows, x.shape[-1]))  # (M, O)
            if self.bias is not None:
                y = y + self.bias
            return y.view(*x.shape[:-1], w.shape[0])
        if rows == 1 and cpu_bf16:
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
