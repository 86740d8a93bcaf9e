"""faiss index files: derived data of a persistent bank, written atomically and checked against a checksum.

An index file is the serialised faiss index of one key/value head (its mean-pooled chunk keys). SQLite and the K/V
files hold the truth; an index file is only a cache of them, so every read is verified (size, CRC-32 checksum, entry
count) and anything that does not match is reported as ``None`` for the caller to rebuild from the bank's keys.
(CRC-32 rather than a cryptographic hash: it catches truncation and corruption, and sha256 dominated reopening;
figures in ``docs/design.md``.)
Writes go to a temporary file in the same directory, are fsynced, then renamed over the old file, so a crash leaves
the old file or the new one, never half.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import faiss

from longmem.util.files import write_file_atomic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexRecord:
    """What SQLite remembers about an index file (one row of ``index_files``)."""

    head: int  # key/value head
    file: str  # file name inside the bank directory
    epoch: int  # the bank's epoch when written (bumped whenever chunks are removed)
    n_chunks: int  # entries in the index: the first n_chunks chunks of the bank, in storage order
    last_segment: int  # id of the last segment those chunks come from (0 for none)
    checksum: str  # "crc32:<8 hex digits>" of the file
    bytes: int


def _crc32_file(path: Path, block: int = 8 << 20) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


def write_index(index: faiss.Index, path: Path) -> tuple[str, int]:
    """Serialise ``index`` to ``path`` atomically; returns (checksum, size in bytes) of what was written."""
    data = faiss.serialize_index(index)
    buf = memoryview(data)
    digest = f"crc32:{zlib.crc32(buf):08x}"
    write_file_atomic(path, buf)
    return digest, len(buf)


def read_index(path: Path, record: IndexRecord, dim: int, mapped: bool = False) -> faiss.Index | None:
    """The index at ``path`` if it matches ``record`` (size, checksum, entry count, dimension), else None (logged).
    ``mapped``: the index's keys are read where they lie in the file (mapped read-only, nothing copied); such an index
    is to be searched or read (``faiss.rev_swig_ptr(index.get_xb(), ...)``) only: adding to it or removing from it
    aborts the process (a faiss assertion)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        log.warning("index file %s is missing; rebuilding it from the bank's keys", path.name)
        return None
    problem = None
    if size != record.bytes:
        problem = f"{size} bytes, expected {record.bytes} (truncated or replaced)"
    elif _crc32_file(path) != record.checksum:
        problem = "checksum mismatch (corrupt or stale)"
    else:
        try:
            flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mapped else 0
            index = faiss.read_index(str(path), flags)  # straight from the file: no second copy in RAM
        except RuntimeError as e:
            problem = f"faiss cannot read it ({str(e).splitlines()[0]})"
        else:
            if index.ntotal != record.n_chunks or index.d != dim:
                problem = f"{index.ntotal} entries of dimension {index.d}, expected {record.n_chunks} of {dim}"
            else:
                return index
    log.warning("index file %s does not match its record: %s; rebuilding it from the bank's keys",
                path.name, problem)
    return None
