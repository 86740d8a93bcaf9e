"""What a bank's reads return and the errors it raises: its metadata (``BankInfo``), documents, quoted passages and
``verify``'s report; and how a segment's tensors become the bytes stored in SQLite (with their CRC-32)."""

from __future__ import annotations

import json
import warnings
import zlib
from dataclasses import dataclass, field

import torch


class BankError(Exception):
    """A memory bank that cannot be used as asked; the message says why."""


class UnknownBank(BankError):
    pass


class BankExists(BankError):
    pass


class BankCorrupt(BankError):
    pass


class BankMismatch(BankError):
    """The bank was built with another backbone, layer or chunk size than the model at hand."""


class BankBusy(BankError):
    """Another process is writing to the bank."""


def crc32(*parts: bytes) -> int:
    """CRC-32 of the parts in order: what ``verify`` recomputes to catch damaged contents of the right size."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


def tensor_from_bytes(blob: bytes, dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():  # read-only buffer: callers copy out of it at once
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(blob, dtype=dtype)


@dataclass(frozen=True)
class BankInfo:
    name: str
    backbone_name: str
    backbone_sha256: str
    cached_layer: int  # backbone layer m whose keys/values are stored
    chunk_size: int  # tokens per chunk
    n_kv_heads: int
    head_dim: int
    segment_len: int  # tokens per stored segment (each encoded on its own)
    kv_dtype: str  # storage (and in-RAM) dtype of the keys/values
    epoch: int
    created: str
    updated: str


@dataclass(frozen=True)
class Document:
    id: int
    title: str
    source: str  # file name it came from
    kind: str  # "text" or "demos"
    sha256: str  # of the source file
    options: dict  # how the file was read (demonstration format); part of its identity
    meta: dict  # facts found while reading (pages, label counts, ...)
    status: str  # "ingesting" (interrupted or in progress) or "complete"
    n_tokens: int
    n_segments: int
    resume_offset: int  # byte offset in the source's text stream where the next segment starts
    resume_skip: int  # tokens of the block at resume_offset already stored
    created: str
    updated: str

    @classmethod
    def from_row(cls, row: dict) -> "Document":
        return cls(**{**row, "options": json.loads(row["options"]), "meta": json.loads(row["meta"])})


@dataclass(frozen=True)
class ChunkText:
    """The text of a memory chunk, for quoting: the chunk itself and the chunks around it in its segment."""

    serial: int  # chunk serial in the loaded memory
    document_id: int
    document: str  # title
    text: str  # the chunk, reflowed (``Bank.chunk_text``)
    context: str  # the chunk with the text around it, as a reader is shown it: ``text`` is in it
    segment: int = 0  # which segment of its document (0-based) ...
    of_segments: int = 1  # ... out of how many: where in the book the chunk is
    chunk: int = 0  # which chunk of its segment (0 = the segment's first tokens)


@dataclass
class VerifyReport:
    ok: bool = True
    problems: list[str] = field(default_factory=list)  # damage found
    notes: list[str] = field(default_factory=list)  # facts worth knowing (incomplete ingestions, repaired indexes)

    def problem(self, msg: str) -> None:
        self.ok = False
        self.problems.append(msg)
