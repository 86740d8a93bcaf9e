"""How a memory search ranks chunks (``longmem.memory.search``): the two-step top-k of a matrix-product search
(``topk_blocked``), the limit on sink chunks among a faiss search's results (``limit_sinks``) and the inverted-file
index of approximate search (``ivf_index``)."""

from __future__ import annotations

import faiss
import numpy as np
import torch

INDEX_BLOCK = 65536  # chunks per faiss add when building an index from stored keys
TOPK_BLOCK = 128  # columns per block of a matmul search's two-step top-k (``topk_blocked``)


def topk_blocked(scores: torch.Tensor, m: int, block: int = TOPK_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``m`` largest of ``scores`` (..., n) along the last dimension and their columns, best first: what
    ``torch.topk`` finds, in two small steps where it would sort through every column. The columns are cut into
    blocks of ``block``; the ``m`` largest scores lie in the ``m`` blocks whose maxima are largest (a block holding one
    of them has a maximum at least that large, and fewer than ``m`` blocks can have a larger one), so those blocks'
    columns are ranked alone. Equal scores may come in another order than ``torch.topk``'s."""
    n = scores.shape[-1]
    n_blocks = -(-n // block)
    if n_blocks <= 4 * m:  # too few blocks to gain anything
        return torch.topk(scores, m, dim=-1)
    full = (n // block) * block
    maxima = scores[..., :full].unflatten(-1, (n // block, block)).amax(dim=-1)  # (..., n // block)
    if full < n:  # the last, shorter block
        maxima = torch.cat([maxima, scores[..., full:].amax(dim=-1, keepdim=True)], dim=-1)
    blocks = torch.topk(maxima, m, dim=-1).indices  # (..., m)
    cols = (blocks[..., None] * block + torch.arange(block, device=scores.device)).flatten(-2)  # (..., m * block)
    cand = scores.gather(-1, cols.clamp(max=n - 1)).masked_fill_(cols >= n, float("-inf"))
    values, at = torch.topk(cand, m, dim=-1)
    return values, cols.gather(-1, at)


def limit_sinks(found: np.ndarray, sink: np.ndarray, max_sinks: int) -> np.ndarray:
    """Per row of ``found`` (chunk ids, best first, -1 = none), drop the sink chunks after the first ``max_sinks``,
    keeping the order of the rest; dropped places move to the end as -1."""
    is_sink = np.where(found >= 0, sink[np.clip(found, 0, None)], False)
    drop = is_sink & (np.cumsum(is_sink, axis=1) > max_sinks)
    order = np.argsort(drop, axis=1, kind="stable")  # kept ids first, in their order
    return np.where(np.take_along_axis(drop, order, axis=1), -1, np.take_along_axis(found, order, axis=1))


def ivf_index(keys: np.ndarray, probes: int | None) -> faiss.IndexIVFFlat:
    """An inverted-file inner-product index over ``keys`` (n, d): ~2 sqrt(n) lists (fewer for a small n, so that
    each is trained on 40 keys or more), trained on at most 48 keys per list (a fixed sample), searching ``probes``
    lists per query (None: a sixteenth of them, at least 8)."""
    n, d = keys.shape
    nlist = int(np.clip(min(2 * np.sqrt(n), n // 40), 1, 4096))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    sample = np.random.default_rng(0).choice(n, min(n, 48 * nlist), replace=False)
    index.train(np.ascontiguousarray(keys[np.sort(sample)]))
    for s in range(0, n, INDEX_BLOCK):
        index.add(np.ascontiguousarray(keys[s:s + INDEX_BLOCK]))
    index.nprobe = min(nlist, probes if probes is not None else max(8, nlist // 16))
    return index
