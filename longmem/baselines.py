"""Baselines run through the same loops as LongMem (``SegmentLM``), so every comparison is like with like.

- ``BackboneLM``: the frozen backbone alone with a truncated local context (the paper's GPT-2* row). Give it
  ``segment_len`` = the native context for the "full attention" row.
- ``MemTRM``: Memorizing Transformer adapted to a frozen backbone (the paper's baseline): backbone layer m is replaced
  by a trainable kNN-memory layer, initialised from layer m, that caches its own keys/values and attends to the
  top-K retrieved memory tokens beside its local context (same retrieval and gate as LongMem's memory layer). Only
  that layer trains. The backbone's own layer m still runs inside the hooked forward (its output is discarded);
  that costs 1/L' of a forward pass and keeps the backbone unforked.
"""

from __future__ import annotations

import copy

import torch

from .backbone import Backbone
from .lm import SegmentLM, Step, Window
from .memory import MemoryBank
from .sidenet import LayerCache, MemoryAugmentedLayer


class BackboneLM(SegmentLM):
    """The frozen backbone with a local window of ``segment_len`` tokens and no memory."""

    def __init__(self, backbone: Backbone, segment_len: int = 1024):
        super().__init__()
        if segment_len > backbone.spec.max_positions:
            raise ValueError(f"segment_len {segment_len} exceeds the backbone's {backbone.spec.max_positions}")
        self.backbone, self.segment_len = backbone, segment_len

    def step(self, ids: torch.Tensor, memory: MemoryBank | None, window: Window | None = None) -> Step:
        start = window.length if window is not None else 0
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        out = self.backbone(ids, positions=positions, use_cache=window is not None,
                            past_key_values=None if window is None else window.past, keep={self.backbone.spec.n_layers})
        if window is not None:
            window.past = out.past_key_values
            window.append(ids, None, None)
        return Step(hidden=out.hidden[-1], k=None, v=None)


class MemTRM(SegmentLM):
    """Frozen backbone whose layer m is a trainable memory-augmented layer (Wu et al., 2022)."""

    def __init__(self, backbone: Backbone, *, cached_layer: int | None = None, csz: int = 4, topk: int = 64,
                 capacity: int | None = 65536, segment_len: int = 1024, gate_init: float = 0.0):
        super().__init__()
        spec = backbone.spec
        self.backbone = backbone
        self.cached_layer = cached_layer if cached_layer is not None else round(0.75 * spec.n_layers) - 1
        if not 0 <= self.cached_layer < spec.n_layers:
            raise ValueError(f"cached layer {self.cached_layer} outside the backbone's {spec.n_layers} layers")
        self.csz, self.capacity, self.segment_len = csz, capacity, segment_len
        block = copy.deepcopy(backbone.layers[self.cached_layer])
        self.memory_layer = MemoryAugmentedLayer(block, backbone.ops, rezero=False, n_heads=spec.n_heads, csz=csz,
                                                 topk=topk, gate_init=gate_init)
        for p in self.memory_layer.parameters():
            p.requires_grad_(True)

    def memory_kv(self, hidden_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.memory_layer
        _, k, v = layer.ops.qkv(layer.block, layer.ops.attn_norm(layer.block, hidden_m.to(layer.dtype)))
        return k, v

    def step(self, ids: torch.Tensor, memory: MemoryBank | None, window: Window | None = None) -> Step:
        start = window.length if window is not None else 0
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        if window is not None and window.side is None:
            window.side = [LayerCache()]
        trace: list = []
        captured: dict[str, torch.Tensor] = {}

        def memory_layer(h_in: torch.Tensor) -> torch.Tensor:
            captured["h"] = h_in
            out = self.memory_layer(h_in.float(), rope=self.backbone.rope, positions=positions, memory=memory,
                                    cache=None if window is None else window.side[0], trace=trace)
            return out.to(h_in.dtype)

        out = self.backbone(ids, positions=positions, use_cache=window is not None,
                            past_key_values=None if window is None else window.past,
                            override=(self.cached_layer, memory_layer), keep={self.backbone.spec.n_layers})
        with torch.no_grad():
            k, v = self.memory_kv(captured["h"])
        if window is not None:
            window.past = out.past_key_values
            window.append(ids, k, v)
        return Step(hidden=out.hidden[-1], k=k, v=v, chunk_ids=trace)
