"""The residual SideNet and its memory-augmented layer (paper sections 2.2-2.3).

SideNet layer l (1-based, l = 1..L with L = L'/r) starts as a copy of backbone layer r*l and is followed by the
cross-network residual H_llm[r*l] - H_llm[r*(l-1)] (the last one reaches H_llm[L'] when r does not divide L').

Initialisation. The paper copies the layers and adds their full output on top of the residuals, which on SmolLM2
makes the untrained model's perplexity explode (``docs/design.md``): every copied layer re-applies an update the
backbone already made. By default each side layer's two residual branches (attention, MLP) are scaled by a learnable
scalar initialised at 0 (ReZero). With the branches closed the side stream telescopes, H_side[L] = H_llm[0] + sum
of differences = H_llm[L'], so the untrained SideNet reproduces the backbone exactly; training opens the branches.
``side_init="plain"`` keeps the paper's initialisation for ablation. The residual stream is kept in float32 so the
telescoping sum adds no bf16 rounding; each layer computes in the backbone's dtype.

The memory-augmented layer attends to its local causal context (RoPE applied) and, with separate softmaxes, to the
K retrieved memory tokens of each query token (no RoPE: queries and memory keys are both un-rotated). A head-wise
gate g (init 0, sigmoid(0) = 1/2) mixes the two: sigmoid(g) * A + (1 - sigmoid(g)) * M. Tokens with nothing in
memory use A alone.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from longmem.memory.memory import Memory
from longmem.model.backbone import Backbone, LayerOps
from longmem.model.lora import compute_dtype

RETRIEVAL_BLOCK = 256  # query tokens per memory search + memory attention (bounds the (B, H, T, K, d) gather)
# Memory attention reads the whole memory, masked to each query's top chunks, while memory holds at most this many
# times K tokens; beyond it, each query's K keys/values are gathered (the two paths agree up to rounding; where they
# cross in time: docs/design.md).
DENSE_MEMORY_RATIO = 16
RopeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class LayerCache:
    """Rotated keys and values (B, Hkv, T, d) of the tokens already seen, for incremental decoding."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, n: int) -> None:
        """Keep the first ``n`` tokens' keys and values."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q (B, Hq, Tq, d) over k, v (B, Hkv, Tk, d); the Tq queries are the last Tq positions."""
    tq, tk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    mask = None if tq == 1 else torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def memory_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query token (B, H, T, d) attends to its own K retrieved pairs (B, H, T, K, d).

    Returns the memory output (B, H, T, d) and which tokens found anything (B, H, T).
    """
    scores = torch.einsum("bhtd,bhtkd->bhtk", q.float(), keys.float()) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    found = mask.any(dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with nothing found are all -inf -> 0
    out = torch.einsum("bhtk,bhtkd->bhtd", probs.to(values.dtype), values)
    return out.to(q.dtype), found


def dense_memory_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                           mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query token (B, Hq, T, d) attends to the memory tokens (B, Hkv, N, d) its mask (B, Hq, T, N) selects.

    Equal to ``memory_attention`` over the same tokens gathered; returns the output (B, Hq, T, d) and which tokens
    found anything (B, Hq, T).
    """
    B, hq, T, d = q.shape
    hkv, N = keys.shape[1], keys.shape[2]
    # copies: keys/values are views of the memory's storage, which may grow in place before a backward pass
    keys, values = keys.to(torch.float32, copy=True), values.to(torch.float32, copy=True)
    qg = q.float().reshape(B, hkv, hq // hkv * T, d)  # query head h reads KV head h // (Hq / Hkv)
    scores = (qg @ keys.transpose(-1, -2) / math.sqrt(d)).view(B, hq, T, N)
    scores = scores.masked_fill(~mask, float("-inf"))
    found = mask.any(dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with nothing found are all -inf -> 0
    out = probs.view(B, hkv, hq // hkv * T, N) @ values  # (B, Hkv, G*T, d)
    return out.view(B, hq, T, d).to(q.dtype), found


class SideLayer(nn.Module):
    """A decoder layer copied from the backbone, run by our own code so it can be scaled, cached and augmented."""

    def __init__(self, block: nn.Module, ops: LayerOps, rezero: bool):
        super().__init__()
        self.block = block
        self.ops = ops
        if rezero:
            self.alpha_attn = nn.Parameter(torch.zeros((), dtype=torch.float32))
            self.alpha_mlp = nn.Parameter(torch.zeros((), dtype=torch.float32))
        else:
            self.alpha_attn = self.alpha_mlp = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the copied block computes in (the backbone's; LoRA factors and scales are float32)."""
        return compute_dtype(self.block)

    def _attend(self, q, k, v, q_raw, memory: Memory | None, trace: list | None) -> torch.Tensor:
        return local_attention(q, k, v)

    def forward(self, x: torch.Tensor, *, rope: RopeFn, positions: torch.Tensor, cache: LayerCache | None = None,
                memory: Memory | None = None, trace: list | None = None) -> torch.Tensor:
        """x (B, T, E) float32 residual stream -> (B, T, E) float32."""
        B, T, _ = x.shape
        h = self.ops.attn_norm(self.block, x.to(self.dtype))
        q_raw, k_raw, v = self.ops.qkv(self.block, h)  # (B, Hq, T, d), (B, Hkv, T, d) x2, pre-RoPE
        q, k = rope(q_raw, k_raw, positions)
        if cache is not None:
            k, v = cache.extend(k, v)
        a = self._attend(q, k, v, q_raw, memory, trace)  # (B, Hq, T, d)
        a = self.ops.attn_out(self.block, a.transpose(1, 2).reshape(B, T, -1)).float()
        x = x + (a if self.alpha_attn is None else self.alpha_attn * a)
        m = self.ops.mlp(self.block, self.ops.mlp_norm(self.block, x.to(self.dtype))).float()
        return x + (m if self.alpha_mlp is None else self.alpha_mlp * m)


class MemoryAugmentedLayer(SideLayer):
    """Joint attention over the local context and the top-K tokens retrieved from memory, mixed by a gate."""

    def __init__(self, block: nn.Module, ops: LayerOps, rezero: bool, *, n_heads: int, chunk_size: int, topk: int,
                 gate_init: float = 0.0):
        super().__init__(block, ops, rezero)
        if topk % chunk_size:
            raise ValueError(f"top-K ({topk}) must be a multiple of the chunk size ({chunk_size})")
        self.topk = topk  # memory tokens per query token: topk // chunk_size chunks of the memory's own chunk size
        self.gate = nn.Parameter(torch.full((n_heads,), float(gate_init)))

    def _attend(self, q, k, v, q_raw, memory, trace):
        a = local_attention(q, k, v)
        if memory is None:
            return a
        m, found, ids = [], [], []
        n_chunks = max(1, self.topk // memory.chunk_size)
        dense = max(memory.sizes()) <= DENSE_MEMORY_RATIO * n_chunks * memory.chunk_size
        for s in range(0, q_raw.shape[2], RETRIEVAL_BLOCK):  # bounded (T, K, d) temporaries for long segments
            qb = q_raw[:, :, s:s + RETRIEVAL_BLOCK]
            if dense:
                r = memory.select(qb, n_chunks)
                mb, fb = dense_memory_attention(qb, r.keys, r.values, r.mask)
            else:
                r = memory.search(qb, n_chunks)
                mb, fb = memory_attention(qb, r.keys.to(qb.dtype), r.values.to(qb.dtype), r.mask)
            m.append(mb)
            found.append(fb)
            ids.append(r.chunk_ids)
        m, found = torch.cat(m, dim=2), torch.cat(found, dim=2)
        if trace is not None:
            trace.append(torch.cat(ids, dim=2))
        w = torch.sigmoid(self.gate).view(1, -1, 1, 1)
        mixed = (w * a.float() + (1 - w) * m.float()).to(a.dtype)
        return torch.where(found[..., None], mixed, a)


class SideNet(nn.Module):
    """L'/r side layers; one of them memory-augmented. Holds copies of backbone layers, not the backbone."""

    def __init__(self, backbone: Backbone, *, reduction: int, memory_layer: int, cached_layer: int, chunk_size: int,
                 topk: int, side_init: str = "rezero", gate_init: float = 0.0):
        super().__init__()
        n_back = backbone.spec.n_layers
        n_side = n_back // reduction
        if n_side < 1:
            raise ValueError(f"reduction {reduction} leaves no side layer for a {n_back}-layer backbone")
        if not 0 <= memory_layer < n_side:
            raise ValueError(f"memory layer {memory_layer} outside the SideNet's {n_side} layers")
        if side_init not in ("rezero", "plain"):
            raise ValueError(f"side_init must be 'rezero' or 'plain', got {side_init!r}")
        rezero = side_init == "rezero"
        # boundaries[l] = index of the backbone hidden state that side layer l (1-based) lines up with
        self.boundaries = [reduction * i for i in range(n_side)] + [n_back]
        self.memory_layer = memory_layer
        layers = []
        for i in range(n_side):
            if i == memory_layer:  # starts as the layer whose K/V are cached, so query and key spaces match
                block = copy.deepcopy(backbone.layers[cached_layer])
                layers.append(MemoryAugmentedLayer(block, backbone.ops, rezero, n_heads=backbone.spec.n_heads,
                                                   chunk_size=chunk_size, topk=topk, gate_init=gate_init))
            else:
                block = copy.deepcopy(backbone.layers[self.boundaries[i + 1] - 1])
                layers.append(SideLayer(block, backbone.ops, rezero))
        self.layers = nn.ModuleList(layers)
        for p in self.parameters():
            p.requires_grad_(True)

    def forward(self, hidden: list[torch.Tensor], *, rope: RopeFn, positions: torch.Tensor,
                caches: list[LayerCache] | None = None, memory: Memory | None = None,
                trace: list | None = None) -> torch.Tensor:
        """Backbone states H_llm[0..L'] (each (B, T, E)) -> last side state H_side[L] (B, T, E), float32."""
        x = hidden[0].float()
        for i, layer in enumerate(self.layers):
            x = layer(x, rope=rope, positions=positions, cache=None if caches is None else caches[i],
                      memory=memory if i == self.memory_layer else None, trace=trace)
            x = x + (hidden[self.boundaries[i + 1]].float() - hidden[self.boundaries[i]].float())
        return x

    @property
    def gate(self) -> nn.Parameter:
        return self.layers[self.memory_layer].gate
