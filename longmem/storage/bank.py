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
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import sqlite_utils
import torch

from longmem.memory.memory import MAX_SINKS, Memory, StoredKeys, chunk_keys
from longmem.memory.ranking import INDEX_BLOCK
from longmem.storage import passages as bank_passages
from longmem.storage.app_records import AppRecords
from longmem.storage.indexfiles import IndexRecord, read_index, write_index
from longmem.storage.integrity import check_segments
from longmem.storage.kvfiles import HEADROOM_CHUNKS, KVFiles
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
    tensor_from_bytes,
)
from longmem.storage.schema import SchemaTooNew, migrate, now, pending_migrations
from longmem.storage.writes import DB_NAME, BankWrites, file_identity
from longmem.text.passages import excerpt
from longmem.util.cpu import cpu_bf16_features

log = logging.getLogger(__name__)

KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAP_MIN_CHUNKS = 65536  # a bank of at least this many chunks (256k tokens at chunk size 4) is loaded mapped
MOVE_BATCH = 32  # segments moved from the kv table to the K/V files per transaction

@dataclass
class _Layout:
    """Where the chunks of a loaded memory come from: chunk serial -> (segment id, chunk within the segment)."""

    epoch: int
    segment_ids: np.ndarray  # (S,)
    first_chunk: np.ndarray  # (S + 1,) cumulative chunk counts


class _Restored(NamedTuple):
    """What one snapshot of a bank restores (``Bank._restore``)."""

    epoch: int
    seg_ids: np.ndarray  # (S,)
    seg_chunks: np.ndarray  # (S,)
    first: int  # chunks left out (older than the capacity keeps)
    k: torch.Tensor  # (Hkv, room, C, d), the first n filled
    v: torch.Tensor
    tokens: torch.Tensor  # (room, C) int64
    starts: torch.Tensor  # (room, C) bool
    stored: list  # per KV head: (index file's index or None, chunks it holds)
    mapped: bool  # k and v are views of the mapped K/V files (else copies in RAM)


class Bank(AppRecords, BankWrites):
    """One persistent bank. Reading needs no lock; writing happens inside ``writing()`` (one writer at a time: the
    write path is ``storage.writes``)."""

    def __init__(self, path: Path):
        self.path = path
        self.layout: _Layout | None = None  # of the last memory loaded, for quoting passages
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

    # -- index files ----------------------------------------------------------------------------------------------
    def _check_blob(self, segment: int, blob: bytes, n_chunks: int) -> None:
        info = self.info_cached
        want = info.n_kv_heads * n_chunks * info.chunk_size * info.head_dim * KV_DTYPES[info.kv_dtype].itemsize
        if len(blob) != want:
            raise BankCorrupt(f"bank {self.name!r}: segment {segment} holds {len(blob)} bytes of keys/values, "
                              f"expected {want}; run `longmem bank verify {self.name}`")

    def _index_path(self, head: int, epoch: int, n_chunks: int) -> Path:
        """Index files are versioned by name, so a reader never finds a file newer than the record it read."""
        return self.path / f"keys-{head}-e{epoch}-n{n_chunks}.faiss"

    def _segments(self) -> tuple[np.ndarray, np.ndarray]:
        """Segment ids and their chunk counts, in storage order."""
        rows = self.db.execute("SELECT id, n_chunks FROM segments ORDER BY id").fetchall()
        arr = np.array(rows, dtype=np.int64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def _stored_indexes(self, seg_ids: np.ndarray, seg_chunks: np.ndarray,
                        mapped: bool = False) -> list[tuple[object, int]]:
        """Per head, the index file's index and how many leading chunks of the bank it holds (None, 0 if unusable);
        ``mapped``: read where it lies (``indexfiles.read_index``: to be read only, never added to)."""
        info = self.info
        records = {r["head"]: IndexRecord(**{k: r[k] for k in IndexRecord.__dataclass_fields__})
                   for r in self.db.query("SELECT * FROM index_files")}
        out = []
        for h in range(info.n_kv_heads):
            rec = records.get(h)
            if rec is None:
                out.append((None, 0))
                continue
            covered = int(seg_chunks[seg_ids <= rec.last_segment].sum())
            if rec.epoch != info.epoch or covered != rec.n_chunks:
                log.info("index file %s is stale (bank changed since it was written); rebuilding it", rec.file)
                out.append((None, 0))
                continue
            index = read_index(self.path / rec.file, rec, info.head_dim, mapped)
            out.append((index, rec.n_chunks) if index is not None else (None, 0))
        return out

    def _save_indexes(self, indexes: list, n_chunks: int, last_segment: int, epoch: int) -> None:
        """Write new index files, record them, then remove the files no record names (old versions, and temporary
        files of a writer that was killed)."""
        self._require_lock()
        records = []
        for h, index in enumerate(indexes):
            path = self._index_path(h, epoch, n_chunks)
            digest, size = write_index(index, path)
            records.append({"head": h, "file": path.name, "epoch": epoch, "n_chunks": n_chunks,
                            "last_segment": last_segment, "checksum": digest, "bytes": size, "written": now()})
        with self.db.atomic():
            self.db["index_files"].upsert_all(records, pk="head")
        keep = {r["file"] for r in records}
        for f in [*self.path.glob("keys-*.faiss"), *self.path.glob(".keys-*.tmp-*")]:
            if f.name not in keep:
                with contextlib.suppress(OSError):
                    f.unlink()

    def sync_index(self, rebuild: bool = False) -> dict:
        """Bring the index files up to date with SQLite (appending the chunks they lack, or from scratch when
        ``rebuild`` or when they are missing, corrupt or stale). Needs the write lock. Returns what was done."""
        import faiss

        info = self.info
        with self.writing(), self.db.atomic():  # one snapshot of the bank
            seg_ids, seg_chunks = self._segments()
            total = int(seg_chunks.sum())
            last = int(seg_ids[-1]) if len(seg_ids) else 0
            stored = [(None, 0)] * info.n_kv_heads if rebuild else self._stored_indexes(seg_ids, seg_chunks)
            if all(ix is not None and n == total for ix, n in stored):
                return {"rebuilt": 0, "appended": 0, "chunks": total}
            indexes = [ix if ix is not None else faiss.IndexFlatIP(info.head_dim) for ix, _ in stored]
            starts = [n if ix is not None else 0 for ix, n in stored]
            start = min(starts)
            first_chunk = np.concatenate([[0], np.cumsum(seg_chunks)])
            first = int(np.searchsorted(first_chunk, start, side="right")) - 1  # segment holding chunk `start`
            pos = int(first_chunk[first]) if len(seg_ids) else 0
            from_id = int(seg_ids[first]) if len(seg_ids) and first < len(seg_ids) else last + 1
            for sid, nc in self.db.execute("SELECT id, n_chunks FROM segments WHERE id >= ? ORDER BY id", [from_id]):
                if nc:
                    keys = chunk_keys(self._segment_kv(sid, nc, pos)[0])
                    for h, index in enumerate(indexes):
                        lo = max(starts[h] - pos, 0)
                        if lo < nc:
                            index.add(keys[h, lo:])
                pos += nc
            self._save_indexes(indexes, total, last, info.epoch)
        return {"rebuilt": sum(ix is None for ix, _ in stored), "appended": total - start, "chunks": total}

    # -- the K/V files ----------------------------------------------------------------------------------------------
    def kv_files(self) -> KVFiles:
        """The K/V files of the bank's current epoch (``storage.kvfiles``)."""
        info = self.info_cached
        return KVFiles(self.path, self.info.epoch, (info.n_kv_heads, info.chunk_size, info.head_dim), self.dtype)

    def kv_rows_left(self) -> int:
        """Segments whose keys/values are still SQLite ``kv`` rows (a bank made before the K/V files)."""
        return int(self.db.execute("SELECT count(*) FROM kv").fetchone()[0])

    def _segment_kv(self, sid: int, n_chunks: int, at: int, files: KVFiles | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment ``sid``'s keys and values (Hkv, n_chunks, C, d), from its ``kv`` row or else from the K/V files'
        rows ``at`` .. (its place in chunk order); ``BankCorrupt`` when they are not there in full."""
        info = self.info_cached
        row = self.db.execute("SELECT k, v FROM kv WHERE segment_id = ?", [sid]).fetchone()
        shape = (info.n_kv_heads, n_chunks, info.chunk_size, info.head_dim)
        if row is not None:
            for blob in row:
                self._check_blob(sid, blob, n_chunks)
            return tuple(tensor_from_bytes(b, self.dtype).view(shape).clone() for b in row)
        try:
            return (files or self.kv_files()).read(at, n_chunks)
        except FileNotFoundError:
            raise  # the files of another epoch, or none: the caller decides
        except OSError as e:
            raise BankCorrupt(f"bank {self.name!r}: the keys/values of segment {sid} are missing ({e}); run "
                              f"`longmem bank verify {self.name}`") from None

    def segment_kv(self, sid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment ``sid``'s keys and values, k, v (Hkv, n_chunks * C, d), wherever they are stored."""
        info = self.info_cached
        with self.db.atomic():
            row = self.db.execute("SELECT n_chunks, (SELECT coalesce(sum(n_chunks), 0) FROM segments WHERE id < ?) "
                                  "FROM segments WHERE id = ?", [sid, sid]).fetchone()
            if row is None:
                raise BankError(f"bank {self.name!r} has no segment {sid}")
            k, v = self._segment_kv(sid, row[0], row[1])
        return tuple(t.reshape(info.n_kv_heads, -1, info.head_dim) for t in (k, v))

    def move_kv_to_files(self, progress=None) -> int:
        """Move the keys/values a bank made before the K/V files keeps in SQLite into them, in segment order,
        ``MOVE_BATCH`` segments a transaction (a kill loses nothing: the next call goes on where this one stopped),
        then give SQLite's pages back. Needs the write lock (``BankBusy`` while another process writes). Returns
        the segments moved; ``progress(done, total)`` counts them."""
        with self.writing():
            left = self.kv_rows_left()
            if not left:
                return 0
            files = self.kv_files()
            files.sweep()
            seg = self.db.execute("SELECT id, n_chunks, kv_crc32 FROM segments ORDER BY id").fetchall()
            moved_before = [r[2] is not None for r in seg]
            if any(b and not a for a, b in zip(moved_before, moved_before[1:])):
                raise BankCorrupt(f"bank {self.name!r}: its K/V files do not hold a prefix of its segments; run "
                                  f"`longmem bank verify {self.name}`")
            at = sum(nc for (_, nc, crc) in seg if crc is not None)
            todo = [(sid, nc) for sid, nc, crc in seg if crc is None]
            for b in range(0, len(todo), MOVE_BATCH):
                with self.db.atomic():
                    for sid, nc in todo[b:b + MOVE_BATCH]:
                        k, v = self._segment_kv(sid, nc, at)
                        crc = files.append(at, k, v)
                        self.db.execute("UPDATE segments SET kv_crc32 = ? WHERE id = ?", [crc, sid])
                        self.db.execute("DELETE FROM kv WHERE segment_id = ?", [sid])
                        at += nc
                if progress is not None:
                    progress(min(b + MOVE_BATCH, len(todo)), len(todo))
            with contextlib.suppress(sqlite3.OperationalError):  # give the freed pages back to the file system
                self.db.execute("PRAGMA incremental_vacuum")
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            log.info("bank %s: moved the keys/values of %d segments into its K/V files", self.name, len(todo))
            return len(todo)

    # -- reading --------------------------------------------------------------------------------------------------
    def load_memory(self, model=None, *, capacity: int | None = None,
                    search_device: str | torch.device | None = "model", repair: bool = True, progress=None,
                    mapped: bool | None = None, moving=None) -> Memory:
        """Restore the bank's memory without running the backbone. A large bank's keys and values (``mapped``; None:
        from ``MAP_MIN_CHUNKS`` chunks on) are its K/V files mapped copy-on-write, read only where a search gathers, and
        its chunk keys are read where its index files lie (mapped, ``StoredKeys``): such a memory holds no faiss index,
        is searched by matrix product on every CPU (over a bfloat16 copy of a bfloat16 bank's keys, multiplied in
        float32 blocks where bfloat16 is not native) and its copy is made at the first search. A small one's keys and
        values are copied into RAM (peak RAM ~ the K/V size plus the indexes), its indexes read from the index files.
        Index files are checked, and whatever they lack is added from the keys. With ``model``, first refuse a model
        the bank was not built for (``BankMismatch``). ``search_device``: where the memory is searched ("model": on
        the model's GPU when it runs on one; None: on the CPU). ``repair`` rewrites missing or stale index files, and
        moves a bank's keys/values out of SQLite into its K/V files (``move_kv_to_files``; ``moving(done, total)``
        counts segments), when no other process is writing. ``progress(done, total)`` counts chunks restored."""
        import faiss

        if model is not None:
            self.check(model)
        if repair and self.kv_rows_left():
            try:
                self.move_kv_to_files(moving)
            except BankBusy:
                log.info("bank %s is being written; its keys/values are read from SQLite", self.name)
        d = self.info_cached.head_dim
        for attempt in range(3):  # a snapshot whose K/V files a deletion replaced meanwhile is read again
            try:
                epoch, seg_ids, seg_chunks, first, k, v, tokens, starts, stored, mapped = self._restore(
                    capacity, mapped, progress)
                break
            except FileNotFoundError as e:
                if attempt == 2:
                    raise BankCorrupt(f"bank {self.name!r}: its K/V files are missing ({e}); restore the bank from a "
                                      "backup or delete it") from None
        total = int(seg_chunks.sum())
        n = total - first
        self.layout = _Layout(epoch, seg_ids, np.concatenate([[0], np.cumsum(seg_chunks)]))
        if search_device == "model":
            search_device = None if model is None else model.backbone.device
        max_sinks = MAX_SINKS if model is None else model.max_sinks
        stale = first == 0 and any(ix is None or done < total for ix, done in stored)  # index files to write again
        # a mapped memory is searched by matrix product on every CPU, over a bfloat16 copy of a bfloat16 bank's chunk
        # keys, multiplied in float32 blocks where bfloat16 is not native (as fast as a float32 copy, half its RAM:
        # docs/design.md)
        native = bool(cpu_bf16_features())
        if mapped and not (repair and stale):  # the keys as the index files hold them; the rest pooled at the search
            stored_keys = StoredKeys([torch.zeros(0, d) if ix is None or done == 0 else
                                      torch.from_numpy(faiss.rev_swig_ptr(ix.get_xb(), done * d)).view(done, d)
                                      for ix, done in stored], owner=[ix for ix, _ in stored])
            return Memory.from_chunks(k, v, tokens, n=n, first_serial=first, capacity=capacity,
                                      search_device=search_device, starts=starts, max_sinks=max_sinks,
                                      native_bf16=native, stored_keys=stored_keys)
        indexes = []
        for h, (index, done) in enumerate(stored):
            if index is None:
                index = faiss.IndexFlatIP(d)
            elif mapped:  # a mapped index is never added to: copied first (a bank whose index files are behind)
                owned = faiss.IndexFlatIP(d)
                if done:
                    owned.add(faiss.rev_swig_ptr(index.get_xb(), done * d).reshape(done, d))
                index = owned
            for s in range(done, n, INDEX_BLOCK):
                index.add(chunk_keys(k[h:h + 1, s:min(s + INDEX_BLOCK, n)])[0])
            indexes.append(index)
        if repair and stale:
            try:
                with self.writing():
                    if self.info.epoch == epoch:
                        self._save_indexes(indexes, total, int(seg_ids[-1]) if len(seg_ids) else 0, epoch)
            except BankBusy:
                log.info("bank %s is being written; its index files will be brought up to date by the writer",
                         self.name)
        if not mapped:
            return Memory.from_chunks(k, v, tokens, indexes, n=n, first_serial=first, capacity=capacity,
                                      search_device=search_device, starts=starts, max_sinks=max_sinks)
        memory = Memory.from_chunks(k, v, tokens, indexes, n=n, first_serial=first, capacity=capacity,
                                    search_device=search_device, starts=starts, max_sinks=max_sinks, matmul=True,
                                    native_bf16=native)
        return memory.release_indexes()  # its search copy alone stays in RAM once made (docs/design.md)

    def _restore(self, capacity: int | None, mapped: bool | None, progress) -> "_Restored":
        """One consistent snapshot of the bank's memory (``load_memory`` less the indexes it builds): the keys and
        values mapped or copied, the token ids, the sinks and the index files usable as they are."""
        info, dtype = self.info_cached, self.dtype
        hkv, chunk_size, d = info.n_kv_heads, info.chunk_size, info.head_dim
        with self.db.atomic():  # a read transaction: one consistent snapshot while a writer may be ingesting
            epoch = self.info.epoch
            files = self.kv_files()
            seg_ids, seg_chunks = self._segments()
            total = int(seg_chunks.sum())
            first = 0 if capacity is None else max(0, total - capacity // chunk_size)  # older ones: evicted
            n = total - first
            mapped = (n >= MAP_MIN_CHUNKS) if mapped is None else mapped
            if mapped and (n == 0 or self.kv_rows_left()):
                mapped = False  # nothing to map, or some keys/values are still SQLite rows: copied, as they are
            if mapped:
                try:
                    k, v = files.map(first, n)  # (Hkv, n + headroom, C, d) views of the files
                except FileNotFoundError:
                    raise
                except OSError as e:
                    raise BankCorrupt(f"bank {self.name!r}: its K/V files do not hold its {total} chunks ({e}); "
                                      f"run `longmem bank verify {self.name}`") from None
                room = k.shape[1]
            else:
                room = n + HEADROOM_CHUNKS  # what chat adds later fits without a reallocation
                k = torch.empty(hkv, room, chunk_size, d, dtype=dtype)
                v = torch.empty_like(k)
            tokens = torch.full((room, chunk_size), -1, dtype=torch.int64)
            starts = torch.zeros(room, chunk_size, dtype=torch.bool)  # each segment was encoded alone: its first token
            pos, at, skipped = 0, 0, 0
            rows = self.db.execute("SELECT id, n_chunks, tokens FROM segments ORDER BY id")
            for sid, nc, tok_blob in rows:
                at += nc  # chunks before the next segment
                if skipped + nc <= first:  # entirely older than the capacity keeps
                    skipped += nc
                    continue
                if nc:
                    if len(tok_blob) < 4 * nc * chunk_size:
                        raise BankCorrupt(f"bank {self.name!r}: segment {sid} has {len(tok_blob) // 4} token ids for "
                                          f"{nc} chunks; run `longmem bank verify {self.name}`")
                    drop = max(0, first - skipped)  # the part of a segment that is older than the capacity keeps
                    skipped += drop
                    take = nc - drop
                    if not mapped:
                        sk, sv = self._segment_kv(sid, nc, at - nc, files)
                        k[:, pos:pos + take], v[:, pos:pos + take] = sk[:, drop:], sv[:, drop:]
                    toks = tensor_from_bytes(tok_blob, torch.int32)[: nc * chunk_size]
                    tokens[pos:pos + take] = toks.view(nc, chunk_size)[drop:]
                    starts[pos, 0] = drop == 0  # is an attention sink (see longmem.memory.memory)
                    pos += take
                if progress is not None:
                    progress(pos, n)
            if pos != n:
                raise BankCorrupt(f"bank {self.name!r}: {n - pos} chunks have no keys/values stored")
            # index files hold every chunk from the first: usable only when nothing was left out
            stored = self._stored_indexes(seg_ids, seg_chunks, mapped) if first == 0 else [(None, 0)] * hkv
        return _Restored(epoch, seg_ids, seg_chunks, first, k, v, tokens, starts, stored, mapped)

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
