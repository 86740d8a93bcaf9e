"""Memory-augmented adaptation training (paper section 3.1, appendix C): the backbone is frozen, the SideNet learns.

    python -m training --out runs/smol --steps 2000            # or: longmem train ...
    python -m training --out runs/smol --resume                # continue bit for bit where it stopped
    torchrun --nproc_per_node 2 -m training --out runs/ddp     # data parallel (each process keeps its own memory)

Every step takes one batch from the ``Batchfier`` (row j continues row j of the previous step, within one
document), clears the memory of rows where a new document starts, runs LongMem on the segment (retrieving from the
row's memory), then appends the segment's layer-m keys/values to that memory: exactly the inference-time update.
Optimiser: Adam (0.9, 0.98), eps 1e-6, decoupled weight decay 0.01, polynomial LR decay, gradient clipping 2.0.

``--model memtrm`` trains the MemTRM baseline (``longmem.model.baselines.MemTRM``: a trainable memory layer inside the
frozen backbone) with the same data, loop and optimiser, so the two compare like with like.

A run directory holds ``checkpoint/`` (the checkpoint ``LongMemModel.load`` or ``MemTRM.load`` reads, plus
``optimizer.safetensors`` and ``trainer.json`` with the config and data position), ``metrics.jsonl`` and
``loss.png``. Memory banks are not saved: on resume they are rebuilt by replaying the frozen backbone over the
segments still in memory, which gives the same keys/values.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.checkpoint import checkpoint

from longmem.model.backbone import load_backbone
from longmem.model.baselines import BackboneLM, MemTRM
from longmem.model.lm import SegmentLM, segment_starts
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.util.files import atomic_directory

from .data import Batchfier, Document

KL_SCOPES = ("all", "empty")  # TrainConfig.kl_scope
RUN_SETTINGS = ("out", "steps", "device", "amp", "save_every", "eval_every", "eval_segments")  # free on --resume
LOSS_CHUNK = 256  # positions per LM-head call in the loss
LOSS_KEEP_BYTES = 1 << 30  # float32 log-probabilities up to this size are kept for backward, larger ones recomputed


@dataclass
class TrainConfig:
    out: str = "runs/longmem"  # run directory (checkpoint/, metrics.jsonl, loss.png)
    model: str = "longmem"  # "longmem" (the SideNet) or "memtrm" (the baseline: a memory layer inside the backbone)
    backbone: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local .gguf file or HF model dir
    init: str | None = None  # start from this SideNet checkpoint (default: the untrained SideNet)
    train_scope: str = "compact"  # "full" (every SideNet weight) or "compact" (memory layer + LoRA + scales)
    lora_rank: int = 16  # rank of the compact mode's low-rank updates
    cached_layer: int | None = None  # backbone layer m in memory (None = the model's default; training.studies.probe)
    batch_size: int = 2  # rows per process (the paper: 256 in all)
    segment_len: int = 1024  # tokens per row per step
    memory_tokens: int = 16384  # M: memory per row (the paper: 65k)
    topk: int | None = None  # K: memory tokens each query attends to (None: the --init checkpoint's, else 64)
    steps: int = 1000  # optimizer steps in all
    lr: float = 2e-4  # peak learning rate
    end_lr: float = 0.0  # learning rate at the last step
    lr_power: float = 1.0  # polynomial decay power (1 = linear)
    warmup_steps: int = 0  # linear warm-up (the paper: none)
    weight_decay: float = 0.01
    answer_weight: float = 1.0  # loss weight of recall-answer tokens (the only tokens that need memory; 1 = plain LM)
    kl_weight: float = 0.0  # weight of KL(backbone || model) on every other token: keeps the SideNet from drifting off
    #                         the backbone's predictions (its answering) where memory is not what is taught (0 = off)
    kl_scope: str = "all"  # where the KL term applies: "all" (every token but recall answers) or "empty" (only the
    #                        segments read with an empty memory, a document's first: the SideNet alone stays the
    #                        backbone, and memory's part is left to the LM loss)
    scale_lr: float = 1.0  # LR multiplier (and no weight decay) for the ReZero scales and the memory gate: scalars
    #                        that start at 0 and must travel O(1) before memory can matter; 1 = one plain group
    grad_clip: float = 2.0
    amp: str = "auto"  # autocast dtype: auto (bf16 where the hardware has it), bfloat16, float16, none
    device: str = "auto"  # "auto" (cuda when present), "cpu", "cuda", "cuda:1", ...
    max_doc_segments: int = 0  # cut longer documents into parts of this many segments (0 = never)
    seed: int = 0  # data order
    save_every: int = 50  # steps between checkpoints (and on Ctrl-C)
    eval_every: int = 50  # steps between held-out evaluations (0 = never)
    eval_segments: int = 4  # held-out segments per evaluation (each scored after its document's past in memory)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# ----------------------------------------------------------------------------------------------------------------
# The loss


def token_nll(model: SegmentLM, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (B, T) of hidden (B, T, E) against targets (B, T), the LM head applied in chunks. When
    backward would keep more than ``LOSS_KEEP_BYTES`` of log-probabilities (B * T * 49k floats), each chunk runs under
    activation checkpointing and its logits are recomputed in backward instead (at 2 x 1k tokens, 0.4 GB are kept:
    why, ``docs/design.md``)."""
    return token_losses(model, hidden, targets)[0]


def token_losses(model: SegmentLM, hidden: torch.Tensor, targets: torch.Tensor,
                 reference: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_nll``, and with ``reference`` (B, T, E) (the frozen backbone's own states, no gradient) also
    KL(backbone || model) (B, T) of the next-token distributions, computed in the same chunks."""
    def chunk(h, t, r):
        logp = torch.log_softmax(model.backbone.logits(h).float(), dim=-1)  # (B, t, V)
        nll = -logp.gather(-1, t[..., None])[..., 0]
        if r is None:
            return nll, None
        with torch.no_grad():
            ref = torch.log_softmax(model.backbone.logits(r).float(), dim=-1)
        return nll, (ref.exp() * (ref - logp)).sum(-1)

    B, T, _ = hidden.shape
    recompute = torch.is_grad_enabled() and B * T * model.backbone.spec.vocab_size * 4 > LOSS_KEEP_BYTES
    run = (lambda *a: checkpoint(chunk, *a, use_reentrant=False)) if recompute else chunk
    parts = [run(hidden[:, s:s + LOSS_CHUNK], targets[:, s:s + LOSS_CHUNK],
                 None if reference is None else reference[:, s:s + LOSS_CHUNK]) for s in range(0, T, LOSS_CHUNK)]
    nll = torch.cat([p[0] for p in parts], dim=1)
    return nll, None if reference is None else torch.cat([p[1] for p in parts], dim=1)


class SegmentLoss(nn.Module):
    """One training step's forward as a module (what DistributedDataParallel wraps): read memory, predict the
    segment, append its keys/values to memory. Returns the objective (mean next-token NLL, recall-answer tokens
    weighted by ``answer_weight``, plus ``kl_weight`` times the mean KL(backbone || model) over the tokens
    ``kl_scope`` names: every token but recall answers, or those of rows whose memory is empty before the step),
    the per-token NLL (B, T-1) and the per-token KL (or None), detached, for the metrics. A step whose rows all
    have memory gets no KL term under "empty"."""

    def __init__(self, model: SegmentLM, answer_weight: float = 1.0, kl_weight: float = 0.0, kl_scope: str = "all"):
        super().__init__()
        if kl_scope not in KL_SCOPES:
            raise ValueError(f"kl_scope must be one of {KL_SCOPES}, not {kl_scope!r}")
        self.model, self.answer_weight, self.kl_weight, self.kl_scope = model, answer_weight, kl_weight, kl_scope

    def forward(self, ids: torch.Tensor, memory, answers: torch.Tensor):
        if self.kl_scope == "empty":  # (B,) rows read with an empty memory: sizes before this step adds its keys
            empty = torch.tensor([n == 0 for n in memory.sizes()], device=ids.device)
        out = self.model.step_and_remember(ids, memory)
        reference = out.reference[:, :-1] if self.kl_weight and out.reference is not None else None
        if self.kl_weight and reference is None:
            raise ValueError(f"{type(self.model).__name__} has no backbone reference to keep close to (kl_weight)")
        nll, kl = token_losses(self.model, out.hidden[:, :-1], ids[:, 1:], reference)  # (B, T-1) each
        weight = 1.0 + (self.answer_weight - 1.0) * answers[:, 1:].to(nll.dtype)  # (B, T-1)
        objective = (nll * weight).sum() / nll.numel()
        if kl is not None:
            other = ~answers[:, 1:]  # (B, T-1)
            if self.kl_scope == "empty":
                other = other & empty[:, None]
            objective = objective + self.kl_weight * (kl * other).sum() / other.sum().clamp(min=1)
        return objective, nll.detach(), None if kl is None else kl.detach()


def number_tokens(tokenizer) -> torch.Tensor:
    """(V,) bool: the tokens a recall number's answer is made of, those that read as digits or as nothing once
    stripped (SmolLM2 writes " 4817" as " ", "4", "8", "1", "7"); a name's tokens are neither. The metrics use it to
    tell the answer NLL of numbers from that of names."""
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return torch.tensor([p.strip().isdigit() or not p.strip() for p in pieces], dtype=torch.bool)


def learning_rate(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.end_lr + (cfg.lr - cfg.end_lr) * (1 - min(frac, 1.0)) ** cfg.lr_power


def resolve_device(name: str, rank: int = 0) -> str:
    """"auto" -> this process's GPU when there is one (one per process under torchrun), else the CPU."""
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', rank)) % torch.cuda.device_count()}"
    return "cpu"


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``cfg.amp`` (None: none); "auto" follows the model dtype "auto" picks on ``device``
    (``longmem.model.backbone.dtype_choice``: $LONGMEM_DTYPE, else bf16 where it is native), float32 meaning none."""
    from longmem.model.backbone import resolve_dtype

    if cfg.amp == "none":
        return None
    if cfg.amp == "auto":
        chosen = resolve_dtype("auto", device)
        return None if chosen == torch.float32 else chosen
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.amp]


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints: the model's own files + optimizer state (safetensors) + trainer.json


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors = {f"{i}.{k}": v.detach().contiguous().cpu() for i, st in sd["state"].items() for k, v in st.items()}
    return tensors, {"param_groups": sd["param_groups"]}


def _load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict = {}
    for key, v in tensors.items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


SCALE_NAMES = ("alpha_attn", "alpha_mlp", "gate")  # SideNet scalars: ReZero branch scales, head-wise memory gate


def param_groups(model: SegmentLM, cfg: TrainConfig) -> list[dict]:
    """The optimizer's parameter groups: one group of every trained weight, or (``scale_lr`` != 1) the weights and,
    apart, the branch scales and memory gate with ``lr_mult = scale_lr`` and no weight decay (decay would pull
    them back to 0, which switches the branches off)."""
    named = model.named_trainable()
    if cfg.scale_lr == 1.0:
        return [{"params": [p for _, p in named]}]
    is_scale = [n.rsplit(".", 1)[-1] in SCALE_NAMES for n, _ in named]
    return [{"params": [p for (_, p), s in zip(named, is_scale) if not s]},
            {"params": [p for (_, p), s in zip(named, is_scale) if s], "lr_mult": cfg.scale_lr, "weight_decay": 0.0}]


def save_checkpoint(run: Path, model: SegmentLM, opt: torch.optim.Optimizer, cfg: TrainConfig, step: int,
                    extra: dict) -> Path:
    path = run / "checkpoint"
    with atomic_directory(path) as tmp:
        model.write_files(tmp, {"trainer": "training.train", "step": step, "train_config": asdict(cfg), **extra})
        tensors, meta = _optimizer_tensors(opt)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer.json").write_text(json.dumps({"step": step, "config": asdict(cfg), "optimizer": meta,
                                                      **extra}, indent=2))
    return path


# ----------------------------------------------------------------------------------------------------------------
# Distributed set-up (torchrun sets the environment)


def dist_info() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), dist.get_world_size()) if world > 1 else (0, 1)


# ----------------------------------------------------------------------------------------------------------------
# The models


def load_trained(path: Path, backbone=None, device: str = "cpu") -> SegmentLM:
    """A checkpoint of either model (its config.json says which), float32 for training."""
    kind = json.loads((Path(path) / "config.json").read_text()).get("kind", "longmem")
    if kind == "memtrm":
        return MemTRM.load(path, backbone, device=device, dtype="float32")
    return LongMemModel.load(path, backbone, device=device)


def new_memtrm(cfg: TrainConfig, device: str) -> MemTRM:
    """The MemTRM baseline, its memory layer a copy of backbone layer ``cached_layer`` (default: 3/4 depth), or
    the ``init`` checkpoint's."""
    if cfg.init:
        return MemTRM.load(cfg.init, device=device, dtype="float32")
    backbone = load_backbone(cfg.backbone, torch.float32, device)
    model = MemTRM(backbone, cached_layer=cfg.cached_layer, topk=cfg.topk or 64, capacity=cfg.memory_tokens,
                   segment_len=cfg.segment_len)
    model.backbone_source = cfg.backbone
    return model.to(device)


# ----------------------------------------------------------------------------------------------------------------
# The loop


class Trainer:
    def __init__(self, cfg: TrainConfig, documents: list[Document], held_out: list[Document] | None = None,
                 model: SegmentLM | None = None, resume: bool = False, log=print, defer_data: bool = False):
        """Build (or, with ``resume``, reload) the model and optimizer; ``defer_data`` waits for ``set_data`` (the
        documents may need the model's tokenizer)."""
        if cfg.model not in ("longmem", "memtrm"):
            raise ValueError(f"model must be 'longmem' or 'memtrm', got {cfg.model!r}")
        self.cfg, self.run, self.log = cfg, Path(cfg.out), log
        self.rank, self.world = dist_info()
        self.device = resolve_device(cfg.device, self.rank)
        ckpt = self.run / "checkpoint"
        self.step = 0
        if resume and (ckpt / "trainer.json").exists():
            state = json.loads((ckpt / "trainer.json").read_text())
            # the run's model and data settings come from the checkpoint; how to run it from this invocation
            here = {k: getattr(cfg, k) for k in RUN_SETTINGS}
            self.cfg = cfg = TrainConfig.from_dict({**state["config"], **here})
            backbone = model.backbone if model is not None else None
            self.model = load_trained(ckpt, backbone, self.device)
            self.step = state["step"]
            self.resumed_data = state.get("data", {})
        elif model is not None:
            self.model = model
        elif cfg.model == "memtrm":
            self.model = new_memtrm(cfg, self.device)
        else:
            # float32 weights (the trained ones need full-precision updates); autocast gives the bf16 speed
            mcfg = LongMemConfig(backbone=cfg.backbone, dtype="float32", segment_len=cfg.segment_len,
                                 capacity=cfg.memory_tokens, train_scope=cfg.train_scope, lora_rank=cfg.lora_rank,
                                 cached_layer=cfg.cached_layer, topk=cfg.topk)
            self.model = (LongMemModel.load(cfg.init, device=self.device,
                                            runtime={"topk": cfg.topk} if cfg.topk else None) if cfg.init
                          else LongMemModel.from_config(mcfg, device=self.device, pretrained=False))
        self.model.capacity = cfg.memory_tokens
        self.params = [p for _, p in self.model.named_trainable()]
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6,
                                     weight_decay=cfg.weight_decay)
        if self.step and (ckpt / "optimizer.safetensors").exists():
            _load_optimizer(self.opt, load_file(str(ckpt / "optimizer.safetensors")), state["optimizer"])
        elif self.step:  # e.g. a checkpoint committed without its optimizer state: Adam's moments start afresh
            log("no optimizer.safetensors in the checkpoint: resuming with fresh optimizer state (not bit-exact)")
        self.loss_module: nn.Module = SegmentLoss(self.model, cfg.answer_weight, cfg.kl_weight, cfg.kl_scope)
        if self.world > 1:
            on_gpu = self.device.startswith("cuda")
            self.loss_module = nn.parallel.DistributedDataParallel(
                self.loss_module, device_ids=[torch.device(self.device).index] if on_gpu else None)
        self.amp = autocast_dtype(cfg, self.model.backbone.device)
        tokenizer = self.model.backbone.tokenizer
        self.number_tokens = number_tokens(tokenizer) if tokenizer is not None else None  # (V,) bool, for metrics
        if not defer_data:
            self.set_data(documents, held_out)

    def set_data(self, documents: list[Document], held_out: list[Document] | None = None) -> None:
        cfg = self.cfg
        before = getattr(self, "resumed_data", {})
        self.data = Batchfier(documents, cfg.batch_size, cfg.segment_len, seed=cfg.seed, rank=self.rank,
                              world_size=self.world, max_doc_segments=cfg.max_doc_segments or None)
        # compared as the checkpoint counts them: the batchfier's documents (long ones cut into parts)
        now = {"documents": len(self.data.documents), "tokens": int(sum(len(d.ids) for d in self.data.documents))}
        if self.step and "tokens" in before and {k: before[k] for k in now} != now:
            raise ValueError(f"cannot resume with other data: the run trained on {before['documents']} documents "
                             f"({before['tokens']:,} tokens), this one has {now['documents']} ({now['tokens']:,}); "
                             "give the same data options as the first run")
        self.held_out = held_out or []
        self.memory = self.model.new_memory(batch_size=cfg.batch_size, capacity=cfg.memory_tokens)
        if self.step:
            self._replay_memory()

    def _autocast(self):
        dev = self.model.backbone.device.type
        return torch.autocast(dev, dtype=self.amp, enabled=self.amp is not None)

    @torch.no_grad()
    def _replay_memory(self) -> None:
        """Rebuild every row's memory as it was before ``self.step``: the frozen backbone's keys/values of the
        segments since the rows' documents started (at most the last M tokens of them)."""
        keep = math.ceil(self.cfg.memory_tokens / self.cfg.segment_len)
        start = max(self.data.first_step_of_documents(self.step), self.step - keep)
        self.log(f"resuming at step {self.step}: replaying the backbone over steps {start}..{self.step - 1} to "
                 "rebuild memory")
        if isinstance(self.model, MemTRM):  # its memory holds its own trainable layer's keys/values
            self.log("MemTRM: the rebuilt memory holds keys/values of the current weights, not of the earlier "
                     "weights that first stored them, so this resume is close to, not bit for bit, an "
                     "uninterrupted run")
        for s in range(start, self.step):
            self._memory_step(self.data.batch(s), replay=True)

    def _memory_step(self, batch, replay: bool = False):
        rows = [j for j, r in enumerate(batch.reset.tolist()) if r]
        if rows:
            self.memory.clear(rows)
        ids = batch.ids.to(self.model.backbone.device)
        if replay:
            with self._autocast():
                k, v = self.model.encode_memory(ids)
            self.memory.add(k, v, tokens=ids, starts=segment_starts(*ids.shape, ids.device))
            return None
        with self._autocast():
            return self.loss_module(ids, self.memory, batch.answers.to(ids.device))

    def train_step(self) -> dict:
        cfg = self.cfg
        lr = learning_rate(cfg, self.step)
        for g in self.opt.param_groups:
            g["lr"] = lr * g.get("lr_mult", 1.0)
        batch = self.data.batch(self.step)
        t0 = time.perf_counter()
        objective, nll, kl = self._memory_step(batch)
        self.opt.zero_grad(set_to_none=True)
        objective.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self.step += 1
        tokens = batch.ids.numel() * self.world
        row = {"step": self.step, "loss": nll.mean().item(), "lr": lr, "grad_norm": float(grad_norm), "tokens": tokens,
               "s": time.perf_counter() - t0, "gate": torch.sigmoid(self.model.gate).mean().item()}
        if kl is not None:
            row["kl"] = kl.mean().item()
            fresh = batch.reset.to(kl.device)  # (B,) rows whose memory was cleared: read with memory empty
            if fresh.any():
                row["kl_memory_empty"] = kl[fresh].mean().item()
        answers = batch.answers[:, 1:].to(nll.device)
        if answers.any():  # this process's recall answers: the tokens memory must supply
            row["answer_nll"], row["answer_tokens"] = nll[answers].mean().item(), int(answers.sum())
            if self.number_tokens is not None:  # split by kind (``number_tokens``)
                number = self.number_tokens.to(nll.device)[batch.ids[:, 1:].to(nll.device)]  # (B, T-1)
                for kind, mask in (("numbers", answers & number), ("names", answers & ~number)):
                    if mask.any():
                        row[f"answer_nll_{kind}"] = nll[mask].mean().item()
                        row[f"answer_tokens_{kind}"] = int(mask.sum())
        return row

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out loss of LongMem (segment_len local + memory of the document's past) next to the backbone with
        the same local window, on the last ``eval_segments`` segments of each held-out document."""
        L, n = self.cfg.segment_len, self.cfg.eval_segments
        base = BackboneLM(self.model.backbone, L)
        out = {"longmem_nll": 0.0, "no_memory_nll": 0.0, "backbone_nll": 0.0, "tokens": 0}
        for doc in self.held_out:
            ids = torch.as_tensor(doc.ids[: (len(doc.ids) // L) * L], dtype=torch.long)
            if len(ids) < 2 * L:
                continue
            past, tail = ids[: -n * L][-self.cfg.memory_tokens:], ids[-n * L:]
            memory = self.model.new_memory(capacity=self.cfg.memory_tokens)
            if len(past):
                self.model.memorize(past, memory)
            nll_m, count = self.model.nll(tail, memory)
            nll_0, _ = self.model.nll(tail, None)  # the SideNet without memory: what memory itself adds
            nll_b, _ = base.nll(tail)
            out["longmem_nll"] += nll_m
            out["no_memory_nll"] += nll_0
            out["backbone_nll"] += nll_b
            out["tokens"] += count
        if out["tokens"]:
            out["longmem_ppl"] = math.exp(out["longmem_nll"] / out["tokens"])
            out["no_memory_ppl"] = math.exp(out["no_memory_nll"] / out["tokens"])
            out["backbone_ppl"] = math.exp(out["backbone_nll"] / out["tokens"])
            out["ppl_ratio"] = out["longmem_ppl"] / out["backbone_ppl"]
        return out

    def save(self) -> Path:
        return save_checkpoint(self.run, self.model, self.opt, self.cfg, self.step,
                               {"data": {"seed": self.cfg.seed, "steps_per_epoch": self.data.steps_per_epoch,
                                         "world_size": self.world, "documents": len(self.data.documents),
                                         "recall_documents": sum(d.name.startswith("recall-")
                                                                 for d in self.data.documents),
                                         "quote_documents": sum(d.name.startswith("quote-")
                                                                for d in self.data.documents),
                                         "reading_documents": sum(d.name.startswith("reading-")
                                                                  for d in self.data.documents),
                                         "tokens": int(sum(len(d.ids) for d in self.data.documents))}})

    def fit(self, progress: bool = True, until: int | None = None) -> list[dict]:
        """Train to ``cfg.steps`` (or stop at step ``until``); checkpoints every ``save_every`` steps, at the end
        and on Ctrl-C/SIGTERM."""
        from tqdm import tqdm

        cfg, history = self.cfg, []
        main = self.rank == 0
        self.run.mkdir(parents=True, exist_ok=True)
        metrics = open(self.run / "metrics.jsonl", "a") if main else None
        stop = {"now": False}
        old = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True)) if main else None
        bar = tqdm(total=cfg.steps, initial=self.step, unit="step", disable=not (main and progress))
        t_start, tokens = time.perf_counter(), 0
        try:
            while self.step < min(cfg.steps, until or cfg.steps) and not stop["now"]:
                row = self.train_step()
                tokens += row["tokens"]
                row["tok_s"] = tokens / (time.perf_counter() - t_start)
                if cfg.eval_every and self.held_out and self.step % cfg.eval_every == 0 and main:
                    row["eval"] = self.evaluate()
                history.append(row)
                if main:
                    metrics.write(json.dumps(row) + "\n")
                    metrics.flush()
                    bar.update(1)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tok_s']:.0f}")
                if cfg.save_every and self.step % cfg.save_every == 0 and main:
                    self.save()
        except KeyboardInterrupt:
            self.log(f"interrupted at step {self.step}; saving a checkpoint")
            stop["now"] = True
        finally:
            bar.close()
            if main:
                self.save()
                metrics.close()
                signal.signal(signal.SIGTERM, old)
                from .plots import plot_metrics

                plot_metrics(self.run / "metrics.jsonl", self.run / "loss.png",
                             model="MemTRM" if self.cfg.model == "memtrm" else "LongMem")
        return history
