"""What a memory search hands back, and the view an answer reads a memory through: ``Retrieved`` (each query's top
chunks, their keys and values gathered per query, from ``Memory.search``), ``Selected`` (the same chunks as a mask
over every stored token, from ``Memory.select``) and ``MemoryView`` (a read-through view of a memory that counts the
chunks its searches retrieved)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


class MemoryView:
    """A read-through view of a memory, passed into forward in its place: it counts which chunks were
    retrieved (to show a reader the chunks behind an answer) and can set how many chunks each query gets.
    Everything else (``add``, ``chunk_size``, ``len``...) is the memory's."""

    def __init__(self, memory, n_chunks: int | None = None):
        self.memory = memory  # the ``Memory`` (``longmem.memory.memory``, which imports this module) read through
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
