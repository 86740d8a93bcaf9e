"""Ingestion: file -> text blocks -> tokens -> segments -> backbone up to layer m -> one committed bank row each.

    result = ingest(bank, model, "book.epub", progress=bar_update)

The text is streamed (a 200 MB file is never held whole; a document's text is extracted once, by a child process
held to ``ExtractLimits``, into a file): blocks come from ``readers.Source.blocks``, are tokenised
one at a time, and cut into segments of the bank's ``segment_len`` tokens. Each segment is encoded on its own
(positions from 0, as ``SegmentLM.memorize`` does) and committed in its own transaction together with the point in
the source where the next segment starts, so an interrupted ingestion (crash, kill -9, Ctrl-C) resumes there and
reaches the same final state as an uninterrupted one. The same file (by sha256 and reading options) is never stored
twice. The text is also cut into passages (``longmem.text.passages``) as it streams, each committed with the segment
that completes it; a resumed ingestion's cutter goes on from the passages already stored.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from longmem.ingest import readers
from longmem.ingest.limits import ExtractLimits
from longmem.ingest.readers import Block, DemoFormat, Source, open_source
from longmem.model.backbone import check_compiler
from longmem.model.lm import SegmentLM
from longmem.storage.bank import Bank
from longmem.storage.records import BankError, Document
from longmem.text.io import InputError
from longmem.text.passages import PassageCutter

log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]  # (bytes of the source done, bytes total, tokens stored by this run)


@dataclass
class Segment:
    ids: torch.Tensor  # (T,) token ids
    text: str  # the text these tokens cover (concatenated, segments tile the source text)
    chunk_chars: np.ndarray  # (n_chunks + 1,) character offsets of the chunk boundaries in ``text``
    resume: tuple[int, int]  # where the next segment starts: (block byte offset, tokens of that block to skip)
    position: int  # approximate byte offset of the segment's end in the source (for progress)


@dataclass
class IngestResult:
    document: Document
    action: str  # "ingested", "resumed" (an interrupted ingestion finished) or "skipped" (already in the bank)
    tokens: int  # tokens added by this run
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class _Buffer:
    """Tokens of the blocks read so far and not yet cut into segments, with their text and resume points."""

    def __init__(self):
        self.ids = np.empty(0, np.int64)
        self.lens = np.empty(0, np.int64)  # characters each token owns (a token owns the text up to the next one)
        self.res_off = np.empty(0, np.int64)  # resume point after each token: block offset ...
        self.res_skip = np.empty(0, np.int64)  # ... and tokens of that block to skip
        self.pos = np.empty(0, np.int64)  # approximate source byte offset after each token
        self.text = ""
        self.cur = 0  # first token not yet emitted
        self.cur_char = 0

    def __len__(self) -> int:
        return len(self.ids) - self.cur

    def push(self, block: Block, ids: list[int], starts: list[int], skip: int) -> None:
        n, text = len(ids), block.text
        bounds = np.maximum.accumulate(np.array([0, *starts[1:], len(text)], dtype=np.int64))
        lens = np.diff(bounds)
        res_off = np.full(n, block.start, np.int64)
        res_skip = np.arange(1, n + 1, dtype=np.int64)
        res_off[-1], res_skip[-1] = block.end, 0  # after a block's last token, the next block starts
        pos = block.start + (bounds[1:] * (block.end - block.start)) // max(len(text), 1)
        first_char = int(bounds[skip])
        keep = slice(skip, None)
        cat = lambda old, new: np.concatenate([old[self.cur:], new[keep]])  # noqa: E731
        self.ids, self.lens = cat(self.ids, np.asarray(ids, np.int64)), cat(self.lens, lens)
        self.res_off, self.res_skip, self.pos = cat(self.res_off, res_off), cat(self.res_skip, res_skip), \
            cat(self.pos, pos)
        self.text = self.text[self.cur_char:] + text[first_char:]
        self.cur = self.cur_char = 0

    def take(self, n: int, chunk_size: int) -> Segment:
        s, e = self.cur, self.cur + n
        cum = np.concatenate([[0], np.cumsum(self.lens[s:e])])
        n_chunks = n // chunk_size
        seg = Segment(ids=torch.from_numpy(self.ids[s:e].copy()),
                      text=self.text[self.cur_char:self.cur_char + int(cum[-1])],
                      chunk_chars=cum[: n_chunks * chunk_size + 1: chunk_size].astype(np.int32),
                      resume=(int(self.res_off[e - 1]), int(self.res_skip[e - 1])), position=int(self.pos[e - 1]))
        self.cur, self.cur_char = e, self.cur_char + int(cum[-1])
        return seg


def cut_segments(tokenizer, blocks: Iterable[Block], segment_len: int, chunk_size: int,
                 skip: int = 0) -> Iterator[Segment]:
    """Tokenise blocks one by one and yield segments of ``segment_len`` tokens (the last one may be shorter). The
    first ``skip`` tokens of the first block are left out (they were stored before an interruption)."""
    buf = _Buffer()
    for block in blocks:
        enc = tokenizer(block.text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids = enc["input_ids"]
        if skip > len(ids):
            raise BankError(f"cannot resume: the source changed (block at byte {block.start} has {len(ids)} tokens, "
                            f"{skip} were stored)")
        if ids[skip:]:
            buf.push(block, ids, [o[0] for o in enc["offset_mapping"]], skip)
        skip = 0
        while len(buf) >= segment_len:
            yield buf.take(segment_len, chunk_size)
    if len(buf):
        yield buf.take(len(buf), chunk_size)


def store_segment(bank: Bank, model: SegmentLM, ref: dict | int, seq: int, seg: Segment,
                  cutter: PassageCutter, compile: bool = False) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Encode one segment and commit its whole chunks with the passages its text completes (one transaction).
    Returns the document id and the keys/values stored (Hkv, n_chunks * chunk_size, d). The whole segment is
    encoded, its last < chunk_size tokens too, as ``memorize`` encodes it: attention kernels may round differently
    for another length (bfloat16 on AMX CPUs does), and a bank holds exactly what ``memorize`` computes. With
    ``compile``, a full segment runs through compiled layers (``Backbone.compiled_layers``): what is stored then agrees
    with ``memorize`` within rounding; a document's shorter last segment runs eagerly (no compile for its shape)."""
    info = bank.info_cached
    n_full = len(seg.chunk_chars) - 1
    if n_full:
        fast = compile and seg.ids.numel() == info.segment_len
        with model.backbone.compiled_layers(model.cached_layer) if fast else contextlib.nullcontext():
            k, v = model.encode_memory(seg.ids[None].to(model.backbone.device))  # (1, Hkv, T, d)
        k, v = k[0, :, : n_full * info.chunk_size], v[0, :, : n_full * info.chunk_size]
    else:  # a document's last few tokens (< chunk_size): stored as text, not searchable
        k = v = torch.empty(info.n_kv_heads, 0, info.head_dim)
    passages = cutter.feed(seg.text, seg.ids.numel())
    doc_id = bank.add_segment(ref, seq, seg.ids, seg.text, seg.chunk_chars, k, v, seg.resume, passages)
    return doc_id, k, v


def ingest(bank: Bank, model: SegmentLM, path: str | Path | Source, demos: DemoFormat | None = None,
           title: str | None = None, progress: Progress | None = None, limits: ExtractLimits | None = None,
           check: Callable[[], None] | None = None, compile: bool = False) -> IngestResult:
    """Store ``path`` in ``bank`` through ``model``'s backbone (up to its cached layer), resuming an interrupted
    ingestion of the same file and skipping a file already stored. The file's text is read once, within
    ``limits`` (``readers.open_source``; ``check`` can stop that by raising, as a job's cancel check does), unless
    ``path`` is a Source opened already (with the same ``demos``; it stays the caller's). Raises InputError for
    unusable files (LimitError, a kind of it, for a crossed limit: nothing is stored then), BankMismatch when the
    model is not the bank's, BankBusy when another process is writing the bank. ``compile``: full segments run
    through compiled layers (``store_segment``; faster on long books once compiled, within rounding of eager), for
    a caller that runs nothing else on the backbone meanwhile (``Backbone.compiled_layers``)."""
    t0 = time.perf_counter()
    if compile:
        check_compiler(model.backbone.device)  # before anything is read or written
    if isinstance(path, Source):
        return _ingest(bank, model, path, path.path, demos, title, progress, t0, compile)
    with open_source(path, demos, limits, check) as source:
        return _ingest(bank, model, source, path, demos, title, progress, t0, compile)


def _ingest(bank: Bank, model: SegmentLM, source: Source, path: str | Path, demos: DemoFormat | None,
            title: str | None, progress: Progress | None, t0: float, compile: bool) -> IngestResult:
    bank.check(model)
    tokenizer = model.backbone.tokenizer
    if tokenizer is None:
        raise BankError(f"backbone {model.backbone.name!r} has no tokenizer to read text with")
    info = bank.info_cached
    options = {"demos": asdict(demos or DemoFormat())} if source.kind == "demos" else {}
    # what decides where the segments fall; a resume under different conditions would splice two cuttings
    reading = {"block_bytes": readers.BLOCK_BYTES, "tokenizer": type(tokenizer).__name__, "vocab": len(tokenizer),
               "backbone": model.backbone.fingerprint()[:16]}
    with bank.writing():
        doc = bank.find_document(source.sha256, options)
        if doc is not None and doc.status == "complete":
            return IngestResult(doc, "skipped", 0, 0.0)
        # the same file read by another reader (a .srt begun as plain text, before it had one): its facts differ
        if doc is not None and set(doc.meta) - {"reading"} != set(source.meta):
            raise BankError(f"cannot resume {path}: its text was read another way when it was begun (facts "
                            f"{sorted(set(doc.meta) - {'reading'})}, now {sorted(source.meta)}); delete document "
                            f"{doc.id} and ingest the file again")
        if doc is not None and doc.meta.get("reading", reading) != reading:
            raise BankError(f"cannot resume {path}: it was cut into segments with {doc.meta['reading']}, this run "
                            f"would use {reading}; delete document {doc.id} and ingest the file again")
        ref: dict | int = doc.id if doc is not None else {
            "title": title or source.title, "source": source.name, "kind": source.kind, "sha256": source.sha256,
            "options": options, "meta": {**source.meta, "reading": reading}}
        seq = doc.n_segments if doc is not None else 0
        start, skip = (doc.resume_offset, doc.resume_skip) if doc is not None else (0, 0)
        added, held = 0, []  # held: leading whitespace-only segments, stored once real text follows
        cutter = bank.passage_cutter(doc.id if doc is not None else None, demonstrations=source.kind == "demos")
        try:
            for seg in cut_segments(tokenizer, source.blocks(start), info.segment_len, info.chunk_size, skip):
                if isinstance(ref, dict) and not seg.text.strip():
                    held.append(seg)  # a whitespace-only file must leave nothing behind
                    continue
                for s in (*held, seg):
                    ref = store_segment(bank, model, ref, seq, s, cutter, compile)[0]
                    seq += 1
                    added += s.ids.numel()
                held = []
                if progress is not None:
                    progress(seg.position, source.size, added)
        except BaseException:
            try:  # also after Ctrl-C: what was committed becomes searchable at once
                bank.sync_index()
            except Exception:  # never hide the error that stopped the ingestion
                log.exception("could not bring the index files of bank %s up to date", bank.name)
            raise
        bank.sync_index()
        if isinstance(ref, dict):
            raise InputError(f"{path}: no text to ingest (the file holds only whitespace)")
        bank.finish_document(ref, cutter.finish())
        if progress is not None:
            progress(source.size, source.size, added)
    return IngestResult(bank.document(ref), "resumed" if doc is not None else "ingested", added,
                        time.perf_counter() - t0)
