"""The in-RAM memory (the paper's cached memory): head-wise key/value chunks of past text, searched with faiss.

One memory holds ``batch_size`` independent rows (each row of a batch is its own document stream). Per row and per
key/value head, tokens are grouped into chunks of C = ``chunk_size`` consecutive tokens; a chunk is keyed by its
mean-pooled key in an exact inner-product faiss index. ``search`` returns, for every query token and query head, the
tokens of the top ``n_chunks`` chunks (flattened to K = n_chunks * C key/value pairs) and a validity mask. Query heads
map to key/value heads as in grouped-query attention (query head h reads KV head h // (Hq / Hkv)). ``select`` finds the
same chunks and returns them as a mask over every stored token instead, for masked dense attention over the whole
memory: one matrix product, where the per-query gather moves K key/value pairs for each query token and head.

Each row is a ``Row`` (``longmem.memory.rows``: its chunks, the tokens waiting to fill one, FIFO eviction); how a row
is searched, by faiss or by matrix product, exactly or approximately, is ``longmem.memory.search``; what a search
hands back (``Retrieved``, ``Selected``) and the view that counts it (``MemoryView``) are ``longmem.memory.view``.

Attention sinks. Every segment is encoded on its own, from position 0, so its first token is an attention sink whose
key scores high against almost every query. ``add`` is told which tokens began a forward pass (``starts``); the
chunks holding one are *sink chunks*, and at most ``max_sinks`` of them (default none) are returned among a query's
top chunks; the others' slots go to the next best chunks. Why: ``docs/design.md``.
"""

from __future__ import annotations

import torch

from longmem.memory.ranking import INDEX_BLOCK
from longmem.memory.rows import Row
from longmem.memory.search import StoredKeys, chunk_keys
from longmem.memory.view import Retrieved, Selected
from longmem.util.cpu import cpu_bf16_features

MAX_SINKS = 0  # default: sink chunks a query may retrieve (see the module doc for the measurement)


def _check_search_device(device: str | torch.device | None) -> torch.device | None:
    """The search device as stored: None for the CPU; a GPU that is not there is refused."""
    if device is None or torch.device(device).type == "cpu":
        return None
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"memory search on {device} was asked for, but this PyTorch has no CUDA device "
                           f"(torch {torch.__version__})")
    return device



class Memory:
    """The narrow memory interface passed into forward: ``add``, ``search`` (or ``select``), ``clear`` (plus a few
    read-outs)."""

    def __init__(self, n_kv_heads: int, head_dim: int, *, chunk_size: int = 4, capacity: int | None = 65536,
                 batch_size: int = 1, dtype: torch.dtype = torch.bfloat16,
                 search_device: str | torch.device | None = None, matmul: bool | None = None,
                 max_sinks: int | None = MAX_SINKS, mirror_dtype: torch.dtype | None = None,
                 native_bf16: bool | None = None):
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
        if capacity is not None and capacity < chunk_size:
            raise ValueError(f"capacity ({capacity} tokens) must hold at least one chunk of {chunk_size}")
        self.n_kv_heads, self.head_dim, self.chunk_size = n_kv_heads, head_dim, chunk_size
        if max_sinks is not None and max_sinks < 0:
            raise ValueError(f"max_sinks must be >= 0 or None, got {max_sinks}")
        self.capacity = capacity
        self.dtype = dtype
        self.max_sinks = max_sinks  # sink chunks allowed among a query's top chunks (None = no limit)
        self.search_device = _check_search_device(search_device)  # None: the CPU (see longmem.memory.search)
        if matmul is None:  # on a GPU; on a CPU for a bfloat16 memory where bfloat16 is native
            matmul = self.search_device is not None or (dtype == torch.bfloat16 and bool(cpu_bf16_features()))
        if self.search_device is not None and not matmul:
            raise ValueError(f"a memory searched on {self.search_device} searches by matrix product (matmul=True)")
        self.matmul = matmul
        if mirror_dtype is None:  # bfloat16 for a bfloat16 memory searched on the CPU (see longmem.memory.search)
            mirror_dtype = torch.bfloat16 if self.search_device is None and dtype == torch.bfloat16 else torch.float32
        if mirror_dtype not in (torch.bfloat16, torch.float32) or (self.search_device is not None
                                                                  and mirror_dtype != torch.float32):
            raise ValueError(f"a memory's search copy is float32, or bfloat16 on the CPU; got {mirror_dtype} "
                             f"searched on {self.search_device or 'cpu'}")
        self.mirror_dtype = mirror_dtype  # the dtype of a matmul search's copy of the chunk keys
        # whether this CPU multiplies bfloat16 natively (None: asked of it); where not, a bfloat16 mirror is
        # multiplied in float32 blocks (``upcast_product``)
        self.native_bf16 = bool(cpu_bf16_features()) if native_bf16 is None else native_bf16
        self.rows = [self._row() for _ in range(batch_size)]

    @classmethod
    def from_chunks(cls, k: torch.Tensor, v: torch.Tensor, tokens: torch.Tensor, indexes: list | None = None, *,
                    n: int | None = None, first_serial: int = 0, capacity: int | None = None,
                    search_device: str | torch.device | None = None, matmul: bool | None = None,
                    starts: torch.Tensor | None = None, max_sinks: int | None = MAX_SINKS,
                    mirror_dtype: torch.dtype | None = None, stored_keys: StoredKeys | None = None,
                    native_bf16: bool | None = None) -> "Memory":
        """A one-row memory that adopts keys/values already cut into chunks, without copying it: k, v (Hkv, N, C, d) and
        tokens (N, C) of which the first ``n`` (default N) are filled (the rest is room to grow), and optionally
        one faiss index per KV head holding the n mean-pooled chunk keys (built here when None) and which tokens
        began a forward pass, (N, C) bool (the sinks, see the module doc; None = none). Chunk serial numbers start at
        ``first_serial``. This is how a persistent bank is restored without the backbone. With ``stored_keys``
        instead of indexes, the memory holds no faiss index at all: it is searched by matrix product
        (``matmul``), its search copy made from those keys (and, past them, the chunks' own), as a memory whose
        indexes were released (``release_indexes``)."""
        hkv, room, chunk_size, d = k.shape
        n = room if n is None else n
        starts = torch.zeros(room, chunk_size, dtype=torch.bool) if starts is None else starts.to(torch.bool)
        if (v.shape != k.shape or v.dtype != k.dtype or tuple(tokens.shape) != (room, chunk_size) or not 0 <= n <= room
                or tuple(starts.shape) != (room, chunk_size)):
            raise ValueError(f"chunks do not line up: k {tuple(k.shape)}, v {tuple(v.shape)}, "
                             f"tokens {tuple(tokens.shape)}, starts {tuple(starts.shape)}")
        if stored_keys is not None and (indexes is not None or matmul is False):
            raise ValueError("a memory made from stored chunk keys holds no faiss index and searches by matrix "
                             "product: give no indexes, and matmul True or None")
        if stored_keys is not None and (len(stored_keys.keys) != hkv
                                        or any(x.shape[0] > n or x.shape[1] != d for x in stored_keys.keys)):
            raise ValueError(f"expected stored keys of at most {n} chunks of dimension {d} for {hkv} heads, got "
                             f"{[tuple(x.shape) for x in stored_keys.keys]}")
        memory = cls(hkv, d, chunk_size=chunk_size, capacity=None, batch_size=1, dtype=k.dtype,
                     search_device=search_device, matmul=True if stored_keys is not None else matmul,
                     max_sinks=max_sinks, mirror_dtype=mirror_dtype, native_bf16=native_bf16)
        row = memory.rows[0]
        if stored_keys is not None:
            row.indexes, row.release, row.stored = None, True, stored_keys
        elif indexes is None:
            for s in range(0, n, INDEX_BLOCK):  # in blocks: the float32 mean of all keys at once could be large
                keys = chunk_keys(k[:, s:min(s + INDEX_BLOCK, n)])
                for j, index in enumerate(row.indexes):
                    index.add(keys[j])
        else:
            if len(indexes) != hkv or any(ix.ntotal != n or ix.d != d for ix in indexes):
                raise ValueError(f"expected {hkv} indexes of {n} keys of dimension {d}, got "
                                 f"{[(ix.ntotal, ix.d) for ix in indexes]}")
            row.indexes = list(indexes)
        row.k, row.v, row.tokens, row.starts, row.n, row.evicted = k, v, tokens.to(torch.int64), starts, n, first_serial
        memory.capacity = capacity
        if capacity is not None and n * chunk_size > capacity:
            row.evict(n - capacity // chunk_size)
        return memory

    def _row(self) -> Row:
        return Row(self.n_kv_heads, self.head_dim, self.chunk_size, self.dtype, self.search_device, self.matmul,
                    self.mirror_dtype, upcast=not self.native_bf16)

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    def __len__(self) -> int:
        """Tokens searchable in row 0 (all rows of a single-document memory)."""
        return self.rows[0].n * self.chunk_size

    def sizes(self) -> list[int]:
        """Searchable tokens per row."""
        return [r.n * self.chunk_size for r in self.rows]

    def add(self, keys: torch.Tensor, values: torch.Tensor, tokens: torch.Tensor | None = None,
            starts: torch.Tensor | None = None) -> None:
        """Append keys/values (B, Hkv, T, d) of T new tokens per row (and their ids (B, T)), evicting FIFO.
        ``starts`` (B, T) bool marks the tokens that began a forward pass, the attention sinks (None = none)."""
        B, hkv, T, d = keys.shape
        if B != self.batch_size or hkv != self.n_kv_heads or d != self.head_dim:
            raise ValueError(f"memory expects (B={self.batch_size}, Hkv={self.n_kv_heads}, T, d={self.head_dim}), "
                             f"got {tuple(keys.shape)}")
        if tokens is None:
            tokens = torch.full((B, T), -1, dtype=torch.int64)
        if starts is None:
            starts = torch.zeros(B, T, dtype=torch.bool)
        for b, row in enumerate(self.rows):
            row.add(keys[b], values[b], tokens[b], starts[b])
            if self.capacity is not None and row.n * self.chunk_size > self.capacity:
                row.evict(row.n - self.capacity // self.chunk_size)

    def _group(self, queries: torch.Tensor) -> int:
        B, hq, T, d = queries.shape
        if B != self.batch_size or hq % self.n_kv_heads or d != self.head_dim:
            raise ValueError(f"queries {tuple(queries.shape)} do not fit memory with B={self.batch_size}, "
                             f"Hkv={self.n_kv_heads}, d={self.head_dim}")
        return hq // self.n_kv_heads

    @staticmethod
    def _join(parts: list[tuple], device) -> list[torch.Tensor]:
        join = (lambda t: t[0].unsqueeze(0)) if len(parts) == 1 else torch.stack  # one row: no copy of the K/V
        return [join(t).to(device) for t in zip(*parts)]

    @torch.no_grad()
    def search(self, queries: torch.Tensor, n_chunks: int) -> Retrieved:
        """Top ``n_chunks`` chunks per query token and head for queries (B, Hq, T, d), by inner product: their
        keys and values gathered per query."""
        group = self._group(queries)
        B, hq, T, d = queries.shape
        # gathered straight into the batch's tensors: stacking per-row results copied every K/V twice
        keys, values = (torch.empty(B, hq, T, n_chunks * self.chunk_size, d, dtype=self.dtype) for _ in range(2))
        parts = [row.search(queries[b], n_chunks, group, self.max_sinks, keys[b], values[b])
                 for b, row in enumerate(self.rows)]
        mask, ids = self._join(parts, queries.device)
        return Retrieved(keys=keys.to(queries.device), values=values.to(queries.device), mask=mask, chunk_ids=ids)

    @torch.no_grad()
    def select(self, queries: torch.Tensor, n_chunks: int) -> Selected:
        """The same top chunks as ``search``, returned as a mask over all stored tokens (nothing gathered)."""
        group = self._group(queries)
        n_max = max(r.n for r in self.rows)
        parts = [row.select(queries[b], n_chunks, group, self.max_sinks, n_max) for b, row in enumerate(self.rows)]
        keys, values, mask, ids = self._join(parts, queries.device)
        return Selected(keys=keys, values=values, mask=mask, chunk_ids=ids)

    def truncate(self, n_tokens: int) -> None:
        """Forget what a one-row memory took in after it held ``n_tokens`` searchable tokens (and any partial chunk):
        undoes later ``add`` calls, e.g. a text added for one question only. No-op when it holds no more."""
        if self.batch_size != 1:
            raise ValueError("only a one-row memory can be truncated")
        if n_tokens % self.chunk_size:
            raise ValueError(f"{n_tokens} tokens is not a whole number of {self.chunk_size}-token chunks")
        r = self.rows[0]
        r.truncate(n_tokens // self.chunk_size)
        r.pend_k, r.pend_v = r.pend_k[:, :0], r.pend_v[:, :0]
        r.pend_t, r.pend_s = r.pend_t[:0], r.pend_s[:0]

    def clear(self, rows: list[int] | None = None) -> None:
        """Forget everything (or only the given rows, e.g. where a new document starts)."""
        for b in range(self.batch_size) if rows is None else rows:
            approx, release = self.rows[b].approx, self.rows[b].release
            self.rows[b] = self._row()
            self.rows[b].approx, self.rows[b].release = approx, release

    def approximate(self, min_chunks: int | None, probes: int | None = None) -> "Memory":
        """Search approximately (see ``longmem.memory.search``) in rows holding at least ``min_chunks`` chunks,
        comparing each query with ``probes`` IVF lists (None: the default share); ``min_chunks=None``: exactly again.
        The IVF copies are made from the chunks' own keys, so a memory without exact faiss indexes (released, or made
        from stored keys) searches approximately too; below ``min_chunks`` it searches as before. Returns self."""
        if min_chunks is not None and (min_chunks < 1 or (probes is not None and probes < 1)):
            raise ValueError(f"approximate search needs min_chunks >= 1 and probes >= 1, got {min_chunks}, {probes}")
        for r in self.rows:
            r.approx, r.coarse, r.coarse_n = (None if min_chunks is None else (min_chunks, probes)), None, 0
        return self

    def release_indexes(self) -> "Memory":
        """For a memory searched by matrix product (``matmul``): free its exact faiss indexes (float32 chunk keys,
        twice the search copy's bytes in bfloat16) once the search copy is built, at the next search. From then on the
        copy alone is searched, a bfloat16 copy's candidates are scored again from their own keys (the same float32
        means, ``chunk_keys``), and adds go to the copy (and to the IVF copies of ``approximate`` search, which need
        no exact index). The results are the same. Returns self."""
        if not all(r.matmul for r in self.rows):
            raise ValueError("only a memory searched by matrix product can release its faiss indexes")
        for r in self.rows:
            r.release = True
        return self

    def rechunk(self, chunk_size: int) -> "Memory":
        """The same one-row memory cut into smaller chunks (``chunk_size`` divides this memory's chunk size): the K/V
        are shared, not copied; only the chunk keys are re-pooled and indexed. Finer chunks retrieve more precisely
        (the paper uses chunk size 2 for classification demonstrations with a model trained at 4). Chunk serial s
        here is serial ``s // (self.chunk_size // chunk_size)`` of this memory."""
        if self.batch_size != 1:
            raise ValueError("only a one-row memory can be re-chunked")
        if chunk_size < 1 or self.chunk_size % chunk_size:
            raise ValueError(f"chunk size {chunk_size} must divide this memory's chunk size {self.chunk_size}")
        if chunk_size == self.chunk_size:
            return self
        r, f = self.rows[0], self.chunk_size // chunk_size
        k = r.k[:, : r.n].reshape(self.n_kv_heads, r.n * f, chunk_size, self.head_dim)  # a view: (Hkv, n*f, C', d)
        v = r.v[:, : r.n].reshape(self.n_kv_heads, r.n * f, chunk_size, self.head_dim)
        tokens = r.tokens[: r.n].reshape(r.n * f, chunk_size)
        starts = r.starts[: r.n].reshape(r.n * f, chunk_size)
        out = Memory.from_chunks(k, v, tokens, first_serial=r.evicted * f, capacity=self.capacity,
                                 search_device=self.search_device, matmul=self.matmul, starts=starts,
                                 max_sinks=self.max_sinks, mirror_dtype=self.mirror_dtype,
                                 native_bf16=self.native_bf16)
        if r.pend_t.numel():  # an unfinished chunk of the coarse memory may already fill finer chunks
            out.add(r.pend_k[None], r.pend_v[None], r.pend_t[None], r.pend_s[None])
        if r.approx is not None:
            out.approximate(*r.approx)
        return out

    def tail_tokens(self, n: int, row: int = 0) -> torch.Tensor:
        """The last ``n`` token ids stored in ``row`` (its chunks' tokens in order, then the unfinished chunk), as
        (T,) with T <= n; ids that were not given (-1) are left out."""
        r = self.rows[row]
        take = -(-n // self.chunk_size)
        ids = torch.cat([r.tokens[max(0, r.n - take): r.n].reshape(-1), r.pend_t])
        return ids[ids >= 0][-n:]

    def chunk_tokens(self, row: int, serial: int) -> torch.Tensor:
        """Token ids (chunk_size,) of a stored chunk by its serial number (-1 entries when ids were not given)."""
        r = self.rows[row]
        pos = serial - r.evicted
        if not 0 <= pos < r.n:
            raise KeyError(f"chunk {serial} is not in row {row} (evicted or never stored)")
        return r.tokens[pos].clone()
