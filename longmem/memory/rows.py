"""One row of a memory (``Row``): one stream's chunks of keys, values, token ids and sink flags, the pending partial
chunk, FIFO eviction and truncation, and what a search of the row hands back (its chunks' keys and values gathered
per query, ``search``, or a mask over all its tokens, ``select``). How the row finds its best chunks is its base,
``RowSearch`` (``longmem.memory.search``).

Tokens that do not fill a chunk wait in a small pending buffer and become searchable once the chunk is full.
With a ``capacity`` (M tokens, the paper's FIFO queue) the oldest chunks are evicted first.
"""

from __future__ import annotations

import faiss
import torch

from longmem.memory.search import RowSearch, StoredKeys, chunk_keys


class Row(RowSearch):
    """Memory of one stream: the chunk key/value tensors and, per KV head, what searches their chunk keys (a faiss
    index, a search copy, or both; stored keys until the copy is made), aligned by position."""

    def __init__(self, n_kv_heads: int, head_dim: int, chunk_size: int, dtype: torch.dtype,
                 search_device: torch.device | None, matmul: bool, mirror_dtype: torch.dtype, upcast: bool):
        self.hkv, self.d, self.chunk_size, self.dtype = n_kv_heads, head_dim, chunk_size, dtype
        self.search_device = search_device  # where a matmul search runs (None: the CPU)
        self.matmul = matmul  # search by matrix product over ``mirror`` (else faiss)
        self.mirror_dtype = mirror_dtype  # bfloat16 (then re-ranked exactly) or float32 (exact)
        self.upcast = upcast  # a bfloat16 mirror is multiplied in float32 blocks (bfloat16 not native here)
        self.mirror: torch.Tensor | None = None  # (Hkv, room, d) chunk keys on search_device, the first mirror_n
        #                                          filled (mirror_n <= n: the rest is added at the next search; None:
        #                                          built then)
        self.mirror_n = 0
        self.center: torch.Tensor | None = None  # (Hkv, 1, d) float32 subtracted from a bfloat16 mirror's keys
        self.indexes: list | None = [self._new_index() for _ in range(n_kv_heads)]  # None: released (``release``)
        self.release = False  # free the exact indexes once the search copy is built (``Memory.release_indexes``)
        self.stored: StoredKeys | None = None  # where the search copy's first keys are read (no indexes held)
        self.k = torch.empty(n_kv_heads, 0, chunk_size, head_dim, dtype=dtype)  # (Hkv, capacity, C, d)
        self.v = torch.empty_like(self.k)
        self.tokens = torch.empty(0, chunk_size, dtype=torch.int64)  # (capacity, C), -1 when unknown
        self.starts = torch.empty(0, chunk_size, dtype=torch.bool)  # (capacity, C) token began a forward pass (a sink)
        self.n = 0  # chunks stored
        self.evicted = 0  # chunks evicted since the last clear (chunk serial = evicted + position)
        self.pend_k = torch.empty(n_kv_heads, 0, head_dim, dtype=dtype)  # (Hkv, <C, d) partial chunk
        self.pend_v = torch.empty_like(self.pend_k)
        self.pend_t = torch.empty(0, dtype=torch.int64)
        self.pend_s = torch.empty(0, dtype=torch.bool)
        self.approx: tuple[int, int | None] | None = None  # (min_chunks, probes) of approximate search, or exact
        self.coarse: list | None = None  # the IVF copies, per KV head, of the first ``coarse_n`` chunk keys
        self.coarse_n = 0
        self._sinks = (0, torch.empty(0, dtype=torch.int64))  # (chunks seen, their sink chunks' positions)

    def _new_index(self):
        return faiss.IndexFlatIP(self.d)

    def _reserve(self, n_total: int):
        cap = self.k.shape[1]
        if n_total <= cap:
            return
        new = max(n_total, cap + cap // 4, 64)  # grow by 1/4: a memory restored from a bank may already hold GBs
        k = self.k.new_empty(self.hkv, new, self.chunk_size, self.d)
        v = self.v.new_empty(self.hkv, new, self.chunk_size, self.d)
        k[:, :cap], v[:, :cap] = self.k, self.v
        tok = self.tokens.new_full((new, self.chunk_size), -1)
        tok[:cap] = self.tokens
        starts = self.starts.new_zeros(new, self.chunk_size)
        starts[:cap] = self.starts
        self.k, self.v, self.tokens, self.starts = k, v, tok, starts

    def add(self, k: torch.Tensor, v: torch.Tensor, tokens: torch.Tensor, starts: torch.Tensor) -> None:
        """k, v (Hkv, T, d); tokens (T,); starts (T,) bool, True where a token began a forward pass."""
        k = torch.cat([self.pend_k, k.to("cpu", self.dtype)], dim=1)
        v = torch.cat([self.pend_v, v.to("cpu", self.dtype)], dim=1)
        tokens = torch.cat([self.pend_t, tokens.to("cpu", torch.int64)])
        starts = torch.cat([self.pend_s, starts.to("cpu", torch.bool)])
        full = (k.shape[1] // self.chunk_size) * self.chunk_size
        self.pend_k, self.pend_v, self.pend_t = k[:, full:].clone(), v[:, full:].clone(), tokens[full:].clone()
        self.pend_s = starts[full:].clone()
        nc = full // self.chunk_size
        if nc == 0:
            return
        ck = k[:, :full].reshape(self.hkv, nc, self.chunk_size, self.d)
        cv = v[:, :full].reshape(self.hkv, nc, self.chunk_size, self.d)
        self._reserve(self.n + nc)
        self.k[:, self.n:self.n + nc] = ck
        self.v[:, self.n:self.n + nc] = cv
        self.tokens[self.n:self.n + nc] = tokens[:full].view(nc, self.chunk_size)
        self.starts[self.n:self.n + nc] = starts[:full].view(nc, self.chunk_size)
        if self.indexes is not None:
            keys = chunk_keys(ck)  # (Hkv, nc, d)
            for j, index in enumerate(self.indexes):
                index.add(keys[j])
        self.n += nc

    def evict(self, n_chunks: int) -> None:
        """Drop the oldest ``n_chunks`` chunks (FIFO)."""
        e = min(n_chunks, self.n)
        if e <= 0:
            return
        for index in self.indexes or []:
            index.remove_ids(faiss.IDSelectorRange(0, e))
        keep = self.n - e
        self.k[:, :keep] = self.k[:, e:self.n].clone()
        self.v[:, :keep] = self.v[:, e:self.n].clone()
        self.tokens[:keep] = self.tokens[e:self.n].clone()
        self.starts[:keep] = self.starts[e:self.n].clone()
        self.n = keep
        self.evicted += e
        self._sinks = (0, self._sinks[1][:0])  # positions moved: found again at the next search
        self.coarse = None  # positions moved: built again at the next search
        if self.stored is not None:
            self.stored = StoredKeys([keys[e:] for keys in self.stored.keys], self.stored.owner)
        if self.mirror is not None:
            self.mirror_n = max(0, self.mirror_n - e)
            self.mirror = self.mirror[:, e:e + self.mirror_n].clone() if self.mirror_n else None

    def truncate(self, keep: int) -> None:
        """Forget the chunks from position ``keep`` on (the exact indexes and the IVF copies alike)."""
        if keep >= self.n:
            return
        for index in self.indexes or []:
            index.remove_ids(faiss.IDSelectorRange(keep, self.n))
        self.mirror_n = min(self.mirror_n, keep)  # the mirror keeps its room: the next add writes over the tail
        if self.stored is not None:
            self.stored = StoredKeys([keys[:keep] for keys in self.stored.keys], self.stored.owner)
        if self.coarse is not None and self.coarse_n > keep:
            for index in self.coarse:  # the tail's ids go; later adds are numbered from ``keep`` again
                index.remove_ids(faiss.IDSelectorRange(keep, self.coarse_n))
            self.coarse_n = keep
        self.n = keep

    def sink_positions(self) -> torch.Tensor:
        """The positions (s,) int64, in order, of the sink chunks among the ``n`` stored: found once, then only among
        the chunks added since (a search used to look through every chunk's tokens)."""
        seen, ids = self._sinks
        if seen > self.n:  # truncated
            seen, ids = self.n, ids[ids < self.n]
        if seen < self.n:
            new = torch.nonzero(self.starts[seen:self.n].any(dim=1)).flatten() + seen
            ids = torch.cat([ids, new])
        self._sinks = (self.n, ids)
        return ids

    def serials(self, ids: torch.Tensor) -> torch.Tensor:
        """Chunk serial numbers since the last clear of positions ``ids`` (-1 stays -1)."""
        return torch.where(ids >= 0, ids + self.evicted, torch.full_like(ids, -1))

    def search(self, q: torch.Tensor, n_chunks: int, group: int, max_sinks: int | None, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (Hq, T, d) -> mask (Hq, T, K), ids (Hq, T, n_chunks); the chunks' keys and values are gathered into
        ``keys``, ``values``: contiguous (Hq, T, K, d) tensors of this row's dtype (a batch's slices, no copy)."""
        hq, T, d = q.shape
        K = n_chunks * self.chunk_size
        ids_t = self.top_chunks(q, n_chunks, group, max_sinks)
        valid = ids_t >= 0  # (Hq, T, n)
        if self.n > 0:  # per KV head, its query heads' chunks in one index_select (self.k may be a strided view)
            safe = ids_t.clamp(min=0)
            for j in range(self.hkv):
                heads = slice(j * group, (j + 1) * group)
                pos = safe[heads].reshape(-1)  # (group * T * n,)
                torch.index_select(self.k[j], 0, pos, out=keys[heads].view(-1, self.chunk_size, d))
                torch.index_select(self.v[j], 0, pos, out=values[heads].view(-1, self.chunk_size, d))
        else:
            keys.zero_()
            values.zero_()
        mask = valid[..., None].expand(hq, T, n_chunks, self.chunk_size).reshape(hq, T, K)
        return mask, self.serials(ids_t)

    def select(self, q: torch.Tensor, n_chunks: int, group: int, max_sinks: int | None, n_max: int):
        """q (Hq, T, d) -> keys, values (Hkv, n_max * chunk_size, d) (views when n_max is this row's size), token mask
        (Hq, T, n_max * chunk_size), ids (Hq, T, n_chunks)."""
        hq, T, _ = q.shape
        ids = self.top_chunks(q, n_chunks, group, max_sinks)
        chosen = torch.zeros(hq, T, n_max + 1, dtype=torch.bool)  # the last column takes the -1s
        chosen.scatter_(2, torch.where(ids >= 0, ids, n_max), True)
        mask = chosen[..., :n_max, None].expand(hq, T, n_max, self.chunk_size).reshape(hq, T, n_max * self.chunk_size)
        keys, values = self.k[:, :self.n], self.v[:, :self.n]  # (Hkv, n, C, d)
        if n_max > self.n:  # a fuller row in the same batch: pad with never-selected zeros
            keys = torch.cat([keys, keys.new_zeros(self.hkv, n_max - self.n, self.chunk_size, self.d)], dim=1)
            values = torch.cat([values, values.new_zeros(self.hkv, n_max - self.n, self.chunk_size, self.d)], dim=1)
        tokens = n_max * self.chunk_size
        return keys.reshape(self.hkv, tokens, self.d), values.reshape(self.hkv, tokens, self.d), mask, \
            self.serials(ids)
