"""Reading a shared context once: many continuations scored, or generated, after the same prefix.

Every suite asks one model many things after one context: the candidate openings of a ChapterBreak item after its
book prefix, the test sentences of an in-context-learning run after its k demonstrations, SQuAD questions after
theirs. ``Prefix.read`` runs the context once through the model's local window (a ``Window``: the backbone's KV cache
and the model's own layer caches); each continuation then continues a copy of that window. The numbers are those of
reading context + continuation in one pass (``tests/test_eval_core.py`` checks it), at a fraction of the cost.

Memory is read, never written: what a model remembers is set up before (``SegmentLM.memorize``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from longmem.memory.memory import Memory
from longmem.model.lm import SegmentLM, Window, as_ids


@dataclass
class Prefix:
    """A context read into a model's local window, ready to be continued (each continuation on its own copy)."""

    lm: SegmentLM
    memory: Memory | None
    window: Window
    last_hidden: torch.Tensor  # (1, 1, E) the state at the context's last token: it predicts what comes next

    @classmethod
    @torch.no_grad()
    def read(cls, lm: SegmentLM, context: Sequence[int] | torch.Tensor, memory: Memory | None = None) -> "Prefix":
        """Read ``context`` (a non-empty token sequence shorter than the model's window) with ``memory``."""
        ids = as_ids(context, lm.backbone.device)
        if ids.shape != (1, ids.shape[1]) or ids.shape[1] == 0:
            raise ValueError("a prefix is one non-empty token sequence")
        if ids.shape[1] >= lm.segment_len:
            raise ValueError(f"a {ids.shape[1]}-token prefix leaves no room in the {lm.segment_len}-token window")
        window = Window()
        hidden = lm.step(ids, memory, window).hidden
        return cls(lm, memory, window, hidden[:, -1:])

    @property
    def length(self) -> int:
        return self.window.length

    @property
    def room(self) -> int:
        """Tokens that can still follow in the local window."""
        return self.lm.segment_len - self.window.length

    @torch.no_grad()
    def next_logprobs(self) -> torch.Tensor:
        """(V,) log-probabilities of the token after the prefix."""
        return torch.log_softmax(self.lm.backbone.logits(self.last_hidden)[0, -1].float(), dim=-1)

    @torch.no_grad()
    def logprobs(self, continuation: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """(n,) log P of each token of ``continuation`` after the prefix (the prefix itself is unchanged)."""
        cont = as_ids(continuation, self.lm.backbone.device)
        n = cont.shape[1]
        if n == 0:
            return torch.zeros(0)
        if n > self.room:
            raise ValueError(f"a {n}-token continuation does not fit the {self.room} tokens left in the window")
        hidden = self.lm.step(cont, self.memory, copy.deepcopy(self.window)).hidden  # (1, n, E)
        before = torch.cat([self.last_hidden, hidden[:, :-1]], dim=1)  # the state before each token predicts it
        return self.lm.token_logprobs(before, cont)[0]

    @torch.no_grad()
    def extend(self, ids: Sequence[int] | torch.Tensor) -> "Prefix":
        """A new prefix: this one followed by ``ids`` (this one is unchanged)."""
        ext = as_ids(ids, self.lm.backbone.device)
        if ext.shape[1] == 0:
            return self
        if ext.shape[1] > self.room:
            raise ValueError(f"{ext.shape[1]} more tokens do not fit the {self.room} left in the window")
        window = copy.deepcopy(self.window)
        hidden = self.lm.step(ext, self.memory, window).hidden
        return Prefix(self.lm, self.memory, window, hidden[:, -1:])

    @torch.no_grad()
    def greedy(self, max_new_tokens: int, stop_ids: Sequence[int] = ()) -> list[int]:
        """Greedy continuation of at most ``max_new_tokens`` tokens (fewer when the window fills), stopping after a
        token of ``stop_ids``."""
        window, hidden, out = copy.deepcopy(self.window), self.last_hidden, []
        device = self.lm.backbone.device
        for _ in range(max_new_tokens):
            tok = int(self.lm.backbone.logits(hidden)[0, -1].argmax())
            out.append(tok)
            if tok in stop_ids or window.length >= self.lm.segment_len:
                break
            hidden = self.lm.step(torch.tensor([[tok]], device=device), self.memory, window).hidden[:, -1:]
        return out
