"""LongMemModel: frozen backbone + residual SideNet + memory (the paper's figure 1).

    ids (B, T) --backbone (frozen, no grad)--> H_llm[0..L'] and pre-RoPE K/V of layer m
        H_llm --SideNet (L'/r layers, one memory-augmented; reads memory)--> H_side[L] --frozen norm + LM head--> logits
        K/V of layer m --after the step--> memory (retrieval for later segments)

Checkpoints are a directory with ``sidenet.safetensors`` and ``config.json`` (model config, backbone identity and
weights hash, provenance). Loading refuses a checkpoint trained for another backbone.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from longmem.memory.memory import MAX_SINKS, Memory
from longmem.model.backbone import DEFAULT_BACKBONE, DTYPES, Backbone, BackboneSpec, load_backbone, resolve_dtype
from longmem.model.lm import BackbonePass, SegmentLM, Step, Window
from longmem.model.lora import add_lora
from longmem.model.sidenet import LayerCache, SideNet
from longmem.util.files import atomic_directory, file_sha256
from longmem.util.names import current_names

CHECKPOINT_FORMAT = 1
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "checkpoints"  # longmem/checkpoints: what ships with the package
SHIPPED = {DEFAULT_BACKBONE: "smollm2-135m-instruct"}  # backbone -> its shipped checkpoint directory
DEFAULT_TOPK = 64  # K when neither the config nor a checkpoint sets it (the paper's)
RUNTIME_FIELDS = ("dtype", "segment_len", "capacity", "topk", "max_sinks")  # settings a checkpoint's weights do not fix


def shipped_checkpoint(backbone: str) -> Path | None:
    """The trained SideNet shipped for ``backbone``, when this install has one."""
    name = SHIPPED.get(backbone)
    path = SHIPPED_DIR / name if name else None
    return path if path is not None and (path / "config.json").is_file() else None


def checkpoint_digest(path: str | Path) -> str:
    """sha256 (hex) of the SideNet weights file in checkpoint directory ``path``: which weights a result was made
    with, whatever the directory is called (the shipped one keeps its name when it is retrained)."""
    return file_sha256(Path(path) / "sidenet.safetensors")


class CheckpointError(RuntimeError):
    """A SideNet checkpoint that is missing, malformed, or made for another backbone."""


@dataclass
class LongMemConfig:
    backbone: str = DEFAULT_BACKBONE  # "default" = embedded SmolLM2-135M-Instruct, a local .gguf file or HF model dir
    dtype: str = "auto"  # backbone/SideNet weights: "auto" (bf16 where the hardware has it, else fp32), or a name
    reduction: int = 2  # r: the SideNet has L'/r layers, layer l copied from backbone layer r*l
    memory_layer: int | None = None  # SideNet layer (0-based) with memory; None = cached_layer // r when that is
    #                                  given, else 3/4 depth, round(0.75 L) - 1
    cached_layer: int | None = None  # backbone layer m (0-based) cached in memory; None = r * memory_layer, the
    #                                  layer whose input H_llm[r*l] the memory layer reads at init, so its queries
    #                                  are exactly that layer's (see ``training.studies.probe`` for why this matters)
    chunk_size: int = 4  # tokens per memory chunk
    topk: int | None = None  # K: memory tokens each query token attends to (K/chunk_size chunks per head); None = the
    #                          loaded checkpoint's (what it was trained or shipped with), else DEFAULT_TOPK
    capacity: int | None = 65536  # M: memory tokens per stream (FIFO beyond); None = unbounded
    max_sinks: int | None = MAX_SINKS  # segment-start (attention sink) chunks a query may retrieve; None = no limit
    segment_len: int = 1024  # local context window
    side_init: str = "rezero"  # "rezero": zero-scaled branches, reproduces the backbone; "plain": paper's copy-init
    gate_init: float = 0.0  # head-wise memory gate g at init (sigmoid(0) = 50/50)
    train_scope: str = "full"  # "full": every SideNet weight trains; "compact": the memory layer, low-rank (LoRA)
    #                            updates of the other side layers, and the scales/gate (small checkpoints)
    lora_rank: int = 16  # rank of the compact mode's low-rank updates

    def resolved(self, spec: BackboneSpec) -> "LongMemConfig":
        """Fill the depth-dependent defaults for a backbone and check everything fits it."""
        n_side = spec.n_layers // self.reduction
        if self.memory_layer is not None:
            mem = self.memory_layer
        elif self.cached_layer is not None:  # the side layer whose input lines up with the cached layer's
            mem = min(n_side - 1, self.cached_layer // self.reduction)
        else:
            mem = max(0, round(0.75 * n_side) - 1)
        cached = self.cached_layer if self.cached_layer is not None else self.reduction * mem
        if not 0 <= cached < spec.n_layers:
            raise ValueError(f"cached layer {cached} outside the backbone's {spec.n_layers} layers")
        if self.segment_len > spec.max_positions:
            raise ValueError(f"segment_len {self.segment_len} exceeds the backbone's {spec.max_positions} positions")
        if self.train_scope not in ("full", "compact"):
            raise ValueError(f"train_scope must be 'full' or 'compact', got {self.train_scope!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        return replace(self, memory_layer=mem, cached_layer=cached,
                       topk=self.topk if self.topk is not None else DEFAULT_TOPK)

    @classmethod
    def from_dict(cls, d: dict) -> "LongMemConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in current_names(d).items() if k in known})


class LongMemModel(SegmentLM):
    """The LongMem language model. Memory is an argument of every call, never hidden state of the model."""

    drafts = True  # generate may let the frozen backbone draft ahead (``backbone_pass``, ``read_passes``)

    def __init__(self, backbone: Backbone, config: LongMemConfig | None = None):
        super().__init__()
        self.backbone = backbone
        self.config = (config or LongMemConfig()).resolved(backbone.spec)
        c = self.config
        self.segment_len, self.chunk_size, self.capacity = c.segment_len, c.chunk_size, c.capacity
        self.cached_layer = c.cached_layer
        self.max_sinks = c.max_sinks
        self.sidenet = SideNet(backbone, reduction=c.reduction, memory_layer=c.memory_layer,
                               cached_layer=c.cached_layer, chunk_size=c.chunk_size, topk=c.topk, side_init=c.side_init,
                               gate_init=c.gate_init)
        if c.train_scope == "compact":
            self._make_compact(c.lora_rank)
        self.provenance: dict = {}
        self._keep = set(self.sidenet.boundaries) | {c.cached_layer}  # backbone states the SideNet reads

    @classmethod
    def from_config(cls, config: LongMemConfig | None = None, device: str = "cpu",
                    pretrained: bool = True) -> "LongMemModel":
        """The backbone of ``config`` with its shipped trained SideNet when there is one (``pretrained``; the
        checkpoint then decides the SideNet's structure and, unless ``config`` sets it, K; ``config`` the other run-time
        settings), else untrained."""
        config = config or LongMemConfig()
        backbone = load_backbone(config.backbone, resolve_dtype(config.dtype, device), device)
        ckpt = shipped_checkpoint(config.backbone) if pretrained else None
        if ckpt is None:
            return cls(backbone, config)
        runtime = {f: getattr(config, f) for f in RUNTIME_FIELDS if f != "topk" or config.topk is not None}
        return cls.load(ckpt, backbone, device, runtime=runtime)

    def step(self, ids: torch.Tensor, memory: Memory | None, window: Window | None = None) -> Step:
        return self.read_passes([self.backbone_pass(ids, window)], memory, window)

    def backbone_pass(self, ids: torch.Tensor, window: Window | None = None) -> BackbonePass:
        """The frozen backbone's part of ``step``: its states for ``ids`` (B, T) after ``window``'s tokens, which
        grows by them (its backbone cache and the K/V to move into memory), and the K/V of the cached layer."""
        start = window.length if window is not None else 0
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        with torch.no_grad():
            out = self.backbone(ids, positions=positions, use_cache=window is not None,
                                past_key_values=None if window is None else window.past, keep=self._keep)
            k, v = self.memory_kv(out.hidden[self.cached_layer])
        if window is not None:
            window.past = out.past_key_values
            window.append(ids, k, v)
        return BackbonePass(positions, out.hidden, k, v)

    def read_passes(self, passes: list[BackbonePass], memory: Memory | None, window: Window | None = None) -> Step:
        """The rest of ``step``: the SideNet reads the backbone passes' tokens (consecutive, in order) as one batch,
        its caches in ``window`` growing by them."""
        if window is not None and window.side is None:
            window.side = [LayerCache() for _ in self.sidenet.layers]
        p = passes[0] if len(passes) == 1 else BackbonePass.joined(passes)
        trace: list = []
        h = self.sidenet(p.hidden, rope=self.backbone.rope, positions=p.positions, memory=memory, trace=trace,
                         caches=None if window is None else window.side)
        return Step(hidden=h, k=p.k, v=p.v, chunk_ids=trace, reference=p.hidden[self.backbone.spec.n_layers])

    def _make_compact(self, rank: int) -> None:
        """Freeze the copied weights except the memory layer's; the other side layers learn low-rank updates."""
        for p in self.sidenet.parameters():
            p.requires_grad_(False)
        for i, layer in enumerate(self.sidenet.layers):
            if i == self.sidenet.memory_layer:
                for p in layer.parameters():
                    p.requires_grad_(True)
                continue
            for wrapper in add_lora(layer.block, rank):
                wrapper.lora_a.requires_grad_(True)
                wrapper.lora_b.requires_grad_(True)
            for p in (layer.alpha_attn, layer.alpha_mlp):
                if p is not None:
                    p.requires_grad_(True)

    # -- training and checkpoints -----------------------------------------------------------------------------------
    def named_trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The weights training changes, by name (the same interface as ``baselines.MemTRM``)."""
        return [(n, p) for n, p in self.sidenet.named_parameters() if p.requires_grad]

    @property
    def gate(self) -> torch.nn.Parameter:
        """The memory layer's head-wise gate (sigmoid: memory's share of the attention output)."""
        return self.sidenet.gate

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The SideNet weights that training changes (all of them in "full" scope; the rest are backbone copies)."""
        return {k: p.detach().contiguous() for k, p in self.sidenet.named_parameters() if p.requires_grad}

    def save(self, path: str | os.PathLike, provenance: dict | None = None) -> Path:
        """Write ``sidenet.safetensors`` + ``config.json`` into directory ``path`` atomically (temp dir + rename)."""
        path = Path(path)
        with atomic_directory(path) as tmp:
            self.write_files(tmp, provenance)
        return path

    def write_files(self, directory: Path, provenance: dict | None = None) -> None:
        """The checkpoint's two files, written into an existing directory (``save`` makes that atomic)."""
        save_file(self.trainable_state(), str(directory / "sidenet.safetensors"), metadata={"format": "pt"})
        meta = {"format": CHECKPOINT_FORMAT, "config": asdict(self.config), "backbone": self.backbone.identity(),
                "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "provenance": {**self.provenance, **(provenance or {})}}
        (directory / "config.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, path: str | os.PathLike, backbone: Backbone | None = None, device: str = "cpu",
             runtime: dict | None = None) -> "LongMemModel":
        """Load a checkpoint directory; the backbone is loaded from its config unless given (and then checked).
        ``runtime`` overrides settings that do not change the weights (``RUNTIME_FIELDS``)."""
        path = Path(path)
        try:
            meta = json.loads((path / "config.json").read_text())
        except FileNotFoundError:
            raise CheckpointError(f"{path} is not a LongMem checkpoint (no config.json)") from None
        except ValueError as e:
            raise CheckpointError(f"{path}/config.json is not valid JSON: {e}") from None
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT}")
        if meta.get("kind", "longmem") != "longmem":
            raise CheckpointError(f"{path} is a {meta['kind']} checkpoint, not a LongMem SideNet")
        config = LongMemConfig.from_dict(meta["config"])
        if runtime:
            if set(runtime) - set(RUNTIME_FIELDS):
                raise ValueError(f"only {RUNTIME_FIELDS} can be set at load time, not {sorted(set(runtime))}")
            config = replace(config, **runtime)
        if backbone is None:
            backbone = load_backbone(config.backbone, resolve_dtype(config.dtype, device), device)
        want = meta["backbone"]
        if want["sha256"] != backbone.fingerprint():
            raise CheckpointError(f"{path} was trained for backbone {want['name']!r} (sha256 {want['sha256'][:12]}…), "
                                  f"not {backbone.name!r} (sha256 {backbone.fingerprint()[:12]}…)")
        model = cls(backbone, config)
        state = load_file(str(path / "sidenet.safetensors"))
        missing, unexpected = model.sidenet.load_state_dict(state, strict=False)
        trained = set(model.trainable_state())
        missing = [k for k in missing if k in trained]  # frozen backbone copies are not saved
        if missing or unexpected:
            raise CheckpointError(f"{path}: weights do not match the SideNet (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]})")
        model.provenance = meta.get("provenance", {})
        return model.to(device)
