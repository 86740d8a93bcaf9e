"""The memory side of a bank: its K/V files and index files, kept in step with SQLite, and the ``Memory`` restored
from them without running the backbone (``load_memory``). A part of ``Bank`` (``storage.bank``).

The K/V files (``storage.kvfiles``) hold layer m's keys and values, chunk after chunk; a bank made before them keeps a
SQLite ``kv`` row per segment until ``move_kv_to_files`` moves them. The index files (``storage.indexfiles``) hold
each KV head's mean-pooled chunk keys for a prefix of the bank; they are derived data, rebuilt when missing, stale or
corrupt (``sync_index``). A loaded memory's chunks are numbered in segment order; ``layout`` records where each came
from, for quoting them (``Bank.chunk_text``, ``Bank.chunk_places``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from longmem.memory.memory import MAX_SINKS, Memory
from longmem.memory.ranking import INDEX_BLOCK
from longmem.memory.search import StoredKeys, chunk_keys
from longmem.storage.indexfiles import IndexRecord, read_index, write_index
from longmem.storage.kvfiles import HEADROOM_CHUNKS, KVFiles
from longmem.storage.records import BankBusy, BankCorrupt, BankError, tensor_from_bytes
from longmem.storage.schema import now
from longmem.util.cpu import cpu_bf16_features

log = logging.getLogger(__name__)

MAP_MIN_CHUNKS = 65536  # a bank of at least this many chunks (256k tokens at chunk size 4) is loaded mapped
MOVE_BATCH = 32  # segments moved from the kv table to the K/V files per transaction


@dataclass
class _Layout:
    """Where the chunks of a loaded memory come from: chunk serial -> (segment id, chunk within the segment)."""

    epoch: int
    segment_ids: np.ndarray  # (S,)
    first_chunk: np.ndarray  # (S + 1,) cumulative chunk counts


class _Restored(NamedTuple):
    """What one snapshot of a bank restores (``MemoryFiles._restore``)."""

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


class MemoryFiles:
    """The K/V files, the index files and the memory restored from them; mixed into ``Bank``, which provides
    ``path``, ``db``, ``name``, ``info``, ``info_cached``, ``dtype``, ``check`` and the writer lock (``writing``,
    ``_require_lock``: ``storage.writes``)."""

    path: Path
    db: object  # the bank's sqlite_utils.Database
    layout: _Layout | None  # of the last memory loaded (``load_memory``), for quoting its chunks

    # -- index files ----------------------------------------------------------------------------------------------
    def _check_blob(self, segment: int, blob: bytes, n_chunks: int) -> None:
        info = self.info_cached
        want = info.n_kv_heads * n_chunks * info.chunk_size * info.head_dim * self.dtype.itemsize
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
