"""Baselines run through the same loops as LongMem (``SegmentLM``), so every comparison is like with like.

- ``BackboneLM``: the frozen backbone alone with a truncated local context (the paper's GPT-2* row). Give it
  ``segment_len`` = the native context for the "full attention" row.
- ``MemTRM``: Memorizing Transformer adapted to a frozen backbone (the paper's baseline): backbone layer m is replaced
  by a trainable kNN-memory layer, initialised from layer m, that caches its own keys/values and attends to the
  top-K retrieved memory tokens beside its local context (same retrieval and gate as LongMem's memory layer). Only
  that layer trains. The backbone's own layer m still runs inside the hooked forward (its output is discarded);
  that costs 1/L' of a forward pass and keeps the backbone unforked. Trained by ``python -m training --model
  memtrm`` with the same data and loop as LongMem; checkpoints are ``memtrm.safetensors`` + ``config.json``.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from longmem.memory.memory import Memory
from longmem.model.backbone import Backbone, load_backbone, resolve_dtype
from longmem.model.lm import SegmentLM, Step, Window
from longmem.model.longmem import CHECKPOINT_FORMAT, CheckpointError
from longmem.model.sidenet import LayerCache, MemoryAugmentedLayer
from longmem.util.files import atomic_directory
from longmem.util.names import current_names

MEMTRM_WEIGHTS = "memtrm.safetensors"
SCALE = ".int8_scale"  # suffix of a matrix's per-row scales in an int8 checkpoint (``int8_rows``)
MEMTRM_SETTINGS = ("cached_layer", "chunk_size", "topk", "capacity", "segment_len", "gate_init")  # its constructor's


class BackboneLM(SegmentLM):
    """The frozen backbone with a local window of ``segment_len`` tokens and no memory."""

    def __init__(self, backbone: Backbone, segment_len: int = 1024):
        super().__init__()
        if segment_len > backbone.spec.max_positions:
            raise ValueError(f"segment_len {segment_len} exceeds the backbone's {backbone.spec.max_positions}")
        self.backbone, self.segment_len = backbone, segment_len

    def step(self, ids: torch.Tensor, memory: Memory | None, window: Window | None = None) -> Step:
        start = window.length if window is not None else 0
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        out = self.backbone(ids, positions=positions, use_cache=window is not None,
                            past_key_values=None if window is None else window.past, keep={self.backbone.spec.n_layers})
        if window is not None:
            window.past = out.past_key_values
            window.append(ids, None, None)
        return Step(hidden=out.hidden[-1], k=None, v=None)


def int8_rows(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Matrices as int8 with one float32 scale per row (symmetric, absmax / 127): ``name`` -> int8 (R, C) and
    ``name + SCALE`` -> (R, 1); vectors (norms, gates) stay as they are. How the shipped MemTRM baseline fits the
    repository; ``from_int8_rows`` reads it back."""
    out = {}
    for name, t in state.items():
        if t.dim() == 2 and t.is_floating_point():
            scale = t.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # (R, 1)
            out[name] = torch.round(t.float() / scale).clamp(-127, 127).to(torch.int8).contiguous()
            out[name + SCALE] = scale.contiguous()
        else:
            out[name] = t.contiguous()
    return out


def from_int8_rows(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The float32 weights of an ``int8_rows`` state (a state without int8 matrices comes back unchanged)."""
    return {name: (t.float() * state[name + SCALE] if name + SCALE in state else t)
            for name, t in state.items() if not name.endswith(SCALE)}


class MemTRM(SegmentLM):
    """Frozen backbone whose layer m is a trainable memory-augmented layer (Wu et al., 2022)."""

    def __init__(self, backbone: Backbone, *, cached_layer: int | None = None, chunk_size: int = 4, topk: int = 64,
                 capacity: int | None = 65536, segment_len: int = 1024, gate_init: float = 0.0):
        super().__init__()
        spec = backbone.spec
        self.backbone = backbone
        self.cached_layer = cached_layer if cached_layer is not None else round(0.75 * spec.n_layers) - 1
        if not 0 <= self.cached_layer < spec.n_layers:
            raise ValueError(f"cached layer {self.cached_layer} outside the backbone's {spec.n_layers} layers")
        self.chunk_size, self.capacity, self.segment_len = chunk_size, capacity, segment_len
        block = copy.deepcopy(backbone.layers[self.cached_layer])
        self.memory_layer = MemoryAugmentedLayer(block, backbone.ops, rezero=False, n_heads=spec.n_heads,
                                                 chunk_size=chunk_size, topk=topk, gate_init=gate_init)
        for p in self.memory_layer.parameters():
            p.requires_grad_(True)
        self.topk, self.gate_init = topk, gate_init
        self.provenance: dict = {}
        self.backbone_source = "default"  # how load_backbone finds the backbone again: "default" or a model directory

    # -- training and checkpoints ---------------------------------------------------------------------------------
    def named_trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(f"memory_layer.{n}", p) for n, p in self.memory_layer.named_parameters() if p.requires_grad]

    @property
    def gate(self) -> torch.nn.Parameter:
        return self.memory_layer.gate

    def settings(self) -> dict:
        return {k: getattr(self, k) for k in MEMTRM_SETTINGS}

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().contiguous() for n, p in self.named_trainable()}

    def write_files(self, directory: Path, provenance: dict | None = None, int8: bool = False) -> None:
        """The checkpoint's two files, written into an existing directory (``save`` makes that atomic); ``int8``
        stores the layer's matrices as int8 rows with a scale each (``int8_rows``: a quarter of float32)."""
        state = int8_rows(self.trainable_state()) if int8 else self.trainable_state()
        save_file(state, str(directory / MEMTRM_WEIGHTS), metadata={"format": "pt"})
        meta = {"format": CHECKPOINT_FORMAT, "kind": "memtrm", "config": self.settings(),
                "backbone_source": self.backbone_source, "backbone": self.backbone.identity(),
                "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "provenance": {**self.provenance, **(provenance or {})}}
        (directory / "config.json").write_text(json.dumps(meta, indent=2))

    def save(self, path: str | os.PathLike, provenance: dict | None = None, int8: bool = False) -> Path:
        path = Path(path)
        with atomic_directory(path) as tmp:
            self.write_files(tmp, provenance, int8)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, backbone: Backbone | None = None, device: str = "cpu",
             dtype: str = "auto") -> "MemTRM":
        """A trained MemTRM checkpoint; the backbone is loaded from its config unless given (and then checked)."""
        path = Path(path)
        try:
            meta = json.loads((path / "config.json").read_text())
        except (FileNotFoundError, ValueError) as e:
            raise CheckpointError(f"{path} is not a readable MemTRM checkpoint ({e})") from None
        if meta.get("kind") != "memtrm" or meta.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{path} is not a MemTRM checkpoint (kind {meta.get('kind', 'longmem')!r}, "
                                  f"format {meta.get('format')!r})")
        if backbone is None:
            backbone = load_backbone(meta.get("backbone_source", "default"), resolve_dtype(dtype, device), device)
        if meta["backbone"]["sha256"] != backbone.fingerprint():
            raise CheckpointError(f"{path} was trained for backbone {meta['backbone']['name']!r}, not "
                                  f"{backbone.name!r}")
        config = current_names(meta["config"])
        model = cls(backbone, **{k: config[k] for k in MEMTRM_SETTINGS})
        state = from_int8_rows(load_file(str(path / MEMTRM_WEIGHTS)))
        if set(state) != set(model.trainable_state()):
            raise CheckpointError(f"{path}: weights do not match the MemTRM layer")
        model.memory_layer.load_state_dict({k.removeprefix("memory_layer."): v for k, v in state.items()})
        model.provenance = meta.get("provenance", {})
        model.backbone_source = meta.get("backbone_source", "default")
        return model.to(device)

    def memory_kv(self, hidden_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.memory_layer
        _, k, v = layer.ops.qkv(layer.block, layer.ops.attn_norm(layer.block, hidden_m.to(layer.dtype)))
        return k, v

    def step(self, ids: torch.Tensor, memory: Memory | None, window: Window | None = None) -> Step:
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
