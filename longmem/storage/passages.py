"""A bank's passages in its SQLite (tables of ``storage.schema`` migration 3): written with their segment, found by
words through the FTS5 full-text index (BM25), found by the chunks memory retrieved, quoted with their place.

Functions take the bank's ``sqlite_utils.Database`` and run inside the caller's transaction (``Bank`` holds the
writer lock and opens it): a passage is committed together with the segment that completed it, and the FTS5 index
follows by triggers in that same transaction, so a crash can never leave the two out of step. The FTS5 index is
derived data: ``rebuild_fts`` makes it again from the passages, as the faiss index files are made again from the
keys.
"""

from __future__ import annotations

import bisect
import re
import sqlite3
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import sqlite_utils

from longmem.storage.schema import FTS_SQL, statements
from longmem.text.chapters import chapter_label
from longmem.text.passages import Chapters, PassageCutter, Span

# Words a question shares with every passage: left out of the full-text query (BM25 weighs them little anyway, but
# an OR over them would make every passage a match).
STOPWORDS = frozenset("""a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had has have having he
her here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now
of off on once only or other our ours ourselves out over own same she should so some such than that the their
theirs them themselves then there these they this those through to too under until up very was we were what when
where which while who whom why will with would you your yours yourself yourselves s t d ll m re ve""".split())
_WORD = re.compile(r"\w+", re.UNICODE)
_BARE_NUMBER = re.compile(r"[IVXLC]+\.?|[0-9]+\.?")  # a chapter heading that is only its number


@dataclass(frozen=True)
class Passage:
    """A passage as a reader is shown it: its text and its place in its document."""

    id: int
    document_id: int
    document: str  # the document's title
    chapter: str | None  # heading of the chapter it starts in, lines joined ("PART TWO I", "VII"; None: before the
    #                      first, or no chapters found): how the reading prompt names the place
    char_start: int  # offsets in the document's text
    char_end: int
    document_chars: int  # the document's length, so ``position`` says where in it the passage is
    text: str
    label: str | None = None  # the chapter as a reader is told it ("Part Two, chapter VII"; None: none, or a bank
    #                           made before labels: then read from ``chapter``)

    @property
    def position(self) -> float:
        """Where the passage starts, as a fraction of its document (0 = its first character)."""
        return self.char_start / self.document_chars if self.document_chars else 0.0

    def place(self) -> str:
        """Where the passage is, as a book names its places, for a reader: "A Lost Lady, Part Two, chapter VII, 83%
        through the book", "The Great Gatsby, chapter III, 31% through the book" (no chapter: title and percentage).
        A bank made before labels has only ``chapter``; ``chapter_label`` reads it ("VII" -> "chapter VII")."""
        where = self.label or (chapter_label(self.chapter) if self.chapter else None)
        return ", ".join(p for p in (self.document, where, f"{self.position:.0%} through the book") if p)

    def prompt_place(self) -> str:
        """Where the passage is, as the reading prompt names it for the model: "The Great Gatsby, chapter III, 31%
        in", the heading as the book prints it ("A Lost Lady, PART TWO I, 57% in"). The answers were measured with
        this wording; the reader's wording (``place``) in the prompt made the app's answers worse (docs/design.md,
        "How a chat answer reads"), so the two differ on purpose."""
        bare = self.chapter is not None and _BARE_NUMBER.fullmatch(self.chapter) is not None
        where = f"chapter {self.chapter.rstrip('.')}" if bare else self.chapter  # "II" -> "chapter II"
        return ", ".join(p for p in (self.document, where, f"{self.position:.0%} in") if p)


# -- writing ----------------------------------------------------------------------------------------------------------
def insert(db: sqlite_utils.Database, document_id: int, segment_id: int, spans: Iterable[Span]) -> None:
    """Store passages of a document, completed by the segment ``segment_id`` (inside the caller's transaction)."""
    db["passages"].insert_all({"document_id": document_id, "segment_id": segment_id, "char_start": s.start,
                               "char_end": s.end, "n_tokens": s.n_tokens, "chapter": None, "text": s.text}
                              for s in spans)


def cutter_for(db: sqlite_utils.Database, document_id: int, demonstrations: bool) -> PassageCutter:
    """A cutter that goes on where the document's stored passages end: its tail is the stored text after the last
    passage (what an interrupted ingestion had read but not yet cut)."""
    rows = db.execute("SELECT length(text), text FROM segments WHERE document_id = ? ORDER BY seq",
                      [document_id]).fetchall()
    end = db.execute("SELECT max(char_end) FROM passages WHERE document_id = ?", [document_id]).fetchone()[0] or 0
    text, pos = [], 0
    for n, seg_text in rows:
        if pos + n > end:
            text.append(seg_text[max(0, end - pos):])
        pos += n
    return PassageCutter(end, "".join(text), demonstrations=demonstrations)


def document_text(db: sqlite_utils.Database, document_id: int) -> str:
    """The document's whole text (its segments tile it)."""
    return "".join(r[0] for r in db.execute("SELECT text FROM segments WHERE document_id = ? ORDER BY seq",
                                            [document_id]))


def text_between(db: sqlite_utils.Database, document_id: int, start: int, end: int) -> str:
    """Characters ``start`` to ``end`` of a document's text, reading only the segments that hold them."""
    out, pos = [], 0
    for sid, n in db.execute("SELECT id, length(text) FROM segments WHERE document_id = ? ORDER BY seq",
                             [document_id]).fetchall():
        if pos < end and pos + n > start:
            text = db.execute("SELECT text FROM segments WHERE id = ?", [sid]).fetchone()[0]
            out.append(text[max(0, start - pos):end - pos])
        pos += n
    return "".join(out)


def set_chapters(db: sqlite_utils.Database, document_id: int, text: str) -> None:
    """Name the chapter of every passage of a complete document (chapters need the whole text): ``chapter``, the
    heading of the chapter it starts in (what the prompt names), and ``label``, the chapter its middle character is
    in, as a reader is told it (the cutter does not know chapters: a passage that runs on over a heading is shown
    in the chapter most of it is in)."""
    chapters = Chapters(text)
    rows = db.execute("SELECT id, char_start, char_end FROM passages WHERE document_id = ?", [document_id]).fetchall()
    db.conn.executemany("UPDATE passages SET chapter = ?, label = ? WHERE id = ?",
                        [(chapters.heading(start), chapters.label((start + end) // 2), pid)
                         for pid, start, end in rows])


def recut(db: sqlite_utils.Database, document_id: int, demonstrations: bool, complete: bool) -> int:
    """Cut a document's passages again from its stored text (a bank made before passages existed, or damaged ones);
    returns how many. Each passage goes with the segment in which it ends."""
    db.execute("DELETE FROM passages WHERE document_id = ?", [document_id])
    cutter, count = PassageCutter(demonstrations=demonstrations), 0
    segs = db.execute("SELECT id, n_tokens, text FROM segments WHERE document_id = ? ORDER BY seq",
                      [document_id]).fetchall()
    for i, (sid, n_tokens, text) in enumerate(segs):
        spans = cutter.feed(text, n_tokens)
        if complete and i == len(segs) - 1:
            spans += cutter.finish()
        insert(db, document_id, sid, spans)
        count += len(spans)
    if complete:
        set_chapters(db, document_id, document_text(db, document_id))
    return count


def rebuild_fts(db: sqlite_utils.Database) -> None:
    """Make the full-text index again from the passages (also when it is missing or damaged)."""
    for trigger in ("passages_ai", "passages_ad", "passages_au"):
        db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    db.execute("DROP TABLE IF EXISTS passages_fts")
    for statement in statements(FTS_SQL):
        db.execute(statement)
    db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('rebuild')")


def fts_problems(db: sqlite_utils.Database, deep: bool = False) -> list[str]:
    """What is wrong with the full-text index: missing, damaged, or not indexing exactly the stored passages. Reads
    only, so it can run in a snapshot while another process writes; ``deep`` also runs FTS5's own integrity check
    of the index structure, which is a write statement (hold the writer lock)."""
    try:
        if deep:
            db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('integrity-check')")
        indexed = {r[0] for r in db.execute("SELECT id FROM passages_fts_docsize")}
        db.execute("SELECT count(*) FROM passages_fts WHERE passages_fts MATCH 'the'").fetchone()
    except sqlite3.DatabaseError as e:
        return [f"the full-text index of the passages is missing or damaged ({e})"]
    stored = {r[0] for r in db.execute("SELECT id FROM passages")}
    if indexed != stored:
        return [f"the full-text index holds {len(indexed)} passages, {len(indexed - stored)} of them not stored; "
                f"{len(stored - indexed)} stored passages are not indexed"]
    return []


def layout_problems(db: sqlite_utils.Database) -> list[str]:
    """Passages that do not fit their document: outside its text, overlapping, or missing from a complete one."""
    problems = []
    lengths = dict(db.execute("SELECT document_id, sum(length(text)) FROM segments GROUP BY document_id").fetchall())
    rows = db.execute("SELECT document_id, char_start, char_end FROM passages ORDER BY document_id, char_start")
    prev: tuple[int, int] = (-1, 0)
    for doc, start, end in rows:
        if not 0 <= start < end <= lengths.get(doc, 0):
            problems.append(f"a passage of document {doc} at characters {start}-{end} lies outside its text")
        elif doc == prev[0] and start < prev[1]:
            problems.append(f"passages of document {doc} overlap at character {start}")
        prev = (doc, end)
    with_passages = {r[0] for r in db.execute("SELECT DISTINCT document_id FROM passages")}
    for doc, title in db.execute("SELECT id, title FROM documents WHERE status = 'complete'"):
        if doc not in with_passages and lengths.get(doc, 0) and document_text(db, doc).strip():
            problems.append(f"document {doc} ({title}) has no passages")
    return problems


# -- finding ----------------------------------------------------------------------------------------------------------
def fts_query(question: str) -> str | None:
    """An FTS5 query matching passages that share a content word with ``question`` (each word quoted, OR'd); None
    when it has none."""
    words = [w for w in dict.fromkeys(_WORD.findall(question.lower())) if w not in STOPWORDS]
    return " OR ".join(f'"{w}"' for w in words) or None


def search(db: sqlite_utils.Database, question: str, k: int, labels: list[str] | None = None,
           documents: list[int] | None = None) -> list[tuple[int, float]]:
    """The ``k`` passages whose words best match ``question`` by BM25: (passage id, score), best first (FTS5's
    bm25 is lower for better matches; the score returned is its negation, higher = better). ``labels``: only the
    passages of those chapters (``Passage.label``) are ranked; ``documents``: only those documents' (by id)."""
    query = fts_query(question)
    if query is None or k < 1 or labels == [] or documents == []:
        return []
    within, args = "", [query]
    if labels is not None:
        within = f"AND rowid IN (SELECT id FROM passages WHERE label IN ({','.join('?' * len(labels))})) "
        args += labels
    if documents is not None:
        within += f"AND rowid IN (SELECT id FROM passages WHERE document_id IN ({','.join('?' * len(documents))})) "
        args += [int(d) for d in documents]
    rows = db.execute(f"SELECT rowid, bm25(passages_fts) FROM passages_fts WHERE passages_fts MATCH ? {within}"
                      "ORDER BY bm25(passages_fts) LIMIT ?", [*args, k]).fetchall()
    return [(int(pid), -float(score)) for pid, score in rows]


def of_documents(db: sqlite_utils.Database, documents: list[int]) -> set[int]:
    """Ids of the passages of the documents ``documents``."""
    if not documents:
        return set()
    return {int(r[0]) for r in db.execute(f"SELECT id FROM passages WHERE document_id IN "
                                          f"({','.join('?' * len(documents))})", [int(d) for d in documents])}


def labels(db: sqlite_utils.Database) -> list[str]:
    """The chapter labels the passages carry, each once, in the order they were cut (a bank made before labels: [])."""
    return [r[0] for r in db.execute("SELECT label FROM passages WHERE label IS NOT NULL GROUP BY label "
                                     "ORDER BY min(id)")]


def last_of(db: sqlite_utils.Database, labels: list[str], k: int, documents: list[int] | None = None) -> list[int]:
    """Ids of the last ``k`` passages of the chapters ``labels`` (of the documents ``documents``, when given), the
    last first."""
    if not labels or k < 1 or documents == []:
        return []
    of = "" if documents is None else f"AND document_id IN ({','.join('?' * len(documents))}) "
    return [int(r[0]) for r in db.execute(f"SELECT id FROM passages WHERE label IN ({','.join('?' * len(labels))}) "
                                          f"{of}ORDER BY id DESC LIMIT ?",
                                          [*labels, *[int(d) for d in documents or []], k])]


def fetch(db: sqlite_utils.Database, ids: list[int]) -> list[Passage]:
    """The passages ``ids`` with their places, in the order given (ids no longer stored are left out)."""
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    rows = db.execute(f"SELECT p.id, p.document_id, d.title, p.chapter, p.char_start, p.char_end, p.text, p.label, "
                      f"(SELECT sum(length(s.text)) FROM segments s WHERE s.document_id = p.document_id) "
                      f"FROM passages p JOIN documents d ON d.id = p.document_id WHERE p.id IN ({marks})",
                      list(ids)).fetchall()
    by_id = {r[0]: Passage(id=r[0], document_id=r[1], document=r[2], chapter=r[3], char_start=r[4],
                              char_end=r[5], text=r[6], label=r[7], document_chars=r[8] or 0) for r in rows}
    return [by_id[i] for i in ids if i in by_id]


def texts(db: sqlite_utils.Database, document_id: int | None = None) -> list[tuple[int, str]]:
    """(passage id, text) of every passage, or of one document's, in id order (the order they were cut)."""
    where, args = ("WHERE document_id = ? ", [document_id]) if document_id is not None else ("", [])
    return [(int(p), t) for p, t in db.execute(f"SELECT id, text FROM passages {where}ORDER BY id", args)]


def overlapping(db: sqlite_utils.Database, document_id: int, start: int, end: int) -> list[int]:
    """Ids of the document's passages that share at least one character with characters ``start`` to ``end``."""
    return [int(r[0]) for r in db.execute("SELECT id FROM passages WHERE document_id = ? AND char_start < ? AND "
                                          "char_end > ? ORDER BY id", [document_id, end, start])]


def around(db: sqlite_utils.Database, document_id: int, start: int, end: int, n: int) -> list[int]:
    """Ids of the document's passages sharing a character with characters ``start`` to ``end``, with the ``n`` before
    and the ``n`` after them, in book order."""
    before = [int(r[0]) for r in db.execute("SELECT id FROM passages WHERE document_id = ? AND char_end <= ? "
                                            "ORDER BY char_start DESC LIMIT ?", [document_id, start, n])]
    after = [int(r[0]) for r in db.execute("SELECT id FROM passages WHERE document_id = ? AND char_start >= ? "
                                           "ORDER BY char_start LIMIT ?", [document_id, end, n])]
    return before[::-1] + overlapping(db, document_id, start, end) + after


def segment_chunks(db: sqlite_utils.Database, document_id: int) -> list[tuple[int, int]]:
    """(segment id, chunks) of a document's segments, in order."""
    return [(int(s), int(c)) for s, c in db.execute("SELECT id, n_chunks FROM segments WHERE document_id = ? "
                                                    "ORDER BY seq", [document_id])]

class ChunkPlaces:
    """Which passage holds each chunk of a loaded memory: chunk serial -> (segment, chunk within it) -> character of
    its document -> the passage starting at or before it. Built from the bank's layout at load time."""

    def __init__(self, db: sqlite_utils.Database, segment_ids: np.ndarray, first_chunk: np.ndarray):
        self.segment_ids, self.first_chunk = segment_ids, first_chunk
        starts, pos, doc_of = {}, {}, {}
        for sid, doc, n in db.execute("SELECT id, document_id, length(text) FROM segments ORDER BY document_id, seq"):
            starts[sid] = pos.get(doc, 0)
            pos[doc] = starts[sid] + n
            doc_of[sid] = doc
        self.segment_start, self.document_of = starts, doc_of
        self.db = db
        self._passages: dict[int, tuple[list[int], list[int]]] = {}  # document -> (passage starts, ids)

    def _document_passages(self, doc: int) -> tuple[list[int], list[int]]:
        if doc not in self._passages:
            rows = self.db.execute("SELECT char_start, id FROM passages WHERE document_id = ? ORDER BY char_start",
                                   [doc]).fetchall()
            self._passages[doc] = ([r[0] for r in rows], [r[1] for r in rows])
        return self._passages[doc]

    def votes(self, hits: dict[int, int]) -> dict[int, int]:
        """Votes per passage id: each retrieved chunk (serial -> times retrieved) votes for the passage holding its
        middle character. Chunks beyond the bank's (a conversation moved into memory) have no passage."""
        out: dict[int, int] = {}
        total = int(self.first_chunk[-1]) if len(self.first_chunk) else 0
        by_segment: dict[int, list[tuple[int, int]]] = {}
        for serial, count in hits.items():
            if 0 <= serial < total:
                s = int(np.searchsorted(self.first_chunk, serial, side="right") - 1)
                by_segment.setdefault(int(self.segment_ids[s]), []).append((serial - int(self.first_chunk[s]), count))
        if not by_segment:
            return out
        marks = ",".join("?" * len(by_segment))
        rows = self.db.execute(f"SELECT id, chunk_chars FROM segments WHERE id IN ({marks})", list(by_segment))
        for sid, blob in rows:
            bounds = np.frombuffer(blob, dtype=np.int32)
            doc = self.document_of[sid]
            starts, ids = self._document_passages(doc)
            for j, count in by_segment[sid]:
                middle = self.segment_start[sid] + (int(bounds[j]) + int(bounds[min(j + 1, len(bounds) - 1)])) // 2
                i = bisect.bisect_right(starts, middle) - 1
                if i >= 0:
                    out[ids[i]] = out.get(ids[i], 0) + count
        return out
