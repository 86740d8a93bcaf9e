"""The in-RAM memory (the paper's cached memory): head-wise key/value chunks of past text, searched with faiss.

One memory holds ``batch_size`` independent rows (each row of a batch is its own document stream). Per row and per
key/value head, tokens are grouped into chunks of C = ``chunk_size`` consecutive tokens; a chunk is keyed by its
mean-pooled key in an exact inner-product faiss index. ``search`` returns, for every query token and query head, the
tokens of the top ``n_chunks`` chunks (flattened to K = n_chunks * C key/value pairs) and a validity mask. Query heads
map to key/value heads as in grouped-query attention (query head h reads KV head h // (Hq / Hkv)). ``select`` finds the
same chunks and returns them as a mask over every stored token instead, for masked dense attention over the whole
memory: one matrix product, where the per-query gather moves K key/value pairs for each query token and head.

Approximate search (``Memory.approximate``, off unless asked): once a row holds ``min_chunks`` chunks, a search on
CPU reads an inverted-file (IVF) copy of its chunk keys per KV head instead of the exact index: the keys clustered
into about 2 * sqrt(n) lists, and each query compares only the lists nearest it (``probes`` of them). Ids stay chunk
positions; the copy follows the row's adds and truncations and is built again after an eviction.

Search by matrix product (``matmul``), the same results as the faiss index's: the chunk keys are mirrored as one
tensor per KV head and a search is one batched product and a top-k. On a GPU (``search_device``: the model's device,
the CPU meaning none) the mirror is float32 there and its scores are exact. On a CPU that multiplies
bfloat16 natively, for a bfloat16 memory (the default there, ``matmul=None``), the mirror is bfloat16: half the
bytes a search reads, which is what an exact search over a large memory costs on a CPU; the candidates its rounded
scores rank first (``RESCORED`` more than asked) are ranked again by their exact float32 scores, computed from the
stored keys as the index's are. Elsewhere faiss searches, unless a matrix product is asked for (``matmul=True``):
how a large bank's memory is searched on every CPU (faster than faiss's flat search for a search's several query
rows, ``docs/design.md``). Where bfloat16 is not native (``native_bf16``), a bfloat16 mirror is multiplied in float32,
``UPCAST_BLOCK`` keys at a time: half the RAM of a float32 mirror, as fast, and re-ranked as above. The faiss
indexes are kept in step, unless released (``release_indexes``) or never held (``StoredKeys``: a large bank's chunk
keys read where its index files lie). (faiss's own GPU build is not used: its PyPI wheel is built for another CUDA
than PyTorch's, see ``docs/design.md``.) The keys and values stay in host RAM; what a search retrieves is gathered
there and moved to the device.

Tokens that do not fill a chunk wait in a small pending buffer and become searchable once the chunk is full.
With a ``capacity`` (M tokens, the paper's FIFO queue) the oldest chunks are evicted first.

Attention sinks. Every segment is encoded on its own, from position 0, so its first token is an attention sink whose
key scores high against almost every query. ``add`` is told which tokens began a forward pass (``starts``); the
chunks holding one are *sink chunks*, and at most ``max_sinks`` of them (default none) are returned among a query's
top chunks; the others' slots go to the next best chunks. Why: ``docs/design.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np
import torch

from longmem.memory.ranking import INDEX_BLOCK, ivf_index, limit_sinks, topk_blocked
from longmem.util.cpu import cpu_bf16_features

MAX_SINKS = 0  # default: sink chunks a query may retrieve (see the module doc for the measurement)
RESCORED = 64  # a bfloat16 matmul search ranks this many more candidates than asked again by exact scores
QUERY_BLOCK = 64  # query rows per KV head scored at once by a matmul search (bounds its (rows, chunks) scores)
UPCAST_BLOCK = 16384  # keys of a bfloat16 mirror made float32 at once where bfloat16 is not native (4 MB at d 64)


@dataclass
class Retrieved:
    keys: torch.Tensor  # (B, Hq, T, K, d), K = n_chunks * C
    values: torch.Tensor  # (B, Hq, T, K, d)
    mask: torch.Tensor  # (B, Hq, T, K) bool, False where nothing was found
    chunk_ids: torch.Tensor  # (B, Hq, T, n_chunks) int64 serial number of the chunk since the last clear, -1 if none


@dataclass
class Selected:
    """All of a memory's tokens, with the ones each query retrieved marked: what masked dense attention over the
    whole memory reads (cheaper than a per-query gather while memory holds no more than ~16x K tokens)."""

    keys: torch.Tensor  # (B, Hkv, N, d), N = tokens of the fullest row (other rows padded, never selected)
    values: torch.Tensor  # (B, Hkv, N, d)
    mask: torch.Tensor  # (B, Hq, T, N) bool, True on the tokens of the query's top chunks
    chunk_ids: torch.Tensor  # (B, Hq, T, n_chunks) as in Retrieved


def upcast_product(rows: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` (b, n) float32 = ``rows`` (b, d) float32 @ ``keys`` (n, d) bfloat16 ``.T`` in float32, ``UPCAST_BLOCK``
    keys at a time (each block made float32 in one small buffer, reused across the call's blocks): what a CPU without
    native bfloat16 multiplies as fast as a float32 copy of the keys while reading half the bytes (``docs/design.md``);
    PyTorch's own bfloat16 product is emulated there, several times slower."""
    n, d = keys.shape
    block = torch.empty(min(UPCAST_BLOCK, n), d)
    for s in range(0, n, UPCAST_BLOCK):
        part = block[:min(UPCAST_BLOCK, n - s)]
        part.copy_(keys[s:s + part.shape[0]])
        torch.mm(rows, part.T, out=out[:, s:s + part.shape[0]])


class StoredKeys:
    """Chunk keys as a bank's index files hold them, read where they lie (mapped), for a memory that holds no faiss
    index of its own (``Memory.from_chunks(..., stored_keys=)``): per KV head the float32 mean-pooled keys of the
    memory's first chunks, ``keys[j]`` (n_j, d), n_j <= the chunks adopted (the rest are pooled from the chunks'
    own keys). ``owner`` keeps the mapping alive while the views are read (the mapped faiss indexes themselves: such
    an index must never be added to or have ids removed, which faiss refuses by aborting the process); the memory
    drops both once its search copy is built."""

    def __init__(self, keys: list[torch.Tensor], owner: object = None):
        if any(k.dtype != torch.float32 or k.dim() != 2 for k in keys):
            raise ValueError(f"stored chunk keys are (n, d) float32 per head, got "
                             f"{[(tuple(k.shape), k.dtype) for k in keys]}")
        self.keys, self.owner = keys, owner


class MemoryView:
    """A read-through view of a memory, passed into forward in its place: it counts which chunks were
    retrieved (to show a reader the chunks behind an answer) and can set how many chunks each query gets.
    Everything else (``add``, ``chunk_size``, ``len``...) is the memory's."""

    def __init__(self, memory: "Memory", n_chunks: int | None = None):
        self.memory = memory
        self.n_chunks = n_chunks  # chunks per query token and head; None = what the model asks for
        self.hits: dict[int, int] = {}  # chunk serial (row 0) -> times retrieved, over all heads and tokens

    def search(self, queries: torch.Tensor, n_chunks: int) -> Retrieved:
        return self._count(self.memory.search(queries, self.n_chunks or n_chunks))

    def select(self, queries: torch.Tensor, n_chunks: int) -> Selected:
        return self._count(self.memory.select(queries, self.n_chunks or n_chunks))

    def _count(self, found):
        self._tally(found.chunk_ids, 1)
        return found

    def forget(self, chunk_ids: torch.Tensor) -> None:
        """Uncount what a search returned as ``chunk_ids`` (B, H, T, n) (a part of it: the tokens a decode read and
        then dropped), so the counts are those of the searches kept."""
        self._tally(chunk_ids, -1)

    def _tally(self, chunk_ids: torch.Tensor, sign: int) -> None:
        """Add ``sign`` to the count of each chunk in row 0 of ``chunk_ids`` per time it appears; zero counts go."""
        ids = chunk_ids[0].flatten()
        serials, counts = torch.unique(ids[ids >= 0], return_counts=True)
        for s, c in zip(serials.tolist(), counts.tolist()):
            n = self.hits.get(s, 0) + sign * c
            if n > 0:
                self.hits[s] = n
            else:
                self.hits.pop(s, None)

    def top(self, n: int) -> list[tuple[int, int]]:
        """The ``n`` most retrieved chunk serials with their counts, most retrieved first."""
        return sorted(self.hits.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def __getattr__(self, name):
        return getattr(self.memory, name)

    def __len__(self) -> int:
        return len(self.memory)


def chunk_keys(k: torch.Tensor) -> np.ndarray:
    """Mean-pooled chunk keys (Hkv, n, d) float32, C-contiguous, from chunk keys (Hkv, n, C, d): the index entries."""
    return np.ascontiguousarray(k.float().mean(dim=2).numpy())


def _check_search_device(device: str | torch.device | None) -> torch.device | None:
    """The search device as stored: None for the CPU; a GPU that is not there is refused."""
    if device is None or torch.device(device).type == "cpu":
        return None
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"memory search on {device} was asked for, but this PyTorch has no CUDA device "
                           f"(torch {torch.__version__})")
    return device


class _Row:
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

    def searched(self) -> list:
        """The faiss indexes a search reads: the exact ones, or (approximate search from its size on, on CPU) the
        IVF copies, built or brought up to date first."""
        if self.approx is None or self.n < self.approx[0]:
            if self.indexes is None:
                raise RuntimeError("this memory's faiss indexes were released (Memory.release_indexes): it is searched "
                                   "by matrix product, or approximately")
            return self.indexes
        if self.coarse is None:
            self.coarse = [ivf_index(chunk_keys(self.k[j:j + 1, :self.n])[0], self.approx[1]) for j in range(self.hkv)]
            self.coarse_n = self.n
        elif self.coarse_n < self.n:
            keys = chunk_keys(self.k[:, self.coarse_n:self.n])
            for j, index in enumerate(self.coarse):
                index.add(keys[j])
            self.coarse_n = self.n
        return self.coarse

    def index_keys(self) -> list[torch.Tensor]:
        """The exact faiss indexes' chunk keys, (n, d) float32 per KV head: views of the indexes' own memory, valid
        until the next add or eviction, to be read, not kept or written. RuntimeError once they were released."""
        if self.indexes is None:
            raise RuntimeError("this memory's faiss indexes were released (Memory.release_indexes)")
        return [torch.from_numpy(faiss.rev_swig_ptr(index.get_xb(), self.n * self.d)).view(self.n, self.d)
                for index in self.indexes]

    def key_blocks(self, start: int):
        """The chunk keys from position ``start`` to ``n``, float32, as (head, position, (b, d) block) in blocks of at
        most ``INDEX_BLOCK``: views of the exact indexes' memory or of the stored keys (``StoredKeys``) where they hold
        them, else pooled from the chunks' own keys (``chunk_keys``: the same numbers). Valid until the next add or
        eviction; no float32 copy of them all is made on the way."""
        exact = self.index_keys() if self.indexes is not None else None
        for j in range(self.hkv):
            held = exact[j] if exact is not None else self.stored.keys[j] if self.stored is not None else None
            upto = 0 if held is None else min(held.shape[0], self.n)  # positions ``held`` holds
            for s in range(start, self.n, INDEX_BLOCK):
                e = min(s + INDEX_BLOCK, self.n)
                if e <= upto:
                    yield j, s, held[s:e]
                elif s >= upto:
                    yield j, s, torch.from_numpy(chunk_keys(self.k[j:j + 1, s:e])[0])
                else:
                    yield j, s, torch.cat([held[s:upto], torch.from_numpy(chunk_keys(self.k[j:j + 1, upto:e])[0])])

    def mirror_keys(self) -> torch.Tensor:
        """The chunk keys (Hkv, n, d) in ``mirror_dtype`` on the search device, brought up to date first from the
        float32 keys of ``key_blocks`` (the exact indexes', the stored ones, or pooled from the chunks'). A bfloat16
        mirror holds them less their mean at its making (``center``): a query's ranking is the same, and the smaller
        scores round more finely (a layer's keys share a large common part: ``docs/design.md``)."""
        have = self.mirror_n
        if have < self.n:
            centred = self.mirror_dtype != torch.float32
            if centred and self.mirror is None:
                total = torch.zeros(self.hkv, self.d, dtype=torch.float64)
                for j, _, block in self.key_blocks(have):
                    total[j] += block.sum(dim=0, dtype=torch.float64)
                self.center = (total / (self.n - have)).float()[:, None, :]  # (Hkv, 1, d)
            room = 0 if self.mirror is None else self.mirror.shape[1]
            if self.n > room:  # with room: a question's few chunks, added and then truncated, copy nothing
                grown = torch.empty(self.hkv, max(self.n + max(2048, self.n // 32), room + room // 4), self.d,
                                    dtype=self.mirror_dtype, device=self.search_device or "cpu")
                if have:
                    grown[:, :have] = self.mirror[:, :have]
                self.mirror = grown
            for j, s, block in self.key_blocks(have):
                self.mirror[j, s:s + block.shape[0]] = block - self.center[j] if centred else block
            self.mirror_n = self.n
            self.stored = None  # the copy serves from now on (a mapping is let go)
            if self.release:  # the copy and the chunks' own keys serve from now on
                self.indexes = None
        return self.mirror[:, :self.n]

    def by_matmul(self) -> bool:
        """Whether a search now is a matrix product over the mirror (else faiss: no ``matmul``, or approximate; a row
        without exact indexes searches by matrix product)."""
        approx_now = self.approx is not None and self.search_device is None and self.n >= self.approx[0]
        return (self.matmul or self.indexes is None) and not approx_now

    def _exact_scores(self, j: int, rows: torch.Tensor, cand: torch.Tensor,
                      exact: list[torch.Tensor] | None) -> torch.Tensor:
        """Float32 scores (b, m) of KV head ``j``'s candidate positions ``cand`` (b, m) for the query rows ``rows``
        (b, d), against the keys the faiss indexes hold (``exact``, per KV head), or (None: released) the same keys
        made again from the candidates' own (``chunk_keys``)."""
        flat = cand.reshape(-1)
        if exact is None:
            vecs = self.k[j].index_select(0, flat).float().mean(dim=1).view(*cand.shape, self.d)
        else:
            vecs = exact[j].index_select(0, flat).view(*cand.shape, self.d)  # (b, m, d)
        return (rows[:, None, :].cpu() * vecs).sum(-1)

    def _ranked(self, j: int, rows: torch.Tensor, scores: torch.Tensor, m: int, rankable: int, rescore: bool,
                exact: list[torch.Tensor] | None,
                cols: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The best ``m`` columns of KV head ``j``'s ``scores`` (b, n), of which ``rankable`` are not -inf
        (positions ``cols[column]`` when given), and their float32 scores: with ``rescore`` (a bfloat16 product) its
        best ``m + RESCORED`` ranked again by exact scores (``_exact_scores``, from ``exact``)."""
        values, at = topk_blocked(scores, min(rankable, m + RESCORED) if rescore else m)
        at = at if cols is None else cols[at]
        if not rescore:
            return values.float().cpu(), at.cpu()
        at = at.cpu()
        values = self._exact_scores(j, rows, at, exact)
        values, order = torch.topk(values, m, dim=1)
        return values, at.gather(1, order)

    def _matmul_found(self, q: torch.Tensor, group: int, n_chunks: int, max_sinks: int | None) -> list[np.ndarray]:
        """``_found`` by matrix product over the mirror, ``QUERY_BLOCK`` query rows of one KV head at a time (the
        scores of one head's block: (b, n), 640 MB in float32 at 10M tokens), outside any autocast (a float32 search
        stays float32), with at most ``max_sinks`` sink chunks among a query's best (None: any): the sink chunks are
        left out of the product's ranking (their scores set to -inf) and their own best ``max_sinks`` ranked with the
        rest. A bfloat16 mirror's candidates are ranked again by exact float32 scores (``_ranked``). Rows may hold
        fewer than ``n_chunks`` positions when fewer chunks may be returned."""
        _, T, d = q.shape
        keys = self.mirror_keys()  # (Hkv, n, d)
        qd = q.detach().to(keys.device, torch.float32).reshape(self.hkv, group * T, d)
        rescore = keys.dtype != torch.float32
        exact = self.index_keys() if rescore and self.indexes is not None else None
        sinks = self.sink_positions().to(keys.device) if max_sinks is not None else None
        n_sinks = 0 if sinks is None else sinks.numel()
        kept_sinks = 0 if sinks is None else min(max_sinks, n_sinks)  # sink chunks a query may retrieve
        plain = self.n - n_sinks  # the chunks ranked as they score
        fetch = min(n_chunks, plain + kept_sinks)
        out = np.full((self.hkv, group * T, fetch), -1, dtype=np.int64)
        if fetch == 0:
            return list(out)
        upcast = self.upcast and keys.dtype == torch.bfloat16 and keys.device.type == "cpu"
        buffer = torch.empty(min(QUERY_BLOCK, group * T), self.n, dtype=torch.float32 if upcast else keys.dtype,
                             device=keys.device)  # one head's scores, reused
        with torch.autocast(keys.device.type, enabled=False):
            for j in range(self.hkv):  # per head: keys[j] is contiguous where the (Hkv, n, d) view is not
                for s in range(0, group * T, QUERY_BLOCK):
                    rows = qd[j, s:s + QUERY_BLOCK]  # (b, d)
                    scores = buffer[:rows.shape[0]]  # (b, n)
                    if upcast:
                        upcast_product(rows, keys[j], scores)
                    else:
                        torch.mm(rows.to(keys.dtype), keys[j].T, out=scores)
                    found = []  # (float32 scores, positions) of the candidates
                    if kept_sinks:
                        found.append(self._ranked(j, rows, scores.index_select(1, sinks), kept_sinks, n_sinks,
                                                  rescore, exact, sinks))
                    if n_sinks:
                        scores.index_fill_(1, sinks, float("-inf"))
                    if plain:
                        found.append(self._ranked(j, rows, scores, min(plain, fetch), plain, rescore, exact))
                    values, at = (torch.cat(x, dim=1) for x in zip(*found))
                    order = torch.topk(values, fetch, dim=1).indices
                    out[j, s:s + QUERY_BLOCK] = at.gather(1, order).numpy()
        return list(out)

    def _found(self, q: torch.Tensor, group: int, fetch: int) -> list[np.ndarray]:
        """Per KV head, the positions (group * T, fetch) of the best chunks of its query heads' queries in q (Hq, T,
        d), best first, by faiss (the exact indexes or the IVF copies)."""
        _, T, d = q.shape
        qf = q.detach().to("cpu", torch.float32).numpy()
        return [index.search(np.ascontiguousarray(qf[j * group:(j + 1) * group].reshape(group * T, d)), fetch)[1]
                for j, index in enumerate(self.searched())]

    def top_chunks(self, q: torch.Tensor, n_chunks: int, group: int, max_sinks: int | None) -> torch.Tensor:
        """q (Hq, T, d) -> positions (Hq, T, n_chunks) int64 of each query's best chunks, best first, -1 = none."""
        hq, T, d = q.shape
        ids = np.full((hq, T, n_chunks), -1, dtype=np.int64)
        if self.n == 0:
            return torch.from_numpy(ids)
        if self.by_matmul():
            heads = self._matmul_found(q, group, n_chunks, max_sinks)
        else:
            sink = np.zeros(self.n, dtype=bool)
            sink[self.sink_positions().numpy()] = True
            extra = 0 if max_sinks is None else max(0, int(sink.sum()) - max_sinks)  # sink chunks that may be skipped
            heads = self._found(q, group, min(n_chunks + extra, self.n))  # (group * T, fetch) each, best first
            heads = [limit_sinks(found, sink, max_sinks) if extra else found for found in heads]
        for j, found in enumerate(heads):
            found = found[:, :n_chunks]
            ids[j * group:(j + 1) * group, :, : found.shape[1]] = found.reshape(group, T, -1)
        return torch.from_numpy(ids)

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
        self.search_device = _check_search_device(search_device)  # None: the CPU (see the module doc)
        if matmul is None:  # on a GPU; on a CPU for a bfloat16 memory where bfloat16 is native
            matmul = self.search_device is not None or (dtype == torch.bfloat16 and bool(cpu_bf16_features()))
        if self.search_device is not None and not matmul:
            raise ValueError(f"a memory searched on {self.search_device} searches by matrix product (matmul=True)")
        self.matmul = matmul
        if mirror_dtype is None:  # bfloat16 for a bfloat16 memory searched on the CPU (see the module doc)
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

    def _row(self) -> _Row:
        return _Row(self.n_kv_heads, self.head_dim, self.chunk_size, self.dtype, self.search_device, self.matmul,
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
        """Search approximately (see the module doc) in rows holding at least ``min_chunks`` chunks, comparing each
        query with ``probes`` IVF lists (None: the default share); ``min_chunks=None``: exactly again. The IVF copies
        are made from the chunks' own keys, so a memory without exact faiss indexes (released, or made from stored
        keys) searches approximately too; below ``min_chunks`` it searches as before. Returns self."""
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
