"""What every model in LongMem shares: segment-wise language modelling with an optional memory.

A model implements ``step``: run ids (B, T) that follow an optional local ``Window`` (incremental decoding) and
return its last hidden state (before the frozen norm + LM head) plus the pre-RoPE keys/values of its cached layer
for those tokens. Logits are computed only where they are needed (the last position when generating, chunks of
positions when scoring), since the 49k-word LM head is a large share of the cost. On top of that this module gives
all models the same ``forward`` (loss + the paper's memory update: retrieve first, then append the segment),
``memorize``, ``nll`` over a long stream, ``score`` and streaming ``generate`` (where a model's step splits into its
frozen backbone's pass and the rest, greedy decoding lets the backbone draft a few tokens that the rest reads at once:
``Sampling.draft``). LongMem, the backbone alone and the MemTRM baseline thus run through identical loops, so
evaluations compare like with like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from longmem.memory.memory import MAX_SINKS, Memory
from longmem.memory.view import MemoryView
from longmem.model.backbone import Backbone

Progress = Callable[[int, int], None]  # (tokens done, tokens total)
LOGIT_CHUNK = 1024  # positions per LM-head call when scoring long inputs (bounds the (T, V) logits in memory)


@dataclass
class Window:
    """The local context of an incremental decode: its tokens and every cache that belongs to them."""

    ids: torch.Tensor | None = None  # (B, T) tokens in the window
    past: object | None = None  # the backbone's Hugging Face KV cache
    side: list | None = None  # per-layer caches of the model's own layers (SideNet / memory layer)
    mem_k: torch.Tensor | None = None  # (B, Hkv, T, d) pre-RoPE K of the cached layer, to move into memory
    mem_v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.ids is None else self.ids.shape[1]

    def append(self, ids: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None) -> None:
        cat = lambda a, b, dim: b if a is None else torch.cat([a, b], dim=dim)  # noqa: E731
        self.ids = cat(self.ids, ids, 1)
        if k is not None:
            self.mem_k, self.mem_v = cat(self.mem_k, k, 2), cat(self.mem_v, v, 2)

    def crop(self, n: int) -> None:
        """Keep the window's first ``n`` tokens and what belongs to them in every cache (drafted tokens that the
        model did not choose go)."""
        gone = self.length - n
        if gone <= 0:
            return
        self.ids = self.ids[:, :n]
        if self.mem_k is not None:
            self.mem_k, self.mem_v = self.mem_k[:, :, :n], self.mem_v[:, :, :n]
        if self.past is not None:
            self.past.crop(-gone)  # Hugging Face's cache: a negative count drops that many of its last tokens
        for cache in self.side or []:
            cache.crop(n)


@dataclass
class Step:
    hidden: torch.Tensor  # (B, T, E) last hidden state, before the final norm and LM head
    k: torch.Tensor | None  # (B, Hkv, T, d) pre-RoPE keys of the cached layer (None for models without memory)
    v: torch.Tensor | None
    chunk_ids: list = field(default_factory=list)  # what the memory layer retrieved: [(B, Hq, T, n_chunks)]
    reference: torch.Tensor | None = None  # (B, T, E) the frozen backbone's own last state, where the model has one
    #                                        beside its output (LongMem: what it would predict without its SideNet)


@dataclass
class BackbonePass:
    """The frozen backbone's part of a step (models that have one: ``SegmentLM.drafts``), before the rest reads it."""

    positions: torch.Tensor  # (T,) absolute positions of its tokens
    hidden: list[torch.Tensor | None]  # H_llm[0..n] (B, T, E), None where the model does not read it
    k: torch.Tensor  # (B, Hkv, T, d) pre-RoPE keys of the cached layer
    v: torch.Tensor

    @staticmethod
    def joined(passes: list[BackbonePass]) -> BackbonePass:
        """Consecutive passes as one."""
        cat = lambda xs, dim: torch.cat(list(xs), dim=dim)  # noqa: E731
        return BackbonePass(cat((p.positions for p in passes), 0),
                            [None if h is None else cat((p.hidden[i] for p in passes), 1)
                             for i, h in enumerate(passes[0].hidden)],
                            cat((p.k for p in passes), 2), cat((p.v for p in passes), 2))


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    loss: torch.Tensor | None  # mean next-token cross-entropy when labels were given


@dataclass(frozen=True)
class Probe:
    """A question the model is asked once its answer is made, and the two replies weighed (``Trace.confirm``)."""

    ids: tuple[int, ...]  # read after the answer: the end of its turn, the question, the start of the next reply
    #                       (``tasks.chat.Chat.probe`` renders them in the model's chat template)
    yes: tuple[int, ...]  # first tokens of the reply weighed for (e.g. "Yes", " Yes", "yes")
    no: tuple[int, ...]  # first tokens of the reply weighed against

    def __post_init__(self):
        if not (self.ids and self.yes and self.no):
            raise ValueError("a probe needs its question's ids and tokens of both replies")
        if set(self.yes) & set(self.no):
            raise ValueError("a probe's two replies share a first token")


@dataclass
class Sampling:
    max_new_tokens: int = 128  # tokens to generate at most
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.9  # nucleus sampling mass
    seed: int | None = None  # for reproducible sampling
    stop_ids: tuple[int, ...] = ()  # stop after emitting one of these (e.g. the tokenizer's EOS)
    backbone_stops: bool = False  # also stop where the frozen backbone would: where its own most likely next token
    #                               (``Step.reference``) is a stop id, that id is emitted (LongMem; a no-op elsewhere)
    side_weight: float = 1.0  # the model's share of each next-token distribution beside the frozen backbone's:
    #                           logits = w * the model's + (1 - w) * the backbone's (``Step.reference``; 1: the
    #                           model's own, 0: the backbone's; LongMem; a no-op elsewhere)
    no_repeat: int = 0  # n > 0: never choose a token that would repeat an n-gram the generation already holds (its
    #                     own tokens, not the prompt's), which ends greedy loops; 0: off
    decline: tuple[int, ...] = ()  # a reply the model may give instead of an answer ("The book does not say.", as
    #                                token ids): given only when the model's probability of the whole of it, right
    #                                after the prompt, is above ``decline_above``; otherwise the model answers with its
    #                                likeliest reply that does not begin with it (its second token is banned after its
    #                                first); (): no such reply, every token as sampled
    decline_above: float = 0.5  # the probability the decline must have to be given (``decline``)
    probe: Probe | None = None  # asked once the answer ends (a stop id, or ``max_new_tokens``), its tokens read after
    #                             the answer's: the model's probability of its ``yes`` against its ``no`` goes to
    #                             ``Trace.confirm`` (with a trace; None: not asked)
    draft: int = 6  # greedy decoding with the backbone's logits in the mix (side_weight < 1): the frozen backbone
    #                 drafts up to this many tokens ahead, and the model reads them in one pass and keeps those it would
    #                 have chosen itself: the tokens of one step at a time (up to rounding, as the drafts are read as
    #                 a batch) with fewer passes of the rest of the model (LongMem); 0: off

    def __post_init__(self):
        if not 0.0 <= self.side_weight <= 1.0:
            raise ValueError(f"side_weight must be in [0, 1], got {self.side_weight}")
        if self.no_repeat < 0:
            raise ValueError(f"no_repeat must be >= 0, got {self.no_repeat}")
        if self.draft < 0:
            raise ValueError(f"draft must be >= 0, got {self.draft}")
        if not 0.0 <= self.decline_above <= 1.0:
            raise ValueError(f"decline_above must be in [0, 1], got {self.decline_above}")


@dataclass
class Trace:
    """What a generation saw, for who asked (``SegmentLM.generate(..., trace=)``): filled as it runs."""

    decline: float | None = None  # the model's probability of ``Sampling.decline`` right after the prompt (None: not
    #                               asked, or the model's cache cannot be cut back to the prompt to ask it)
    declined: bool = False  # whether the generation was the decline
    probs: list[float] = field(default_factory=list)  # each emitted token's probability under the distribution it
    #                                                   was chosen from (temperature 1, before bans)
    confirm: float | None = None  # with ``Sampling.probe``: the model's probability of its ``yes`` against its
    #                               ``no`` (their float32 logits) once the answer ended (None: not asked; the answer
    #                               left unfinished, declined, or the window too full for the probe)


def as_ids(x, device) -> torch.Tensor:
    """Token ids as a (B, T) long tensor on ``device``: a tensor of one or two dimensions, or any sequence of ints."""
    t = x if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=torch.long)
    return (t if t.dim() == 2 else t.view(1, -1)).to(device)


class SegmentLM(nn.Module):
    """Base class: a frozen backbone, a local window of ``segment_len`` tokens and (optionally) a memory."""

    backbone: Backbone
    segment_len: int
    chunk_size: int = 4
    capacity: int | None = 65536
    max_sinks: int | None = MAX_SINKS  # sink chunks a query may retrieve (see longmem.memory.memory); None = no limit
    cached_layer: int | None = None  # backbone layer whose K/V go into memory; None = model has no memory

    drafts: bool = False  # whether ``step`` splits into ``backbone_pass`` and ``read_passes`` (for drafting ahead)

    # -- to implement ---------------------------------------------------------------------------------------------
    def step(self, ids: torch.Tensor, memory: Memory | None, window: Window | None = None) -> Step:
        raise NotImplementedError

    def backbone_pass(self, ids: torch.Tensor, window: Window | None = None) -> BackbonePass:
        """Models that ``drafts``: the frozen backbone's part of ``step`` (``window`` grows by ``ids``)."""
        raise NotImplementedError

    def read_passes(self, passes: list[BackbonePass], memory: Memory | None, window: Window | None = None) -> Step:
        """Models that ``drafts``: the rest of ``step``, over consecutive backbone passes' tokens as one batch;
        ``step(ids) == read_passes([backbone_pass(ids)])``."""
        raise NotImplementedError

    # -- memory ---------------------------------------------------------------------------------------------------
    @property
    def uses_memory(self) -> bool:
        return self.cached_layer is not None

    def new_memory(self, batch_size: int = 1, capacity: int | None | str = "config",
                   chunk_size: int | None = None) -> Memory:
        """An empty memory shaped for this model (``capacity=None`` for unbounded; ``chunk_size`` another chunk
        size than the model's: its memory layer then reads K / chunk_size chunks of it), searched on the model's GPU
        when it runs on one."""
        if not self.uses_memory:
            raise ValueError(f"{type(self).__name__} has no memory")
        spec = self.backbone.spec
        cap = self.capacity if capacity == "config" else capacity
        return Memory(spec.n_kv_heads, spec.head_dim, chunk_size=chunk_size or self.chunk_size, capacity=cap,
                      batch_size=batch_size, dtype=self.backbone.dtype, max_sinks=self.max_sinks,
                      search_device=self.backbone.device)

    def memory_kv(self, hidden_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-RoPE K/V (B, Hkv, T, d) to store for tokens whose cached-layer input is ``hidden_m`` (B, T, E)."""
        return self.backbone.layer_kv(self.cached_layer, hidden_m)

    @torch.no_grad()
    def encode_memory(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V (B, Hkv, T, d) to store for segments ids (B, T), each encoded on its own (positions from 0), running
        the backbone only up to the cached layer."""
        out = self.backbone(ids, n_layers=self.cached_layer, keep={self.cached_layer})
        return self.memory_kv(out.hidden[self.cached_layer])

    @torch.no_grad()
    def memorize(self, ids, memory: Memory, progress: Progress | None = None, batch_segments: int = 4) -> int:
        """Push token ids (T,) or (B, T) into memory, segment by segment, running the backbone only up to the
        cached layer. Each segment is encoded on its own (positions from 0), as in training; for a single stream,
        ``batch_segments`` consecutive segments run as one batch (larger matmuls; the same result up to rounding,
        which some kernels change with the batch: bfloat16 on AMX CPUs; 1 gives exactly what a bank stores from it).
        Returns the number of tokens added per row."""
        ids = as_ids(ids, self.backbone.device)
        total, L = ids.shape[1], self.segment_len
        step = L * (batch_segments if ids.shape[0] == 1 else 1)
        for s in range(0, total, step):
            segs = ids[:, s:s + step].split(L, dim=1)  # only the last one can be shorter than L
            full = [x for x in segs if x.shape[1] == L]
            for seg in ([torch.cat(full)] if full else []) + [x for x in segs if x.shape[1] < L]:
                k, v = self.encode_memory(seg)  # (b, Hkv, T, d)
                starts = segment_starts(seg.shape[0], seg.shape[1], seg.device)
                if seg.shape[0] != ids.shape[0]:  # batched segments of one stream: back to one row, in order
                    k, v = (t.transpose(0, 1).reshape(1, t.shape[1], -1, t.shape[-1]) for t in (k, v))
                    seg, starts = seg.reshape(1, -1), starts.reshape(1, -1)
                memory.add(k, v, tokens=seg, starts=starts)
            if progress is not None:
                progress(min(s + step, total), total)
        return total

    # -- language modelling ---------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, memory: Memory | None = None, labels: torch.Tensor | None = None,
                update_memory: bool = True) -> LMOutput:
        """One segment (B, T): retrieve from memory, predict, then append the segment to memory (paper's update)."""
        if input_ids.shape[1] > self.segment_len:
            raise ValueError(f"segment of {input_ids.shape[1]} tokens exceeds segment_len={self.segment_len}")
        out = self.step_and_remember(input_ids, memory, update=update_memory)
        logits = self.backbone.logits(out.hidden)
        loss = None
        if labels is not None:
            pred = logits[:, :-1].float()
            loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        return LMOutput(logits=logits, loss=loss)

    def step_and_remember(self, ids: torch.Tensor, memory: Memory | None, update: bool = True) -> Step:
        """One segment (B, T) with the paper's update rule: it reads memory first, then (``update``) its K/V are
        appended to it. Returns the ``Step`` (hidden states, and what training needs: the backbone's own states)."""
        out = self.step(ids, memory)
        if update and memory is not None and out.k is not None:
            memory.add(out.k.detach(), out.v.detach(), tokens=ids, starts=segment_starts(*ids.shape, ids.device))
        return out

    def token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log P(targets) (B, T) from hidden states (B, T, E) at the positions before them, in chunks."""
        out = []
        for s in range(0, hidden.shape[1], LOGIT_CHUNK):
            logp = torch.log_softmax(self.backbone.logits(hidden[:, s:s + LOGIT_CHUNK]).float(), dim=-1)
            out.append(logp.gather(-1, targets[:, s:s + LOGIT_CHUNK, None])[..., 0])
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def nll(self, ids, memory: Memory | None = None, progress: Progress | None = None) -> tuple[float, int]:
        """Summed negative log-likelihood and number of predicted tokens of a long stream (T,) or (B, T), read in
        consecutive segments. Each segment sees its own tokens locally and (through memory) everything before.
        The first token of a segment is predicted from the previous segment's last position."""
        ids = as_ids(ids, self.backbone.device)
        total, nll, count, prev = ids.shape[1], 0.0, 0, None
        for s in range(0, total, self.segment_len):
            seg = ids[:, s:s + self.segment_len]
            out = self.step_and_remember(seg, memory)
            hidden = out.hidden if prev is None else torch.cat([prev, out.hidden], dim=1)
            targets = seg[:, 1:] if prev is None else seg
            nll -= self.token_logprobs(hidden[:, : targets.shape[1]], targets).sum().item()
            count += targets.numel()
            prev = out.hidden[:, -1:]
            if progress is not None:
                progress(min(s + self.segment_len, total), total)
        return nll, count

    @torch.no_grad()
    def score(self, context, continuation, memory: Memory | None = None) -> float:
        """log P(continuation | context, memory), summed over the continuation's tokens. Memory is read, never
        changed; a context too long for the local window is cut from the left."""
        ctx, cont = as_ids(context, self.backbone.device), as_ids(continuation, self.backbone.device)
        n = cont.shape[1]
        if n == 0:
            return 0.0
        if n >= self.segment_len:
            raise ValueError(f"continuation of {n} tokens does not fit the {self.segment_len}-token window")
        ids = torch.cat([ctx, cont], dim=1)[:, -self.segment_len:]
        return self.token_logprobs(self.step(ids, memory).hidden[:, -n - 1:-1], ids[:, -n:]).sum().item()

    @torch.no_grad()
    def generate(self, prompt, memory: Memory | None = None, sampling: Sampling | None = None,
                 search_from: int = 0, trace: Trace | None = None) -> Iterator[int]:
        """Stream new token ids after ``prompt`` (a single sequence). Tokens that leave the local window, from the
        prompt or from the generation, move into memory (when the model has one) as the paper's update rule says:
        when the window is full, its older half is appended to memory and the rest is re-encoded.
        ``search_from``: the prompt's tokens before this position read the window alone (they search no memory, as
        if it were empty); the later ones and every generated token search ``memory``. With ``sampling.decline``, the
        model's probability of the decline is read right after the prompt (its tokens read in one pass, then cut
        from the window, and from ``memory``'s counts when it is a ``MemoryView``), and the generation is the decline
        when it is above ``sampling.decline_above``; ``trace`` (optional) is filled with what the generation saw."""
        sampling = sampling or Sampling()
        if search_from < 0:
            raise ValueError(f"search_from must be >= 0, got {search_from}")
        ids = as_ids(prompt, self.backbone.device)
        if ids.shape[0] != 1:
            raise ValueError("generate takes a single prompt")
        if ids.shape[1] == 0:
            raise ValueError("generate needs a prompt of at least one token")
        gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        keep = max(self.chunk_size, (self.segment_len // 2) // self.chunk_size * self.chunk_size)
        if ids.shape[1] > self.segment_len:  # the prompt's head goes to memory (or is dropped without one)
            head = ids.shape[1] - keep
            if memory is not None and self.uses_memory:
                self.memorize(ids[:, :head], memory)
            ids = ids[:, head:]
            search_from = max(0, search_from - head)
        window = Window()
        stops = sampling.backbone_stops and bool(sampling.stop_ids)
        decline, avoid = list(sampling.decline), False  # avoid: the decline's second token is banned after its first

        def mixed(hidden: torch.Tensor, reference: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
            """Next-token logits (T, V) from last states (1, T, E), and the frozen backbone's own (T, V) when they
            are in the mix or decide the stops (None otherwise)."""
            if reference is None or not (stops or sampling.side_weight < 1):
                return self.backbone.logits(hidden)[0], None
            if sampling.side_weight == 0:  # the backbone's own logits, exactly as the backbone alone computes them
                own = self.backbone.logits(reference)[0]
                return own, own
            dtype = self.backbone.dtype  # both states through the LM head at once: its weights are read once
            both = self.backbone.logits(torch.cat([hidden.to(dtype), reference.to(dtype)]))  # (2, T, V)
            logits, own = both[0], both[1]
            if sampling.side_weight < 1:
                w = sampling.side_weight
                logits = w * logits.float() + (1 - w) * own.float()
            return logits, own

        def choose(logits: torch.Tensor, own: torch.Tensor | None, before: list[int]) -> int:
            """The next token after ``before`` (the tokens made so far): where the backbone's own most likely one is
            a stop id that ends it (``backbone_stops``), else sampled from ``logits`` (V,)."""
            if stops and own is not None:
                ends = int(own.argmax())
                if ends in sampling.stop_ids:
                    return ends
            banned = repeats(before, sampling.no_repeat)
            if avoid and len(decline) > 1 and before == decline[:1]:
                banned = banned + [decline[1]]
            return _sample(logits, sampling, gen, banned)

        def prob(logits: torch.Tensor, tok: int) -> float:
            """``tok``'s probability under ``logits`` (V,), when a trace wants it."""
            return float(torch.softmax(logits.float(), dim=-1)[tok]) if trace is not None else 0.0

        def ends(step: Step) -> tuple[torch.Tensor, torch.Tensor | None]:
            """The next-token logits (V,) after ``step``'s last token, and the backbone's own (``mixed``)."""
            logits, own = mixed(step.hidden[:, -1:], None if step.reference is None else step.reference[:, -1:])
            return logits[-1], None if own is None else own[-1]

        def pick(end: tuple[torch.Tensor, torch.Tensor | None], before: list[int]) -> tuple[int, float]:
            tok = choose(end[0], end[1], before)
            return tok, prob(end[0], tok)

        def last(step: Step, before: list[int]) -> tuple[int, float]:
            return pick(ends(step), before)

        def decline_probs(first: torch.Tensor) -> list[float] | None:
            """The probability of each token of the decline after the prompt, ``first`` (V,) the logits after it, and
            those before it (None where the window cannot take the decline and be cut back after)."""
            if window.length + len(decline) > self.segment_len or not self.backbone.cache_can_drop(window.past):
                return None
            logp = [torch.log_softmax(first.float(), dim=-1)[decline[0]]]
            if len(decline) > 1:
                start = window.length
                ahead = self.step(torch.tensor([decline[:-1]], device=ids.device), memory, window)
                logits, _ = mixed(ahead.hidden, ahead.reference)  # (n - 1, V): the tokens after each decline token
                targets = torch.tensor(decline[1:], device=logits.device)[:, None]
                logp += list(torch.log_softmax(logits.float(), dim=-1).gather(-1, targets)[:, 0])
                window.crop(start)
                if isinstance(memory, MemoryView):
                    for found in ahead.chunk_ids:  # (B, H, n - 1, k) per memory layer
                        memory.forget(found)
            return [math.exp(float(x)) for x in logp]

        def confirm(tok: int) -> float | None:
            """The model's probability of the probe's ``yes`` against its ``no`` once the answer ended at ``tok``
            (chosen, not read; a stop id is left unread: the probe's ids end the turn in the template's own way),
            the probe read as the answer's next tokens, last (None where the window cannot take it); what its
            tokens retrieved is taken off ``memory``'s counts."""
            probe = sampling.probe
            new = ([] if tok in sampling.stop_ids else [tok]) + list(probe.ids)
            if window.length + len(new) > self.segment_len:  # read last: the cache need not be cut back
                return None
            step = self.step(torch.tensor([new], device=ids.device), memory, window)
            both = probe.yes + probe.no
            logits = self.backbone.token_logits(step.hidden[:, -1:], both)[0, -1]  # (Y + N,) float32
            if step.reference is not None and sampling.side_weight < 1:  # the same blend the answer was chosen from
                w = sampling.side_weight
                logits = w * logits + (1 - w) * self.backbone.token_logits(step.reference[:, -1:], both)[0, -1]
            if isinstance(memory, MemoryView):
                for found in step.chunk_ids:  # what the probe retrieved is not what the answer read
                    memory.forget(found)
            n = len(probe.yes)
            return float(torch.sigmoid(torch.logsumexp(logits[:n], 0) - torch.logsumexp(logits[n:], 0)))

        def read_ahead(tok: int, before: list[int]) -> list[tuple[int, float]]:
            """Read ``tok`` (chosen, not yet read; ``before`` ends with it) and decode ahead: the frozen backbone drafts
            up to ``sampling.draft`` tokens greedily, the model reads them in one pass and keeps the drafts it
            chooses itself. Returns the tokens after ``tok``: the drafts kept, then the model's own choice where it
            first differs from a draft (or the last draft), each with its probability; every token but the last is
            read."""
            start, passes, drafted, n_layers = window.length, [], [], self.backbone.spec.n_layers
            while True:
                new = torch.tensor([[drafted[-1] if drafted else tok]], device=ids.device)
                passes.append(self.backbone_pass(new, window))
                own = self.backbone.logits(passes[-1].hidden[n_layers])[0, -1]  # (V,) the backbone's own next token
                drafted.append(choose(own, own, before + drafted))
                if (len(drafted) == sampling.draft or drafted[-1] in sampling.stop_ids
                        or len(before) + len(drafted) >= sampling.max_new_tokens):
                    break
            step = self.read_passes(passes, memory, window)
            logits, own = mixed(step.hidden, step.reference)  # (T, V) each, T = len(passes)
            kept: list[int] = []
            probs: list[float] = []
            for i in range(len(passes)):  # position i reads token i of [tok] + drafted and chooses the one after it
                kept.append(choose(logits[i], own[i], before + kept))
                probs.append(prob(logits[i], kept[-1]))
                if kept[-1] != drafted[i] or kept[-1] in sampling.stop_ids:
                    break
            if len(kept) < len(passes):  # the drafts after the first differing one go, and what reading them found
                window.crop(start + len(kept))
                if isinstance(memory, MemoryView):
                    for found in step.chunk_ids:  # (B, H, T, n) per memory layer
                        memory.forget(found[:, :, len(kept):])
            return list(zip(kept, probs))

        split = min(search_from, ids.shape[1]) if memory is not None else 0
        unsearched = self.step(ids[:, :split], None, window) if split else None
        made: list[int] = []
        first = ends(self.step(ids[:, split:], memory, window) if split < ids.shape[1] else unsearched)
        if decline:
            each = decline_probs(first[0])
            sure = None if each is None else math.prod(each)
            if trace is not None:
                trace.decline = sure
            if sure is not None and sure > sampling.decline_above:  # sure enough: the reply is the decline
                if trace is not None:
                    trace.declined, trace.probs = True, each
                yield from decline
                return
            avoid = sure is not None
        pending = [pick(first, made)]
        draft = (self.drafts and sampling.draft > 0 and sampling.temperature <= 0 and sampling.side_weight < 1
                 and self.backbone.cache_can_drop(window.past))  # the same kind of cache after an overflow
        while pending:  # tokens chosen (with their probabilities), each read except the last
            tok, tok_p = pending.pop(0)
            made.append(tok)
            if trace is not None:
                trace.probs.append(tok_p)
            yield tok
            if tok in sampling.stop_ids or len(made) >= sampling.max_new_tokens:
                if sampling.probe is not None and trace is not None:
                    trace.confirm = confirm(tok)
                return
            if pending:
                continue
            new = torch.tensor([[tok]], device=ids.device)
            if window.length >= self.segment_len:
                n_out = window.length - keep + 1
                if memory is not None and window.mem_k is not None:  # the window was encoded from position 0
                    memory.add(window.mem_k[:, :, :n_out], window.mem_v[:, :, :n_out], tokens=window.ids[:, :n_out],
                               starts=segment_starts(1, n_out, ids.device))
                ids = torch.cat([window.ids[:, n_out:], new], dim=1)
                window = Window()
                pending = [last(self.step(ids, memory, window), made)]
            elif draft and window.length + sampling.draft <= self.segment_len:
                pending = read_ahead(tok, made)
            else:
                pending = [last(self.step(new, memory, window), made)]


def segment_starts(batch: int, length: int, device=None) -> torch.Tensor:
    """(batch, length) bool marking the first token of segments encoded from position 0: the attention sinks that
    ``Memory.add`` keeps out of most searches."""
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
    starts[:, :1] = True
    return starts


def repeats(made: list[int], n: int) -> list[int]:
    """The tokens that would repeat an ``n``-gram of ``made`` if they came next (none when ``n`` is 0)."""
    if n < 1 or len(made) < n:
        return []
    tail = made[len(made) - n + 1:]  # the n - 1 last tokens
    return [made[i + n - 1] for i in range(len(made) - n + 1) if made[i:i + n - 1] == tail]


def _sample(logits: torch.Tensor, s: Sampling, gen: torch.Generator | None, banned: list[int] = ()) -> int:
    logits = logits.float().cpu()
    if banned:
        logits[list(banned)] = float("-inf")
    if s.temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        cut = sorted_p.cumsum(0) - sorted_p > s.top_p  # drop tokens once the mass before them exceeds top_p
        sorted_p[cut] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen))
