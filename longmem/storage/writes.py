"""The write path of a bank: its writer lock and every write of its memory (segments, documents, passages). A part of
``Bank`` (``storage.bank``), which provides the database, the bank's shape, its K/V files and its index files; each
write is one transaction (``db.atomic()``) inside ``writing()``, so readers see whole segments while a writer ingests,
and a crash loses at most the segment in flight: a segment's keys and values are appended to the K/V files and made
durable before the transaction that records them commits (``storage.kvfiles``)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from longmem.storage import passages as bank_passages
from longmem.storage.records import BankBusy, BankCorrupt, BankError, Document, crc32
from longmem.storage.schema import now
from longmem.text.passages import PassageCutter, Span

DB_NAME = "bank.db"
LOCK_NAME = "write.lock"
COPYING = "copying:"  # the identity (sha256) prefix of a document being copied from another bank (``copy_document``)


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, None when it does not exist: tells whether a path still names the file opened."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class BankWrites:
    """The writer lock and the writes of a bank; mixed into ``Bank``, which provides ``path``, ``db``, ``name``,
    ``info_cached``, ``dtype``, ``documents``, ``document``, ``kv_files``, ``kv_rows_left``, ``move_kv_to_files`` and
    ``sync_index`` (the last four: ``storage.memory_files``)."""

    path: Path
    db: object  # the bank's sqlite_utils.Database
    _lock_fd: int | None  # the lock file's descriptor while ``writing()`` holds it
    _db_id: tuple[int, int] | None  # ``file_identity`` of the database this handle has open

    # -- the writer lock ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self) -> Iterator["BankWrites"]:
        """Hold the bank's write lock (an advisory file lock, released by the OS if the process dies)."""
        if self._lock_fd is not None:  # re-entrant within one Bank
            yield self
            return
        gone = BankError(f"bank {self.name!r} was renamed or deleted since it was opened; open it again")
        try:
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            raise gone from None
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BankBusy(f"bank {self.name!r} is being written by another process; try again when it is "
                           "done") from None
        except ImportError:  # no fcntl (Windows): one writer is the user's responsibility
            pass
        if file_identity(self.path / DB_NAME) != self._db_id:  # the lock must guard the database we have open
            os.close(fd)
            raise gone
        self._lock_fd = fd
        try:
            yield self
        finally:
            self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _require_lock(self) -> None:
        if self._lock_fd is None:
            raise RuntimeError("bank writes must happen inside `with bank.writing():`")

    # -- writing --------------------------------------------------------------------------------------------------
    def add_segment(self, document: dict | int, seq: int, tokens: torch.Tensor, text: str, chunk_chars: np.ndarray,
                    k: torch.Tensor, v: torch.Tensor, resume: tuple[int, int], passages: list[Span] = ()) -> int:
        """Commit one segment in one transaction and return its document id. ``document`` is an existing id, or
        the new document's row (title, source, kind, sha256, options, meta) to create with this first segment.
        tokens (T,); chunk_chars (n_chunks + 1,) chunk boundaries in ``text``; k, v (Hkv, n_chunks * chunk_size, d) for
        the segment's whole chunks; ``resume`` = where the next segment of the document starts in its source;
        ``passages``: the passages this segment's text completed (``passage_cutter``), written in the same
        transaction, with their full-text index."""
        self._require_lock()
        info = self.info_cached
        n_chunks = tokens.numel() // info.chunk_size
        hkv, t, d = k.shape
        if (hkv, t, d) != (info.n_kv_heads, n_chunks * info.chunk_size, info.head_dim) or v.shape != k.shape:
            raise ValueError(f"k/v {tuple(k.shape)} do not fit {n_chunks} chunks of {info.chunk_size} tokens with "
                             f"{info.n_kv_heads} heads of {info.head_dim}")
        if len(chunk_chars) != n_chunks + 1:
            raise ValueError(f"chunk_chars has {len(chunk_chars)} entries for {n_chunks} chunks")
        if self.kv_rows_left():  # a bank made before the K/V files: its older segments' move there first
            self.move_kv_to_files()
        stamp = now()
        with self.db.atomic():
            at = self.db.execute("SELECT coalesce(sum(n_chunks), 0) FROM segments").fetchone()[0]  # committed rows
            if isinstance(document, dict):
                doc_id = self.db["documents"].insert({
                    **document, "options": json.dumps(document["options"], sort_keys=True),
                    "meta": json.dumps(document.get("meta", {})), "status": "ingesting", "created": stamp,
                    "updated": stamp}).last_pk
            else:
                doc_id = document
            tok_b = tokens.to(torch.int32).numpy().tobytes()
            chars_b = np.asarray(chunk_chars, dtype=np.int32).tobytes()
            rows = (hkv, n_chunks, info.chunk_size, d)
            kv_crc = self.kv_files().append(at, k.reshape(rows), v.reshape(rows))  # durable before the commit
            seg_id = self.db["segments"].insert({
                "document_id": doc_id, "seq": seq, "n_tokens": tokens.numel(), "n_chunks": n_chunks,
                "tokens": tok_b, "text": text, "chunk_chars": chars_b,
                "crc32": crc32(tok_b, chars_b, text.encode("utf-8")), "kv_crc32": kv_crc}).last_pk
            bank_passages.insert(self.db, doc_id, seg_id, passages)
            self.db.execute("UPDATE documents SET n_tokens = n_tokens + ?, n_segments = n_segments + 1, "
                            "resume_offset = ?, resume_skip = ?, updated = ? WHERE id = ?",
                            [tokens.numel(), resume[0], resume[1], stamp, doc_id])
            self.db.execute("UPDATE bank SET updated = ? WHERE id = 1", [stamp])
        return doc_id

    def finish_document(self, doc_id: int, passages: list[Span] = ()) -> None:
        """Mark a document complete, with its last ``passages`` (the cutter's ``finish()``), and name the chapter of
        each of its passages (chapters are found in the whole text)."""
        self._require_lock()
        with self.db.atomic():
            last = self.db.execute("SELECT max(id) FROM segments WHERE document_id = ?", [doc_id]).fetchone()[0]
            if passages and last is not None:
                bank_passages.insert(self.db, doc_id, last, passages)
            bank_passages.set_chapters(self.db, doc_id, bank_passages.document_text(self.db, doc_id))
            self.db.execute("UPDATE documents SET status = 'complete', updated = ? WHERE id = ?", [now(), doc_id])

    def copy_document(self, src, doc_id: int, *, title: str | None = None, sha256: str | None = None,
                      passages: bool = True) -> int:
        """Commit a complete document of another bank ``src`` (made with the same backbone, layer and shape) into this
        one, segment by segment through ``add_segment``, without running the model: its tokens, text and keys/values
        as they are there; returns the new document's id. ``title`` and ``sha256`` replace the source document's
        (``sha256`` tells copies of one book apart: a bank holds a file once per identity). ``passages``: cut the
        document's passages now (False: the caller calls ``rebuild_passages`` once, after many copies). Until the
        transaction that marks it complete, the copy's identity is ``COPYING`` + its sha256, so an interrupted copy is
        an unfinished document of its own (to delete), never resumed as an ingestion of the book's file. Needs the
        write lock; the index files are the caller's to bring up to date (``sync_index``)."""
        self._require_lock()
        mine, theirs = self.info_cached, src.info_cached
        shape = ("backbone_sha256", "cached_layer", "chunk_size", "n_kv_heads", "head_dim", "segment_len", "kv_dtype")
        if any(getattr(mine, f) != getattr(theirs, f) for f in shape):
            raise BankError(f"bank {src.name!r} was made with another model or shape than bank {self.name!r}: "
                            + ", ".join(f"{f} {getattr(theirs, f)} vs {getattr(mine, f)}" for f in shape
                                        if getattr(mine, f) != getattr(theirs, f)))
        doc = src.document(doc_id)
        if doc.status != "complete":
            raise BankError(f"document {doc_id} of bank {src.name!r} is not complete ({doc.status}); finish it first")
        identity = sha256 or doc.sha256
        ref: dict | int = {"title": title or doc.title, "source": doc.source, "kind": doc.kind,
                           "sha256": COPYING + identity, "options": doc.options, "meta": doc.meta}
        with contextlib.nullcontext() if src.db is self.db else src.db.atomic():  # one snapshot of another bank
            rows = src.db.execute("SELECT id, seq, tokens, text, chunk_chars FROM segments WHERE document_id = ? "
                                  "ORDER BY seq", [doc_id]).fetchall()
            for sid, seq, tok, text, chars in rows:
                k, v = src.segment_kv(sid)
                ref = self.add_segment(ref, seq, torch.frombuffer(bytearray(tok), dtype=torch.int32), text,
                                       np.frombuffer(chars, dtype=np.int32).copy(), k, v, (0, 0))
        if isinstance(ref, dict):
            raise BankError(f"document {doc_id} of bank {src.name!r} has no segments")
        with self.db.atomic():  # passages, chapters, completion and the document's identity together
            if passages:
                bank_passages.recut(self.db, ref, doc.kind == "demos", True)
            self.finish_document(ref)
            self.db.execute("UPDATE documents SET sha256 = ? WHERE id = ?", [identity, ref])
        return ref

    def passage_cutter(self, doc_id: int | None, demonstrations: bool) -> PassageCutter:
        """The passage cutter for the next segments of a document: a new one (``doc_id`` None), or one that goes on
        where an interrupted ingestion's stored passages end."""
        if doc_id is None:
            return PassageCutter(demonstrations=demonstrations)
        return bank_passages.cutter_for(self.db, doc_id, demonstrations)

    def rebuild_passages(self) -> int:
        """Cut every document's passages again from its stored text and rebuild their full-text index (one
        transaction); returns how many passages there are."""
        with self.writing(), self.db.atomic():
            count = 0
            for doc in self.documents():
                count += bank_passages.recut(self.db, doc.id, doc.kind == "demos", doc.status == "complete")
            bank_passages.rebuild_fts(self.db)
        return count

    def delete_document(self, doc_id: int, progress=None) -> Document:
        """Remove a document and its memory: the other documents' keys and values are copied to the next epoch's K/V
        files (``progress(done, total)`` counts rows), checked against their checksums, and one transaction then
        removes the document and moves the bank to that epoch; the index files are rewritten after."""
        doc = self.document(doc_id)
        with self.writing():
            if self.kv_rows_left():
                self.move_kv_to_files()
            old = self.kv_files()
            new = type(old)(old.folder, old.epoch + 1, old.row_shape, old.dtype)
            kept, runs, at = [], [], 0
            for sid, owner, nc, crc in self.db.execute("SELECT id, document_id, n_chunks, kv_crc32 FROM segments "
                                                       "ORDER BY id").fetchall():
                if owner != doc_id:
                    kept.append((sid, crc))
                    runs.append((at, nc))
                at += nc
            copied = old.compact(runs, new, progress)
            bad = [sid for (sid, crc), got in zip(kept, copied) if got != crc]
            if bad:
                new.remove()
                raise BankCorrupt(f"bank {self.name!r}: the keys/values of segment {bad[0]} do not match their "
                                  f"checksum; nothing was deleted. Run `longmem bank verify {self.name}`")
            with self.db.atomic():
                self.db.execute("DELETE FROM passages WHERE document_id = ?", [doc_id])
                self.db.execute("DELETE FROM segments WHERE document_id = ?", [doc_id])
                self.db.execute("DELETE FROM documents WHERE id = ?", [doc_id])
                self.db.execute("UPDATE bank SET epoch = epoch + 1, updated = ? WHERE id = 1", [now()])
            new.sweep()  # the old epoch's files (a reader that mapped them keeps them until it lets go)
            self.sync_index()
            with contextlib.suppress(sqlite3.OperationalError):  # give the freed pages back to the file system
                self.db.execute("PRAGMA incremental_vacuum")
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return doc
