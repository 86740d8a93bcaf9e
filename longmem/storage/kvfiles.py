"""A bank's layer-m keys and values on disk, beside its SQLite: two append-only files read where they are.

    <bank dir>/kv-e<epoch>.k   keys,   (N + headroom, Hkv, C, d) in the bank's K/V dtype, chunk after chunk
    <bank dir>/kv-e<epoch>.v   values, the same layout

Chunk n of the bank (chunks in segment-id order, as a loaded memory numbers them) is row n of both files, so a
segment's keys are one contiguous run of rows and appending a segment appends to each file. SQLite stays the record
of what is committed: the files hold the first ``sum(segments.n_chunks)`` rows, each segment's rows checksummed in
its row (``segments.kv_crc32``); rows past that are a killed writer's tail or zeros and are never read. A writer
appends at the committed end (overwriting such a tail), makes the rows durable, then commits the segment; a crash
loses at most the segment in flight, as before.

Opening maps the files copy-on-write (``map``): the memory's keys and values are views of the mapped rows, permuted
to (Hkv, N, C, d), so nothing is read until a search gathers its chunks, and what a chat adds to the memory lands in
private pages (the files never change under a reader). The files are kept ``HEADROOM_CHUNKS`` rows longer than what
is committed, or 1/32 of it (``headroom``; zeros, which most file systems keep as holes), which is the room a mapped
memory has to grow (what a conversation moves into memory) before it is copied into RAM; and the files never shrink:
a reader's mapping is never cut short under it. Removing chunks writes the remaining rows to the next
epoch's files (``compact``); a reader that mapped the old ones keeps them until it lets go.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from pathlib import Path

import numpy as np
import torch

HEADROOM_CHUNKS = 2048  # zero rows kept past the committed ones, at least: room a mapped memory grows into (8k tokens
#                        at chunk size 4) ...
HEADROOM_SHARE = 32  # ... or 1/32 of the committed rows, whichever is more (a conversation with a 10M-token library
#                      moves ~300k tokens into memory before its memory is copied out of the files; sparse on disk)
COPY_ROWS = 65536  # rows copied at a time when compacting or reading a long run


def headroom(rows: int) -> int:
    """Zero rows the files keep past ``rows`` committed ones."""
    return max(HEADROOM_CHUNKS, rows // HEADROOM_SHARE)


def file_names(epoch: int) -> tuple[str, str]:
    """The keys' and values' file names of ``epoch``."""
    return f"kv-e{epoch}.k", f"kv-e{epoch}.v"


class KVFiles:
    """The K/V files of one bank epoch. ``row_shape`` = (Hkv, C, d); ``dtype``: the bank's K/V dtype."""

    def __init__(self, folder: Path, epoch: int, row_shape: tuple[int, int, int], dtype: torch.dtype):
        self.folder, self.epoch, self.row_shape, self.dtype = folder, epoch, tuple(row_shape), dtype
        self.row_bytes = int(np.prod(row_shape)) * torch.empty(0, dtype=dtype).element_size()
        self.paths = tuple(folder / n for n in file_names(epoch))

    def rows_on_disk(self) -> int:
        """Whole rows both files hold (committed or not; 0 when either is missing)."""
        try:
            return min(p.stat().st_size for p in self.paths) // self.row_bytes
        except FileNotFoundError:
            return 0

    # -- writing (the bank's writer only) ----------------------------------------------------------------------------
    def append(self, at: int, k: torch.Tensor, v: torch.Tensor) -> int:
        """Write a segment's keys and values, k, v (Hkv, n, C, d), as rows ``at`` .. ``at + n`` (``at``: the committed
        row count), durably, with the headroom after them; returns their CRC-32 (keys' bytes, then values')."""
        crc, n = 0, k.shape[1]
        for path, t in zip(self.paths, (k, v)):
            data = _rows_bytes(t, self.dtype)
            crc = zlib.crc32(data, crc)
            with _writable(path, truncate=False) as f:
                f.seek(at * self.row_bytes)
                f.write(data)
                _grow(f, (at + n + headroom(at + n)) * self.row_bytes)
        return crc

    def compact(self, runs: list[tuple[int, int]], into: "KVFiles", progress=None) -> list[int]:
        """Copy the row runs (start, n) of these files, in order, to the start of ``into`` (another epoch's, written
        from scratch), durably; returns each run's CRC-32 there, as ``append`` computes it. ``progress(done, total)``
        counts rows copied (each row twice: keys, then values)."""
        crcs = [0] * len(runs)  # keys' bytes first for every run, then values': the order ``append`` checksums
        total, done = 2 * sum(n for _, n in runs), 0
        for src_path, dst_path in zip(self.paths, into.paths):
            with open(src_path, "rb") as src, _writable(dst_path, truncate=True) as dst:
                for i, (start, n) in enumerate(runs):
                    src.seek(start * self.row_bytes)
                    for s in range(0, n, COPY_ROWS):
                        m = min(COPY_ROWS, n - s)
                        data = src.read(m * self.row_bytes)
                        if len(data) != m * self.row_bytes:
                            raise OSError(f"{src_path.name} ends before row {start + s + m}")
                        crcs[i] = zlib.crc32(data, crcs[i])
                        dst.write(data)
                        done += m
                        if progress is not None:
                            progress(done, total)
                _grow(dst, dst.tell() + headroom(dst.tell() // self.row_bytes) * self.row_bytes)
        return crcs

    def remove(self) -> None:
        """Remove these files (a compaction that is given up)."""
        for p in self.paths:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def sweep(self) -> None:
        """Remove the K/V files of every other epoch (a compaction's old files, or a killed one's new ones)."""
        keep = {p.name for p in self.paths}
        for f in [*self.folder.glob("kv-e*.k"), *self.folder.glob("kv-e*.v")]:
            if f.name not in keep:
                with contextlib.suppress(OSError):
                    f.unlink()

    # -- reading ------------------------------------------------------------------------------------------------------
    def read_bytes(self, which: int, start: int, n: int) -> bytes:
        """Rows ``start`` .. ``start + n`` of the keys' (0) or values' (1) file as stored; OSError when the file is
        shorter."""
        with open(self.paths[which], "rb") as f:
            f.seek(start * self.row_bytes)
            data = f.read(n * self.row_bytes)
        if len(data) != n * self.row_bytes:
            raise OSError(f"{self.paths[which].name} holds {self.rows_on_disk()} rows, fewer than {start + n}")
        return data

    def read(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``start`` .. ``start + n`` as k, v (Hkv, n, C, d), copied into RAM (contiguous)."""
        out = []
        for which in range(2):
            flat = torch.frombuffer(bytearray(self.read_bytes(which, start, n)), dtype=self.dtype)
            out.append(flat.view(n, *self.row_shape).permute(1, 0, 2, 3).contiguous())
        return out[0], out[1]

    def crc(self, start: int, n: int) -> int:
        """CRC-32 of rows ``start`` .. ``start + n`` (keys' bytes, then values'), as ``append`` returned it."""
        return zlib.crc32(self.read_bytes(1, start, n), zlib.crc32(self.read_bytes(0, start, n)))

    def map(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``start`` .. ``start + n`` and every row after them the files hold (the headroom: zeros, or rows
        committed since) mapped copy-on-write, as k, v (Hkv, n + room, C, d) views: nothing is read until it is
        used, and writes stay in this process. OSError when the files hold fewer than ``start + n`` rows."""
        for path in self.paths:
            if not path.is_file():
                raise FileNotFoundError(f"no {path}")
        have = self.rows_on_disk()
        if have < start + n:
            raise OSError(f"{self.paths[0].name}: {have} rows on disk, {start + n} committed")
        rows = have - start
        out = []
        for path in self.paths:
            with open(path, "rb") as f:
                if rows == 0:  # an empty mapping is not allowed
                    out.append(torch.empty(self.row_shape[0], 0, *self.row_shape[1:], dtype=self.dtype))
                    continue
                offset = start * self.row_bytes
                base = offset - offset % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a granularity boundary
                mm = mmap.mmap(f.fileno(), offset - base + rows * self.row_bytes, access=mmap.ACCESS_COPY,
                               offset=base)
            if hasattr(mm, "madvise"):  # a search reads scattered rows: no read-ahead around each
                mm.madvise(mmap.MADV_RANDOM)
            flat = torch.frombuffer(mm, dtype=torch.uint8)[offset - base:]  # the tensor keeps the mapping open
            out.append(flat.view(self.dtype).view(rows, *self.row_shape).permute(1, 0, 2, 3))
        return out[0], out[1]


def _rows_bytes(t: torch.Tensor, dtype: torch.dtype) -> bytes:
    """(Hkv, n, C, d) -> the bytes of its n rows (n, Hkv, C, d) in ``dtype``."""
    return t.detach().to("cpu", dtype).permute(1, 0, 2, 3).contiguous().view(torch.uint8).numpy().tobytes()


@contextlib.contextmanager
def _writable(path: Path, truncate: bool):
    """``path`` open for writing anywhere in it (created when missing; emptied first if ``truncate``), made durable
    (fsync) when the block ends without an error."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | (os.O_TRUNC if truncate else 0) | getattr(os, "O_BINARY", 0), 0o644)
    with os.fdopen(fd, "r+b") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def _grow(f, size: int) -> None:
    """Extend the open file ``f`` to ``size`` bytes with zeros; never shrink it (a reader may map past the committed
    rows)."""
    f.flush()
    if os.fstat(f.fileno()).st_size < size:
        f.truncate(size)
