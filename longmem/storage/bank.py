"""One persistent memory bank: the ``Bank`` that reads and writes it (its SQLite schema: ``storage.schema``).

    <bank dir>/bank.db                            metadata, documents, segments (token ids, text, chunk spans, CRC-32s),
                                                  passages and their FTS5 full-text index (``storage.passages``)
    <bank dir>/kv-e<epoch>.k, kv-e<epoch>.v       layer-m keys and values, chunk after chunk, append-only, mapped
                                                  when a large bank is loaded (``storage.kvfiles``)
    <bank dir>/keys-<h>-e<epoch>-n<chunks>.faiss  mean-pooled chunk keys of KV head h (derived; rebuilt when missing,
                                                  stale or corrupt)
    <bank dir>/write.lock                         held by the one process allowed to write

A bank stores the keys/values of one backbone layer m, one segment of ``segment_len`` tokens after another (each
segment encoded on its own, as ``SegmentLM.memorize`` does); only whole chunks of ``chunk_size`` tokens are
searchable. A bank made before the K/V files keeps them as one SQLite ``kv`` row per segment until its first load or
write moves them (``move_kv_to_files``); until then it is read as it is.
Every write is one transaction (``db.atomic()``) in WAL mode, so readers see whole segments while a writer ingests, and
a crash loses at most the segment in flight. Chunks are ordered by segment id; ``epoch`` goes up whenever chunks are
removed, which is how an index file knows it no longer describes a prefix of the bank. Banks are named and found
through ``storage.BankDirectory``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Iterator

import numpy as np
import sqlite_utils
import torch

from longmem.storage import passages as bank_passages
from longmem.storage.app_records import AppRecords
from longmem.storage.integrity import check_segments
from longmem.storage.memory_files import MemoryFiles
from longmem.storage.passages import ChunkPlaces, Passage
from longmem.storage.records import (
    BankBusy,
    BankCorrupt,
    BankError,
    BankInfo,
    BankMismatch,
    ChunkText,
    Document,
    VerifyReport,
)
from longmem.storage.schema import SchemaTooNew, migrate, pending_migrations
from longmem.storage.writes import DB_NAME, BankWrites, file_identity
from longmem.text.passages import excerpt

KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Bank(AppRecords, BankWrites, MemoryFiles):
    """One persistent bank. Reading needs no lock; writing happens inside ``writing()`` (one writer at a time: the
    write path is ``storage.writes``); its K/V files, index files and ``load_memory`` are ``storage.memory_files``."""

    def __init__(self, path: Path):
        self.path = path
        self.layout = None  # of the last memory loaded, for quoting passages (``MemoryFiles.layout``)
        self._lock_fd: int | None = None
        self._info: BankInfo | None = None
        try:
            conn = sqlite3.connect(f"file:{path / DB_NAME}?mode=rw", uri=True, timeout=30, check_same_thread=False)
        except sqlite3.Error as e:
            raise BankError(f"bank {path.name!r}: cannot open {path / DB_NAME} ({e})") from None
        self._db_id = file_identity(path / DB_NAME)  # the database this handle has open (see ``writing``)
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: durable against process crashes, fast commits
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA secure_delete = ON")  # a deleted document's text and K/V are overwritten
            self.db = sqlite_utils.Database(conn)
            if pending_migrations(self.db):
                with self.writing():
                    had_passages = "passages" in self.db.table_names()
                    migrate(self.db)
                    if not had_passages:  # a bank made before passages existed: cut them from its text
                        self.rebuild_passages()
            self.info  # noqa: B018  (reads the bank row: a corrupt file fails here, not later)
        except BaseException as e:
            conn.close()
            if isinstance(e, SchemaTooNew):
                raise BankError(f"{path / DB_NAME} {e}; upgrade longmem") from None
            if isinstance(e, sqlite3.DatabaseError) and any(
                    w in str(e) for w in ("not a database", "malformed", "encrypted", "no such table")):
                raise BankCorrupt(f"bank {path.name!r}: {path / DB_NAME} is not a readable LongMem bank ({e}). It "
                                  "was left untouched; restore it from a backup or delete the bank.") from None
            if isinstance(e, sqlite3.Error):
                raise BankError(f"bank {path.name!r}: cannot read {path / DB_NAME}: {e}") from None
            raise

    # -- basics ---------------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def info(self) -> BankInfo:
        rows = list(self.db.query("SELECT * FROM bank WHERE id = 1"))
        if not rows:
            raise BankCorrupt(f"bank {self.name!r}: its metadata row is missing")
        return BankInfo(**{k: v for k, v in rows[0].items() if k != "id"})

    @property
    def info_cached(self) -> BankInfo:
        """``info`` read once (its shape fields never change; epoch and times do, so use ``info`` for those)."""
        if self._info is None:
            self._info = self.info
        return self._info

    @property
    def dtype(self) -> torch.dtype:
        return KV_DTYPES[self.info_cached.kv_dtype]

    def close(self) -> None:
        self._release()
        self.db.close()

    def __enter__(self) -> "Bank":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self, model) -> None:
        """Refuse a model whose backbone, cached layer, chunk size or head layout differs from the bank's."""
        info, bb = self.info_cached, model.backbone
        mine = (info.backbone_sha256, info.cached_layer, info.chunk_size, info.n_kv_heads, info.head_dim)
        theirs = (bb.fingerprint(), model.cached_layer, model.chunk_size, bb.spec.n_kv_heads, bb.spec.head_dim)
        if mine != theirs:
            raise BankMismatch(
                f"bank {self.name!r} was built with backbone {info.backbone_name!r} (sha256 {info.backbone_sha256[:12]}"
                f"…), layer {info.cached_layer}, chunk size {info.chunk_size}; this model has {bb.name!r} (sha256 "
                f"{bb.fingerprint()[:12]}…), layer {model.cached_layer}, chunk size {model.chunk_size}. Make a new "
                "bank for it.")

    def documents(self) -> list[Document]:
        return [Document.from_row(r) for r in self.db.query("SELECT * FROM documents ORDER BY id")]

    def document(self, doc_id: int) -> Document:
        rows = list(self.db.query("SELECT * FROM documents WHERE id = ?", [doc_id]))
        if not rows:
            raise BankError(f"bank {self.name!r} has no document {doc_id}")
        return Document.from_row(rows[0])

    def find_document(self, sha256: str, options: dict) -> Document | None:
        opts = json.dumps(options, sort_keys=True)
        rows = list(self.db.query("SELECT * FROM documents WHERE sha256 = ? AND options = ?", [sha256, opts]))
        return Document.from_row(rows[0]) if rows else None

    def version(self) -> tuple[int, int]:
        """(epoch, chunks stored): changes whenever the bank's memory does (a write adds chunks; a rebuild or
        removal bumps the epoch), so a loaded copy of the memory is current while its version is."""
        chunks = self.db.execute("SELECT coalesce(sum(n_chunks), 0) FROM segments").fetchone()[0]
        return self.info.epoch, int(chunks)

    def stats(self) -> dict:
        row = next(self.db.query("SELECT count(*) AS segments, coalesce(sum(n_tokens), 0) AS tokens, "
                                 "coalesce(sum(n_chunks), 0) AS chunks FROM segments"))
        disk = 0
        for f in self.path.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a temporary file may be renamed meanwhile
                disk += f.stat().st_size if f.is_file() else 0
        info = self.info_cached
        kv = row["chunks"] * info.chunk_size * info.n_kv_heads * info.head_dim * 2 * self.dtype.itemsize
        n_docs = self.db.execute("SELECT count(*) FROM documents").fetchone()[0]
        return {**row, "documents": n_docs, "kv_bytes": kv, "disk_bytes": disk}

    # -- reading ------------------------------------------------------------------------------------------------
    def chunk_text(self, serial: int, context_chunks: int = 12) -> ChunkText:
        """Chunk ``serial`` of the last loaded memory as a reader is shown it: its text (a chunk of tokens may start
        or end inside a word) and its context, up to ``context_chunks`` chunks each side within its segment, cut at
        sentence bounds within reach, else at whole words with "…", so the context never starts or ends inside a
        word; both reflowed (``text.passages.excerpt``), so ``text`` is in ``context``."""
        lay = self.layout
        if lay is None:
            raise RuntimeError("load_memory() first: chunks are numbered by the loaded memory")
        if not 0 <= serial < lay.first_chunk[-1]:
            raise KeyError(f"chunk {serial} is not in the loaded memory of bank {self.name!r}")
        if self.info.epoch != lay.epoch:
            raise KeyError(f"documents were deleted from bank {self.name!r} after its memory was loaded; load it again")
        s = int(np.searchsorted(lay.first_chunk, serial, side="right") - 1)
        j = serial - int(lay.first_chunk[s])
        row = next(self.db.query("SELECT s.document_id, s.seq, s.text, s.chunk_chars, d.title, d.n_segments FROM "
                                 "segments s JOIN documents d ON d.id = s.document_id WHERE s.id = ?",
                                 [int(lay.segment_ids[s])]), None)
        if row is None:
            raise KeyError(f"chunk {serial} was deleted from bank {self.name!r} after it was loaded")
        bounds = np.frombuffer(row["chunk_chars"], dtype=np.int32)
        text = row["text"]
        lo, hi = bounds[max(j - context_chunks, 0)], bounds[min(j + 1 + context_chunks, len(bounds) - 1)]
        of_segments = max(row["n_segments"], row["seq"] + 1)
        shown = excerpt(text[lo:bounds[j]], text[bounds[j]:bounds[j + 1]], text[bounds[j + 1]:hi],
                        cut_before=lo > 0 or row["seq"] > 0, cut_after=hi < len(text) or row["seq"] + 1 < of_segments)
        return ChunkText(serial=serial, document_id=row["document_id"], document=row["title"],
                         text=shown.text, context=shown.context, segment=row["seq"], chunk=j,
                         of_segments=of_segments)

    def search_passages(self, question: str, k: int, labels: list[str] | None = None,
                        documents: list[int] | None = None) -> list[tuple[int, float]]:
        """The ``k`` passages that best match ``question``'s words (BM25): (passage id, score), best first; with
        ``labels``, only among the passages of those chapters; with ``documents``, of those documents (ids)."""
        return bank_passages.search(self.db, question, k, labels, documents)

    def passages_of(self, documents: list[int]) -> set[int]:
        """Ids of the passages of the documents ``documents`` (ids)."""
        return bank_passages.of_documents(self.db, documents)

    def chapter_labels(self) -> list[str]:
        """The chapters' labels (``Passage.label``), each once, in book order ([] for a bank made before labels)."""
        return bank_passages.labels(self.db)

    def last_passages(self, labels: list[str], k: int, documents: list[int] | None = None) -> list[int]:
        """Ids of the last ``k`` passages of the chapters ``labels`` (of the documents ``documents``, when given),
        the last first."""
        return bank_passages.last_of(self.db, labels, k, documents)

    def passages(self, ids: list[int]) -> list[Passage]:
        """Passages by id, with their places, in the order given."""
        return bank_passages.fetch(self.db, ids)

    def document_text(self, doc_id: int) -> str:
        """A document's whole text as stored (its segments' text, in order)."""
        return bank_passages.document_text(self.db, doc_id)

    def document_text_between(self, doc_id: int, start: int, end: int) -> str:
        """Characters ``start`` to ``end`` of a document's text (to show a passage in its surroundings)."""
        return bank_passages.text_between(self.db, doc_id, start, end)

    def passage_texts(self, doc_id: int | None = None) -> list[tuple[int, str]]:
        """(passage id, text) of every passage, or of document ``doc_id``'s, in the order they were cut."""
        return bank_passages.texts(self.db, doc_id)

    def passages_overlapping(self, doc_id: int, start: int, end: int) -> list[int]:
        """Ids of document ``doc_id``'s passages sharing a character with its characters ``start`` to ``end``."""
        return bank_passages.overlapping(self.db, doc_id, start, end)

    def passages_around(self, passage: Passage, n: int) -> list[Passage]:
        """``passage`` with the ``n`` passages before and the ``n`` after it in its document, in book order (fewer at
        a document's ends)."""
        ids = bank_passages.around(self.db, passage.document_id, passage.char_start, passage.char_end, n)
        return bank_passages.fetch(self.db, ids)

    def chunk_places(self, appended: int | None = None) -> ChunkPlaces:
        """Which passage holds each chunk of the last loaded memory (``ChunkPlaces.votes``); ``appended``: a document
        written after the load whose segments' chunks were added to that memory in order, after its own."""
        lay = self.layout
        if lay is None:
            raise RuntimeError("load_memory() first: chunks are numbered by the loaded memory")
        segments, first = lay.segment_ids, lay.first_chunk
        added = bank_passages.segment_chunks(self.db, appended) if appended is not None else []
        if added:
            segments = np.append(segments, [s for s, _ in added])
            first = np.append(first, first[-1] + np.cumsum([c for _, c in added], dtype=np.int64))
        return ChunkPlaces(self.db, segments, first)

    @contextlib.contextmanager
    def provisional(self) -> Iterator["Bank"]:
        """Writing whose effects are all undone at the end (a savepoint rolled back): for trying a document in the
        bank without keeping it. Index files are not touched; the memory loaded from the bank is the caller's."""
        with self.writing():
            self.db.execute("SAVEPOINT provisional")
            try:
                yield self
            finally:
                self.db.execute("ROLLBACK TO SAVEPOINT provisional")
                self.db.execute("RELEASE SAVEPOINT provisional")

    # -- checking -------------------------------------------------------------------------------------------------
    def verify(self, repair_index: bool = True) -> VerifyReport:
        """Check SQLite integrity, every segment's blobs against its shape and its CRC-32, document totals, and the
        index files (rewritten when stale or damaged if ``repair_index`` and nobody else is writing). The checks
        read one snapshot, so an ingestion running meanwhile cannot look like damage."""
        info, report = self.info_cached, VerifyReport()
        try:
            result = [r[0] for r in self.db.execute("PRAGMA integrity_check").fetchall()]
        except sqlite3.DatabaseError as e:
            result = [str(e)]
        if result != ["ok"]:
            report.problem("SQLite integrity check: " + "; ".join(result[:5]))
            return report
        with self.db.atomic():
            check_segments(self.db, info, self.dtype.itemsize, self.documents(), report, self.kv_files())
            for msg in bank_passages.layout_problems(self.db):
                report.problem(msg + f"; `longmem bank rebuild-index {self.name}` cuts them again")
            fts = bank_passages.fts_problems(self.db)
        if repair_index:  # the index is derived data: check it deeply and rebuild it when damaged
            try:
                with self.writing(), self.db.atomic():
                    fts = fts or bank_passages.fts_problems(self.db, deep=True)
                    if fts:
                        bank_passages.rebuild_fts(self.db)
                        report.notes.append(f"{fts[0]}: rebuilt from the passages")
            except BankBusy:
                if fts:
                    report.problem(fts[0] + " (not rebuilt: another process is writing)")
        elif fts:
            report.problem(fts[0])
        if report.ok and repair_index:
            try:
                done = self.sync_index()
                if done["rebuilt"] or done["appended"]:
                    report.notes.append(f"index files brought up to date ({done['rebuilt']} rebuilt, "
                                        f"{done['appended']} chunks appended)")
            except BankBusy:
                report.notes.append("index files not checked: another process is writing")
        return report
