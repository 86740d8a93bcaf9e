"""The SQLite schema of a memory bank: append-only migrations, each applied once in its own transaction.

A bank's ``migrations`` table records which have run; opening a bank applies the ones it lacks, and a bank written
by a newer LongMem (more migrations than this one knows) is refused rather than guessed at.

Passages (migration 3) are the documents' text cut into sentence-bounded spans (``longmem.text.passages``), each written
in the transaction of the segment that completed it; ``passages_fts`` is an FTS5 full-text index over their text,
kept in step by triggers inside the same transactions. A bank made before migration 3 gets its passages cut from
the text it already stores when it is first opened for writing (``Bank.rebuild_passages``). Migration 4 renames the
bank row's ``csz`` to ``chunk_size``, the name the code uses.
Migration 6 moves the keys and values out of SQLite's ``kv`` table into append-only files beside it
(``storage.kvfiles``); the rows themselves move the first time the bank is loaded or written
(``Bank.move_kv_to_files``), with progress, and a bank whose rows have not moved yet is read as it is.
"""

from __future__ import annotations

import sqlite3
import time

import sqlite_utils


class SchemaTooNew(Exception):
    """The database has migrations this LongMem does not know."""


# The passages' FTS5 full-text index and the triggers that keep it in step with them: part of migration 3, and what
# ``bank_passages.rebuild_fts`` creates again. Never edit it (a released migration never changes).
FTS_SQL = """
    CREATE VIRTUAL TABLE passages_fts USING fts5(text, content='passages', content_rowid='id',
                                                 tokenize='porter unicode61 remove_diacritics 2');
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    CREATE TRIGGER passages_au AFTER UPDATE OF text ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, text) VALUES ('delete', old.id, old.text);
        INSERT INTO passages_fts(rowid, text) VALUES (new.id, new.text);
    END;
"""

# Append-only: a released migration is never edited; a new one is added at the end.
MIGRATIONS: list[tuple[str, str]] = [
    ("0001 create", """
        CREATE TABLE bank (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            name TEXT NOT NULL,
            backbone_name TEXT NOT NULL,
            backbone_sha256 TEXT NOT NULL,
            cached_layer INTEGER NOT NULL,
            csz INTEGER NOT NULL,
            n_kv_heads INTEGER NOT NULL,
            head_dim INTEGER NOT NULL,
            segment_len INTEGER NOT NULL,
            kv_dtype TEXT NOT NULL,
            epoch INTEGER NOT NULL DEFAULT 0,
            created TEXT NOT NULL,
            updated TEXT NOT NULL
        );
        CREATE TABLE documents (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            source TEXT NOT NULL,
            kind TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            options TEXT NOT NULL,
            meta TEXT NOT NULL,
            status TEXT NOT NULL,
            n_tokens INTEGER NOT NULL DEFAULT 0,
            n_segments INTEGER NOT NULL DEFAULT 0,
            resume_offset INTEGER NOT NULL DEFAULT 0,
            resume_skip INTEGER NOT NULL DEFAULT 0,
            created TEXT NOT NULL,
            updated TEXT NOT NULL
        );
        CREATE INDEX documents_sha256 ON documents(sha256);
        CREATE TABLE segments (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            document_id INTEGER NOT NULL REFERENCES documents(id),
            seq INTEGER NOT NULL,
            n_tokens INTEGER NOT NULL,
            n_chunks INTEGER NOT NULL,
            tokens BLOB NOT NULL,
            text TEXT NOT NULL,
            chunk_chars BLOB NOT NULL,
            crc32 INTEGER NOT NULL,
            UNIQUE (document_id, seq)
        );
        CREATE TABLE kv (
            segment_id INTEGER PRIMARY KEY REFERENCES segments(id),
            k BLOB NOT NULL,
            v BLOB NOT NULL,
            crc32 INTEGER NOT NULL
        );
        CREATE TABLE index_files (
            head INTEGER PRIMARY KEY,
            file TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            n_chunks INTEGER NOT NULL,
            last_segment INTEGER NOT NULL,
            checksum TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            written TEXT NOT NULL
        );
    """),
    ("0002 chat and classifiers", """
        CREATE TABLE chat_turns (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            passages TEXT NOT NULL DEFAULT '[]',
            created TEXT NOT NULL
        );
        CREATE TABLE classifiers (
            name TEXT PRIMARY KEY,
            spec TEXT NOT NULL,
            created TEXT NOT NULL,
            updated TEXT NOT NULL
        );
    """),
    ("0003 passages and their full-text index", """
        CREATE TABLE passages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            document_id INTEGER NOT NULL REFERENCES documents(id),
            segment_id INTEGER NOT NULL REFERENCES segments(id),
            char_start INTEGER NOT NULL,
            char_end INTEGER NOT NULL,
            n_tokens INTEGER NOT NULL,
            chapter TEXT,
            text TEXT NOT NULL
        );
        CREATE INDEX passages_place ON passages(document_id, char_start);
        CREATE INDEX passages_segment ON passages(segment_id);
    """ + FTS_SQL),
    ("0004 chunk_size spelled out", """
        ALTER TABLE bank RENAME COLUMN csz TO chunk_size;
    """),
    # a passage's place as a reader is shown it ("Part Two, chapter VII"), beside the heading the prompt names
    ("0005 passage labels", """
        ALTER TABLE passages ADD COLUMN label TEXT;
    """),
    # a segment's keys/values in the bank's K/V files (``storage.kvfiles``): the CRC-32 of its rows there; NULL while
    # they are still a ``kv`` row (a bank made before the files, until ``Bank.move_kv_to_files``)
    ("0006 keys and values in files", """
        ALTER TABLE segments ADD COLUMN kv_crc32 INTEGER;
    """),
    # a classifier's fitted head (``tasks.head.Head.to_bytes``: safetensors, its JSON in the file's metadata); NULL
    # until one is fitted
    ("0007 classifier heads", """
        ALTER TABLE classifiers ADD COLUMN head BLOB;
    """),
]


def now() -> str:
    """A timestamp for the schema's created/updated/applied columns."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def pending_migrations(db: sqlite_utils.Database) -> bool:
    """Whether ``db`` lacks some migration; ``SchemaTooNew`` when it has one this LongMem does not know. A database
    without a migrations table was not made by LongMem."""
    if "migrations" not in db.table_names():  # every bank has it from its creation on: this is another database
        raise sqlite3.DatabaseError("not a database made by LongMem (no migrations table)")
    count, newest = db.execute("SELECT count(*), max(id) FROM migrations").fetchone()
    _refuse_newer(newest)
    return count < len(MIGRATIONS)


def _refuse_newer(newest: int | None) -> None:
    if newest is not None and newest > len(MIGRATIONS):
        raise SchemaTooNew(f"was written by a newer LongMem (schema {newest}, this one knows {len(MIGRATIONS)})")


def migrate(db: sqlite_utils.Database) -> None:
    """Apply the migrations ``db`` lacks, each in its own transaction; ``SchemaTooNew`` for a newer schema."""
    with db.atomic():
        db.execute("CREATE TABLE IF NOT EXISTS migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                   "applied TEXT NOT NULL)")
    done = {r[0] for r in db.execute("SELECT id FROM migrations").fetchall()}
    _refuse_newer(max(done, default=None))
    for i, (name, sql) in enumerate(MIGRATIONS, start=1):
        if i in done:
            continue
        with db.atomic():
            for statement in statements(sql):
                db.execute(statement)
            db["migrations"].insert({"id": i, "name": name, "applied": now()})


def statements(sql: str) -> list[str]:
    """The complete SQL statements of a script, in order (a trigger's body keeps its inner semicolons)."""
    out, buf = [], ""
    for piece in sql.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n;"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" \n;"):
        raise ValueError(f"incomplete SQL statement: {buf.strip()[:80]}")
    return out
