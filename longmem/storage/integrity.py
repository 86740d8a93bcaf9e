"""The checks ``Bank.verify`` runs over what a bank stores: every segment's keys/values (in its K/V files, or a SQLite
row for a bank made before them) against its shape and its CRC-32, and each document's recorded totals against its
segments. Read-only; the caller holds one snapshot (``db.atomic()``) so that an ingestion running meanwhile cannot
look like damage."""

from __future__ import annotations

import sqlite_utils

from longmem.storage.kvfiles import KVFiles
from longmem.storage.records import BankInfo, Document, VerifyReport, crc32


def check_segments(db: sqlite_utils.Database, info: BankInfo, itemsize: int, documents: list[Document],
                   report: VerifyReport, files: KVFiles) -> None:
    """Record in ``report`` every segment whose sizes or checksums are wrong (its keys/values read from its ``kv`` row
    or from the K/V ``files``), every document whose totals disagree with its segments (and, as a note, every
    incomplete one), and K/V rows or segments that belong to nothing. ``itemsize``: bytes per stored key/value
    element."""
    per_chunk = info.n_kv_heads * info.chunk_size * info.head_dim * itemsize
    at, in_files = 0, files.rows_on_disk()
    for sid, doc, nt, nc, tok_len, chars_len, kv_crc, k_len, v_len in db.execute(
            "SELECT s.id, s.document_id, s.n_tokens, s.n_chunks, length(s.tokens), length(s.chunk_chars), s.kv_crc32, "
            "length(kv.k), length(kv.v) FROM segments s LEFT JOIN kv ON kv.segment_id = s.id ORDER BY s.id"):
        if kv_crc is not None and k_len is not None:
            report.problem(f"segment {sid} (document {doc}) has keys/values both in SQLite and in the K/V files")
        elif kv_crc is not None:
            if at + nc > in_files:
                report.problem(f"segment {sid} (document {doc}): its keys/values are past the end of the K/V files "
                               f"({in_files} chunks there)")
            elif nc and files.crc(at, nc) != kv_crc:
                report.problem(f"segment {sid}: keys/values damaged (checksum mismatch in the K/V files)")
        elif k_len is None:
            report.problem(f"segment {sid} (document {doc}) has no keys/values")
        elif (k_len, v_len) != (nc * per_chunk, nc * per_chunk):
            report.problem(f"segment {sid} (document {doc}): K/V of {k_len}/{v_len} bytes, expected "
                           f"{nc * per_chunk}")
        at += nc
        if tok_len != 4 * nt or nc != nt // info.chunk_size or chars_len != 4 * (nc + 1):
            report.problem(f"segment {sid} (document {doc}): token/chunk sizes do not agree")
    totals = {r[0]: (r[1], r[2]) for r in db.execute(
        "SELECT document_id, count(*), sum(n_tokens) FROM segments GROUP BY document_id")}
    for doc in documents:
        n, t = totals.pop(doc.id, (0, 0))
        if (n, t) != (doc.n_segments, doc.n_tokens):
            report.problem(f"document {doc.id} ({doc.title}): {n} segments / {t} tokens stored, "
                           f"{doc.n_segments} / {doc.n_tokens} recorded")
        if doc.status != "complete":
            report.notes.append(f"document {doc.id} ({doc.title}) is incomplete ({doc.n_tokens} tokens); "
                                "ingest the same file again to resume")
    for doc_id in totals:
        report.problem(f"{totals[doc_id][0]} segments belong to document {doc_id}, which does not exist")
    for sid, doc, tok_b, chars_b, text, crc in db.execute(
            "SELECT id, document_id, tokens, chunk_chars, text, crc32 FROM segments"):
        if crc32(tok_b, chars_b, text.encode("utf-8")) != crc:
            report.problem(f"segment {sid} (document {doc}): token ids or text damaged (checksum mismatch)")
    for sid, k_b, v_b, crc in db.execute("SELECT segment_id, k, v, crc32 FROM kv"):
        if crc32(k_b, v_b) != crc:
            report.problem(f"segment {sid}: keys/values damaged (checksum mismatch)")
    orphans = db.execute("SELECT count(*) FROM kv WHERE segment_id NOT IN (SELECT id FROM segments)"
                              ).fetchone()[0]
    if orphans:
        report.problem(f"{orphans} K/V rows belong to no segment")
