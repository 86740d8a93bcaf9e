"""The measurements every evaluation is made of, for any ``SegmentLM`` (LongMem, the backbone, MemTRM).

- ``perplexity``: summed NLL and token count of one long document read segment by segment, memory growing behind;
- ``recalled``: a recall item's (``longmem.eval.datasets.recall``) answer, greedy exact match and NLL, everything before
  the question's local window in memory;
- ``recall_summary`` / ``recall_record``: accuracy and answer NLL of many items, per kind of fact.
"""

from __future__ import annotations

import numpy as np
import torch

from longmem.eval.datasets.recall import RecallItem
from longmem.memory.memory import Memory
from longmem.model.lm import SegmentLM


@torch.no_grad()
def perplexity(lm: SegmentLM, ids: np.ndarray, use_memory: bool = True, capacity: int | None = None,
               progress=None) -> tuple[float, int]:
    """(summed NLL, predicted tokens) of one document, with a fresh memory of ``capacity`` tokens (None: unbounded)
    when the model has one (and ``use_memory``; without it LongMem shows what its SideNet does with the local window
    alone)."""
    memory = lm.new_memory(capacity=capacity) if lm.uses_memory and use_memory else None
    return lm.nll(torch.as_tensor(ids, dtype=torch.long), memory, progress)


def question_window(lm: SegmentLM, item: RecallItem, use_memory: bool) -> tuple[torch.Tensor, int, Memory | None]:
    """An item's question window (its last ``segment_len`` tokens), answer length, and a fresh unbounded memory
    holding everything before the window (None for a model without memory, or when not ``use_memory``)."""
    ids = torch.as_tensor(item.ids, dtype=torch.long)
    window = ids[-lm.segment_len:]
    n_ans = len(ids) - item.answer_start
    if n_ans >= len(window):
        raise ValueError(f"a {n_ans}-token answer does not fit a {len(window)}-token window with its question")
    memory = None
    if lm.uses_memory and use_memory:
        memory = lm.new_memory(capacity=None)
        if len(ids) > len(window):
            lm.memorize(ids[: len(ids) - len(window)], memory)
    return window, n_ans, memory


def answer_match(lm: SegmentLM, window: torch.Tensor, n_ans: int, memory) -> tuple[bool, float, int]:
    """Greedy exact match of the window's last ``n_ans`` tokens, their summed NLL and count."""
    hidden = lm.step(window[None], memory).hidden  # (1, T, E)
    logits = lm.backbone.logits(hidden[:, -n_ans - 1:-1]).float()  # predictions of the answer tokens
    answer = window[-n_ans:].to(logits.device)
    nll = -torch.log_softmax(logits[0], dim=-1).gather(-1, answer[:, None]).sum().item()
    return bool((logits.argmax(-1)[0] == answer).all()), nll, n_ans


@torch.no_grad()
def recalled(lm: SegmentLM, item: RecallItem, use_memory: bool = True) -> tuple[bool, float, int]:
    """Greedy exact match of the answer, and the answer tokens' summed NLL and count: the question's local window is
    the last ``segment_len`` tokens, everything before it goes into memory (or is out of reach, for a model
    without memory)."""
    return answer_match(lm, *question_window(lm, item, use_memory))


def recall_summary(results: list[tuple[bool, float, int]]) -> dict:
    """Exact-match accuracy and mean answer-token NLL of ``recalled`` results."""
    n_tok = sum(r[2] for r in results)
    return {"accuracy": float(np.mean([r[0] for r in results])) if results else float("nan"),
            "answer_nll": sum(r[1] for r in results) / n_tok if n_tok else float("nan"), "items": len(results)}


def recall_record(results: list[tuple[bool, float, int]], items: list[RecallItem]) -> dict:
    """``recall_summary`` of ``results`` (one per item) with the per-item matches and a summary per kind of fact."""
    by_kind = {kind: recall_summary([r for r, it in zip(results, items) if it.kind == kind])
               for kind in sorted({it.kind for it in items})}  # numbers, names
    return {**recall_summary(results), "recalled": [r[0] for r in results], "by_kind": by_kind}


