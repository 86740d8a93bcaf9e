"""Training data: the paper's "batchfying" (appendix C) of documents from ``longmem.eval.datasets.books``
(book split, tokens).

LongMem trains on long documents read segment by segment, with a memory bank that holds each stream's past. Plain
shuffled segments would break that, so batches are built the paper's way:

  1. every document is cut into whole segments of ``segment_len`` tokens (a last partial segment is dropped);
  2. documents are dealt into ``n_rows = batch_size * world_size`` groups of nearly equal length (greedy: longest
     document first, into the currently shortest group);
  3. each epoch, the documents inside each group are shuffled and concatenated, and all rows are truncated to the
     shortest row;
  4. step t takes segment t of every row. Row j of step t continues row j of step t-1, so row j's memory (cleared
     where ``Batch.reset`` is True) only ever holds earlier segments of the same document.

Layouts depend only on (documents, batch_size, world_size, segment_len, seed, epoch), so every rank computes the
same global layout and takes its own rows, and ``Batchfier.batch(step)`` is a pure function of the step: resuming
at step s reproduces the exact batches a run without interruption would have seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from longmem.eval.datasets.books import Document, book_split, tokenize_files  # noqa: F401 (the training data's own API)

log = logging.getLogger(__name__)


# -----------------------------------------------------------------------------
# batchfying


@dataclass
class Batch:
    step: int  # global step index this batch belongs to
    ids: torch.Tensor  # (B, L) int64 token ids, B = rows of THIS process
    reset: torch.Tensor  # (B,) bool: True where this row starts a new document at this step (clear its memory first)
    doc: list[str]  # (B,) name of the document each row is in
    answers: torch.Tensor  # (B, L) bool: recall-answer tokens (``Document.answers``), which the loss may weight up
    epoch: int = 0  # step // steps_per_epoch


@dataclass
class _Layout:
    epoch: int
    doc: np.ndarray  # (n_rows, steps_per_epoch) int64 index into Batchfier.documents
    seg: np.ndarray  # (n_rows, steps_per_epoch) int64 segment index inside that document


class Batchfier:
    """Paper's batchfying: documents are cut into whole segments of segment_len tokens (a document's last partial
    segment is dropped; documents shorter than one segment are dropped), distributed into n_rows = batch_size *
    world_size groups of nearly equal total segments (greedy: longest document first into the currently shortest
    group), the documents of each group shuffled (rng seeded by (seed, epoch)), concatenated, and all rows
    truncated to the shortest row's number of segments. Row j of step t continues row j of step t-1; segments never
    span two documents, so a row's memory (reset at ``reset``) only ever holds its own document's past.
    Process ``rank`` of ``world_size`` gets rows [rank*batch_size, (rank+1)*batch_size).

    ``max_doc_segments`` (default None: never) cuts longer documents into parts of at most that many segments,
    each a document of its own (named "<name>#<part>", starting with a fresh memory). It helps when one book is
    much longer than a row's share of the data (its row would be cut to the shortest row, wasting most of it), or
    when there are fewer documents than rows."""

    def __init__(self, documents: list[Document], batch_size: int, segment_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, max_doc_segments: int | None = None):
        if batch_size < 1 or segment_len < 1 or world_size < 1:
            raise ValueError(f"batch_size ({batch_size}), segment_len ({segment_len}) and world_size ({world_size}) "
                             "must be positive")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if max_doc_segments is not None and max_doc_segments < 1:
            raise ValueError(f"max_doc_segments must be positive, got {max_doc_segments}")
        self.batch_size, self.segment_len, self.seed = batch_size, segment_len, seed
        self.rank, self.world_size = rank, world_size
        self.n_rows = batch_size * world_size

        # whole segments only; documents shorter than one segment are dropped
        self.documents: list[Document] = []
        for d in documents:
            n = len(d.ids) // segment_len
            if n == 0:
                continue
            if max_doc_segments is None or n <= max_doc_segments:
                self.documents.append(d)
                continue
            for part, s in enumerate(range(0, n, max_doc_segments)):
                e = min(n, s + max_doc_segments)
                cut = slice(s * segment_len, e * segment_len)
                self.documents.append(Document(f"{d.name}#{part}", d.ids[cut],
                                               None if d.answers is None else d.answers[cut]))
        self.n_segments = np.array([len(d.ids) // segment_len for d in self.documents], dtype=np.int64)  # (D,)
        total = int(self.n_segments.sum())
        if total < self.n_rows:
            raise ValueError(f"{total} segments of data cannot fill {self.n_rows} rows "
                             f"(batch_size {batch_size} x world_size {world_size}, segment_len {segment_len})")
        if len(self.documents) < self.n_rows:
            raise ValueError(f"{len(self.documents)} documents ({total} segments) cannot fill {self.n_rows} rows: "
                             "every row needs a document of its own (max_doc_segments cuts long ones into parts)")

        # greedy balance, the same for every epoch and rank: longest first (ties by index) into the shortest group
        self.groups: list[list[int]] = [[] for _ in range(self.n_rows)]
        sizes = np.zeros(self.n_rows, dtype=np.int64)
        for i in sorted(range(len(self.documents)), key=lambda i: (-self.n_segments[i], i)):
            g = int(np.argmin(sizes))  # first of the shortest groups
            self.groups[g].append(i)
            sizes[g] += self.n_segments[i]
        self.steps_per_epoch = int(sizes.min())
        self.segments_used = self.steps_per_epoch * self.n_rows  # per epoch, of self.n_segments.sum()
        self._layout: _Layout | None = None  # cache of the last epoch's layout
        if self.segments_used < total:
            log.info("batchfier: %d of %d segments per epoch used (rows truncated to the shortest, %d steps)",
                     self.segments_used, total, self.steps_per_epoch)

    def layout(self, epoch: int) -> _Layout:
        """(doc index, segment index) of every row (all ranks) at every step of an epoch."""
        if self._layout is not None and self._layout.epoch == epoch:
            return self._layout
        rng = np.random.default_rng([self.seed, epoch])
        doc = np.empty((self.n_rows, self.steps_per_epoch), dtype=np.int64)
        seg = np.empty_like(doc)
        for r, group in enumerate(self.groups):
            order = [group[i] for i in rng.permutation(len(group))]
            d = np.concatenate([np.full(self.n_segments[i], i) for i in order])  # (row segments,)
            s = np.concatenate([np.arange(self.n_segments[i]) for i in order])
            doc[r], seg[r] = d[:self.steps_per_epoch], s[:self.steps_per_epoch]
        self._layout = _Layout(epoch, doc, seg)
        return self._layout

    def batch(self, step: int) -> Batch:
        """The batch of this rank at a global step (epoch = step // steps_per_epoch). Deterministic."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        epoch, t = divmod(step, self.steps_per_epoch)
        lay = self.layout(epoch)
        rows = range(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        L = self.segment_len
        docs = [self.documents[lay.doc[r, t]] for r in rows]
        cuts = [slice(lay.seg[r, t] * L, (lay.seg[r, t] + 1) * L) for r in rows]
        ids = np.stack([d.ids[c] for d, c in zip(docs, cuts)])  # (B, L)
        answers = np.stack([np.zeros(L, bool) if d.answers is None else d.answers[c]
                            for d, c in zip(docs, cuts)])  # (B, L)
        return Batch(step=step,
                     ids=torch.from_numpy(ids.astype(np.int64)),
                     reset=torch.from_numpy(lay.seg[rows.start:rows.stop, t] == 0),
                     doc=[d.name for d in docs],
                     answers=torch.from_numpy(answers),
                     epoch=epoch)

    def iterate(self, start_step: int = 0) -> Iterator[Batch]:
        """Batches from start_step on, endlessly (epochs repeat, each shuffled anew)."""
        step = start_step
        while True:
            yield self.batch(step)
            step += 1

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate(0)

    def first_step_of_documents(self, step: int, max_back: int | None = None) -> int:
        """Where replaying must start to rebuild every row's memory for ``step``: s = the smallest, over all rows (of
        all ranks, so every rank gets the same answer), of the step at which that row's current document began.
        Replaying the batches s .. step-1 (memory cleared at s and wherever ``reset`` is True) rebuilds every row's
        memory exactly; the trainer uses it on resume. Every row starts a document at the first step of an epoch,
        so s never reaches back into the previous epoch.

        With ``max_back`` (e.g. ceil(capacity / segment_len) when the memory is a FIFO of ``capacity`` tokens),
        s is not earlier than step - max_back: older segments would have been evicted anyway."""
        epoch, t = divmod(step, self.steps_per_epoch)
        lay = self.layout(epoch)
        starts = t - lay.seg[:, t]  # (n_rows,) step within the epoch where each row's current document began
        first = int(starts.min())
        if max_back is not None:
            first = max(first, t - max_back)
        return epoch * self.steps_per_epoch + first
