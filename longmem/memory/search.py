"""How one row of a memory (``longmem.memory.rows``) searches its chunk keys: by faiss (the exact indexes, or the IVF
copies of approximate search) or by matrix product over a copy of the keys (the search copy), with the float32 keys
the copy is made from (``chunk_keys``, ``StoredKeys``) and the bfloat16 product where bfloat16 is not native
(``upcast_product``).

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
"""

from __future__ import annotations

import faiss
import numpy as np
import torch

from longmem.memory.ranking import INDEX_BLOCK, ivf_index, limit_sinks, topk_blocked

RESCORED = 64  # a bfloat16 matmul search ranks this many more candidates than asked again by exact scores
QUERY_BLOCK = 64  # query rows per KV head scored at once by a matmul search (bounds its (rows, chunks) scores)
UPCAST_BLOCK = 16384  # keys of a bfloat16 mirror made float32 at once where bfloat16 is not native (4 MB at d 64)


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


def chunk_keys(k: torch.Tensor) -> np.ndarray:
    """Mean-pooled chunk keys (Hkv, n, d) float32, C-contiguous, from chunk keys (Hkv, n, C, d): the index entries."""
    return np.ascontiguousarray(k.float().mean(dim=2).numpy())


class RowSearch:
    """What searches one row's chunk keys, per KV head: its exact faiss indexes, the IVF copies of approximate
    search, or the search copy (``mirror``) of a matrix-product search. The base of ``Row`` (``longmem.memory.rows``),
    which sets up and stores what it reads: ``hkv``, ``d``, ``n`` (chunks stored) and ``k`` (Hkv, capacity, C, d)
    the chunks' keys, ``sink_positions()`` (the sink chunks' positions); and the search state its adds, evictions
    and truncations keep in step: ``indexes``, ``release``, ``stored``, ``mirror``, ``mirror_n``, ``center``,
    ``mirror_dtype``, ``search_device``, ``matmul``, ``upcast``, ``approx``, ``coarse`` and ``coarse_n``."""

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
