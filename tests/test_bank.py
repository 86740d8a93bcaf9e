"""Persistent banks with the real SQLite and faiss on tiny backbones: round trips, crashes, corruption, concurrency."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch
from helpers import child_env
from tiny import small_config, tiny_llama, tiny_model

from longmem.ingest.pipeline import cut_segments, ingest
from longmem.ingest.readers import Block
from longmem.model.longmem import LongMemModel
from longmem.storage import BankBusy, BankCorrupt, BankDirectory, BankError, BankExists, BankMismatch, UnknownBank
from longmem.text.io import InputError

TESTS = Path(__file__).parent
WORDS = ("the old house stood by the river and every night the lamps were lit again while the boat drifted "
         "past the mill towards a sea nobody in the village had ever seen\n").split(" ")


def book(n_chars: int, seed: int = 0) -> str:
    g = torch.Generator().manual_seed(seed)
    out, size = [], 0
    while size < n_chars:
        w = WORDS[int(torch.randint(len(WORDS), (1,), generator=g))]
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


@pytest.fixture
def model() -> LongMemModel:
    return tiny_model("llama", segment_len=32)


@pytest.fixture
def directory(tmp_path) -> BankDirectory:
    return BankDirectory(tmp_path / "banks")


@pytest.fixture
def text_file(tmp_path) -> Path:
    p = tmp_path / "book.txt"
    p.write_text(book(3000))
    return p


def queries(model, n: int = 24, seed: int = 1) -> torch.Tensor:
    spec = model.backbone.spec
    return torch.randn(1, spec.n_heads, n, spec.head_dim, generator=torch.Generator().manual_seed(seed))


def interrupt_after(n: int, seen: list | None = None):
    """A progress callback that presses Ctrl-C after ``n`` segments (recording (done, total) in ``seen``)."""
    seen = [] if seen is None else seen

    def progress(done, total, tokens):
        seen.append((done, total))
        if len(seen) == n:
            raise KeyboardInterrupt
    return progress


def search_all(memory, q):
    """A search's keys, values, mask and chunk serials (B, H, T, n), and for each serial the first serial in
    ``memory`` of a chunk with the same keys and values (-1 for none): two searches that retrieve twins of one chunk
    (which attention cannot tell apart) have the same; a wrong numbering of the chunks differs."""
    r = memory.search(q, n_chunks=4)
    first = []
    for row in memory.rows:
        kv = torch.cat([row.k[:, :row.n], row.v[:, :row.n]]).transpose(0, 1).reshape(row.n, -1)  # (n, 2 Hkv C d)
        _, inverse = torch.unique(kv.float(), dim=0, return_inverse=True)
        lowest = torch.full((row.n,), row.n, dtype=torch.int64).scatter_reduce(0, inverse, torch.arange(row.n), "amin")
        first.append(torch.cat([lowest[inverse] + row.evicted, torch.tensor([-1])]))  # position -1 -> -1
    twins = torch.stack([f[torch.where(ids >= 0, ids - row.evicted, -1)]
                         for f, ids, row in zip(first, r.chunk_ids, memory.rows)])
    return r.keys, r.values, r.mask, r.chunk_ids, twins


def same_chunks(a, b) -> bool:
    """Whether two ``search_all`` results retrieved the same chunks for every query, in any order and either of two
    chunks with the same keys and values: a search by float32 matrix product and faiss's may order near-equal scores
    apart and keep another of equal ones (the tiny models' banks hold such twins); attention over the retrieved keys
    depends on neither."""
    n = a[3].shape[-1]
    if a[3].shape != b[3].shape:
        return False
    if not torch.equal(a[4].sort(dim=-1).values, b[4].sort(dim=-1).values):  # the same chunks, up to twins
        return False

    def canonical(found):  # the chunks of each query ordered by their keys' sum, then by their serial
        keys, values, mask, ids, _ = found
        chunks = [t.reshape(*t.shape[:3], n, -1) for t in (keys, values, mask)]  # (B, H, T, n, C * ...)
        order = ids.argsort(dim=-1, stable=True)
        sums = chunks[0].double().sum(-1).gather(-1, order)
        order = order.gather(-1, sums.argsort(dim=-1, stable=True))
        return [t.gather(3, order[..., None].expand(*order.shape, t.shape[-1])) for t in chunks]
    return all(torch.equal(x, y) for x, y in zip(canonical(a), canonical(b)))


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes as a bank before the K/V files stored them (and as ``table`` compares them)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def table(bank, sql: str | None = None):
    """The rows of ``sql``; by default each segment's (seq, n_tokens, tokens, text, chunk_chars, keys' bytes, values'
    bytes), its keys/values wherever the bank keeps them."""
    if sql is not None:
        return bank.db.execute(sql).fetchall()
    rows = bank.db.execute("SELECT id, seq, n_tokens, tokens, text, chunk_chars FROM segments ORDER BY id").fetchall()
    return [(*r[1:], *(tensor_bytes(t) for t in bank.segment_kv(r[0]))) for r in rows]


def segment_row(bank, sid: int) -> int:
    """The first row of segment ``sid`` in the bank's K/V files."""
    return bank.db.execute("SELECT coalesce(sum(n_chunks), 0) FROM segments WHERE id < ?", [sid]).fetchone()[0]


def as_made_before_kv_files(directory, name: str) -> None:
    """Turn bank ``name`` into what a LongMem before the K/V files wrote (schema 5): each segment's keys/values as a
    SQLite ``kv`` row of (Hkv, n_chunks * C, d) blobs, no ``kv_crc32`` column, no K/V files (and no classifier
    heads, which came later)."""
    with directory.open(name) as bank:
        rows = [(sid, *(tensor_bytes(t) for t in bank.segment_kv(sid)))
                for (sid,) in bank.db.execute("SELECT id FROM segments ORDER BY id").fetchall()]
        paths = bank.kv_files().paths
    with sqlite3.connect(directory.path(name) / "bank.db") as conn:
        conn.executemany("INSERT INTO kv (segment_id, k, v, crc32) VALUES (?, ?, ?, ?)",
                         [(sid, k, v, zlib.crc32(v, zlib.crc32(k))) for sid, k, v in rows])
        conn.execute("ALTER TABLE segments DROP COLUMN kv_crc32")
        conn.execute("ALTER TABLE classifiers DROP COLUMN head")  # migration 7
        conn.execute("DELETE FROM migrations WHERE id >= 6")
    for path in paths:
        path.unlink()


def passage_table(bank):
    """The passages with the seq of the segment that completed each, and the ids the full-text index holds."""
    rows = table(bank, "SELECT s.seq, p.char_start, p.char_end, p.n_tokens, p.chapter, p.text FROM passages p "
                       "JOIN segments s ON s.id = p.segment_id ORDER BY p.id")
    indexed = [r[0] for r in table(bank, "SELECT id FROM passages_fts_docsize ORDER BY id")]
    assert indexed == [r[0] for r in table(bank, "SELECT id FROM passages ORDER BY id")]
    return rows


# -- names and the banks directory ---------------------------------------------------------------------------------

def test_create_list_rename_delete(directory, model):
    directory.create("novel", model).close()
    assert directory.names() == ["novel"]
    with pytest.raises(BankExists):
        directory.create("novel", model)
    directory.rename("novel", "gatsby")
    assert directory.names() == ["gatsby"]
    with directory.open("gatsby") as bank:
        assert bank.info.name == "gatsby" and bank.info.cached_layer == model.cached_layer
    directory.delete("gatsby")
    assert directory.names() == []
    with pytest.raises(UnknownBank, match="no bank named 'gatsby'"):
        directory.open("gatsby")


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".hidden", "x" * 65, "..", "a\\b", "/abs", "sp ace"])
def test_bank_names_cannot_escape_the_banks_directory(directory, model, name):
    with pytest.raises(BankError, match="invalid bank name"):
        directory.create(name, model)
    assert not any(directory.root.parent.glob("escape*"))


@pytest.mark.parametrize("title, name", [
    ("The Great Gatsby", "the-great-gatsby"), ("Moby-Dick; or, The Whale", "moby-dick-or-the-whale"),
    ("../../etc/passwd", "etc-passwd"), ("a...b", "a.b"), ("Война и мир", "book"), ("", "book"),
    ("Les Misérables", "les-miserables"),
    ("  .hidden ", "hidden"), ("x" * 200, "x" * 56)])
def test_a_free_name_is_made_from_a_title(directory, title, name):
    assert directory.free_name(title) == name
    directory.path(name)  # valid: it raises for a name that could leave the banks directory


def test_a_taken_name_gets_a_number(directory, model):
    directory.create("gatsby", model).close()
    assert directory.free_name("Gatsby") == "gatsby-2"
    directory.create("gatsby-2", model).close()
    assert directory.free_name("GATSBY") == "gatsby-3"


def test_banks_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGMEM_BANKS_DIR", str(tmp_path / "elsewhere"))
    assert BankDirectory().root == tmp_path / "elsewhere"


# -- ingestion -----------------------------------------------------------------------------------------------------

def test_ingest_stores_tokens_text_and_kv_of_the_whole_file(directory, model, text_file):
    bank = directory.create("b", model, kv_dtype="float32")
    res = ingest(bank, model, text_file)
    text = text_file.read_text()
    ids = model.backbone.tokenizer(text, add_special_tokens=False).input_ids
    assert (res.action, res.tokens, res.document.status) == ("ingested", len(ids), "complete")
    rows = table(bank)
    assert "".join(r[3] for r in rows) == text  # segments tile the text
    stored = torch.cat([torch.frombuffer(bytearray(r[2]), dtype=torch.int32) for r in rows])
    assert stored.tolist() == ids
    # the K/V equal the in-RAM memorize of the same tokens (segment by segment, positions from 0)
    ref = model.new_memory(capacity=None)
    model.memorize(torch.tensor(ids), ref, batch_segments=1)
    mem = bank.load_memory()
    assert len(mem) == len(ref)
    assert torch.allclose(mem.rows[0].k[:, :ref.rows[0].n], ref.rows[0].k[:, :ref.rows[0].n], atol=1e-5)
    assert torch.equal(mem.rows[0].tokens[:ref.rows[0].n], ref.rows[0].tokens[:ref.rows[0].n])
    assert torch.equal(mem.rows[0].starts[:ref.rows[0].n], ref.rows[0].starts[:ref.rows[0].n])  # segment starts
    assert mem.rows[0].starts[:ref.rows[0].n].sum() == len(rows) and mem.max_sinks == model.max_sinks
    bank.close()


def test_round_trip_reopen_gives_identical_retrieval(directory, model, text_file):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    q = queries(model)
    before = search_all(bank.load_memory(), q)
    passage = bank.chunk_text(int(before[3][0, 0, 0, 0]))
    bank.close()
    with BankDirectory(directory.root).open("b") as again:
        mem = again.load_memory()
        after = search_all(mem, q)
        assert mem.dtype == torch.bfloat16
        for a, b in zip(before, after):
            assert torch.equal(a, b)
        assert again.chunk_text(passage.serial) == passage
        assert passage.text and passage.text in text_file.read_text() and passage.document == "book"


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_ingestion_stores_what_the_eager_one_does_within_rounding(tmp_path, text_file, dtype):
    """``ingest(compile=True)``: the full segments run through compiled layers, the last (shorter) one eagerly; the
    same segments, tokens and text are stored, the keys and values within rounding of the eager bank's, and the
    layers are the backbone's own again afterwards."""
    model = tiny_model("llama", segment_len=32, dtype=dtype)
    directory = BankDirectory(tmp_path / "banks")
    with directory.create("eager", model) as eager, directory.create("compiled", model) as compiled:
        ingest(eager, model, text_file)
        ingest(compiled, model, text_file, compile=True)
        a, b = eager.load_memory(), compiled.load_memory()
        ra, rb = a.rows[0], b.rows[0]
        assert ra.n == rb.n > 0 and torch.equal(ra.tokens[: ra.n], rb.tokens[: rb.n])
        # stored as bfloat16: float32 values a hair apart may round to neighbouring bfloat16 numbers; a bfloat16 model
        # differs more (a fused kernel keeps its intermediates in float32, the eager layers round each)
        tol = 1e-2 if dtype == torch.float32 else 0.1
        assert torch.allclose(ra.k[:, : ra.n].float(), rb.k[:, : rb.n].float(), atol=tol, rtol=tol)
        assert torch.allclose(ra.v[:, : ra.n].float(), rb.v[:, : rb.n].float(), atol=tol, rtol=tol)
        assert [d.n_tokens for d in eager.documents()] == [d.n_tokens for d in compiled.documents()]
        assert compiled.verify().ok
    assert all("forward" not in vars(layer) for layer in model.backbone.layers)  # the eager forwards are back


def test_same_file_twice_is_skipped(directory, model, text_file, tmp_path):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    copy = tmp_path / "copy.txt"
    copy.write_bytes(text_file.read_bytes())
    assert ingest(bank, model, copy).action == "skipped"
    assert len(bank.documents()) == 1


def test_delete_document_removes_its_memory(directory, model, text_file, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(book(1000, seed=7))
    bank = directory.create("b", model)
    a = ingest(bank, model, text_file).document
    b = ingest(bank, model, other).document
    n_b = len(bank.load_memory())
    bank.delete_document(a.id)
    mem = bank.load_memory()
    assert [d.id for d in bank.documents()] == [b.id]
    assert len(mem) == n_b - (a.n_tokens // 2) * 2
    assert bank.info.epoch == 1 and bank.verify().ok and bank.verify().notes == []
    assert all(bank.chunk_text(i).document_id == b.id for i in range(0, len(mem) // 2, 7))


def test_interrupted_ingest_resumes_to_the_same_state(directory, model, text_file):
    whole = directory.create("whole", model)
    ingest(whole, model, text_file)
    part = directory.create("part", model)
    with pytest.raises(KeyboardInterrupt):
        ingest(part, model, text_file, progress=interrupt_after(3))
    (doc,) = part.documents()
    assert doc.status == "ingesting" and doc.n_segments == 3
    report = part.verify()
    assert report.ok and "incomplete" in report.notes[0]
    assert ingest(part, model, text_file).action == "resumed"
    assert table(part) == table(whole)
    q = queries(model)
    for a, b in zip(search_all(part.load_memory(), q), search_all(whole.load_memory(), q)):
        assert torch.equal(a, b)


def test_resume_point_survives_block_boundaries(model):
    """Cutting from any recorded resume point reproduces the rest of the segments exactly."""
    text = book(700, seed=3)
    cuts = [0, 97, 301, 456, 700]
    blocks = [Block(text[a:b], a, b) for a, b in zip(cuts, cuts[1:])]  # ASCII: chars == bytes
    tok = model.backbone.tokenizer

    def from_offset(off, skip):
        return list(cut_segments(tok, [b for b in blocks if b.start >= off], 32, 2, skip))

    full = from_offset(0, 0)
    assert "".join(s.text for s in full) == text
    for i, seg in enumerate(full[:-1]):
        rest = from_offset(*seg.resume)
        assert [s.ids.tolist() for s in rest] == [s.ids.tolist() for s in full[i + 1:]]
        assert [s.text for s in rest] == [s.text for s in full[i + 1:]]


# -- bad input: a clear error and nothing stored lost --------------------------------------------------------------

@pytest.mark.parametrize("content,message", [(b"", "empty"), (b"\x00\x01binary\x00", "binary"),
                                             (b"   \n\n\t  \n", "only whitespace")])
def test_bad_files_store_nothing(directory, model, text_file, tmp_path, content, message):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    before = table(bank)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    with pytest.raises(InputError, match=message):
        ingest(bank, model, bad)
    assert table(bank) == before and len(bank.documents()) == 1 and bank.verify().ok


def test_invalid_utf8_is_decoded_with_a_warning(directory, model, tmp_path, caplog):
    p = tmp_path / "latin1.txt"
    p.write_bytes(("Caf\xe9 " * 40).encode("latin-1"))
    with caplog.at_level(logging.WARNING):
        res = ingest(directory.create("b", model), model, p)
    assert res.document.status == "complete" and "not valid UTF-8" in caplog.text


def test_bank_of_another_backbone_or_layout_is_refused(directory, model, text_file):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    for other in (LongMemModel(tiny_llama(seed=1), small_config(segment_len=32)),
                  tiny_model("llama", segment_len=32, chunk_size=4)):
        with pytest.raises(BankMismatch, match="Make a new bank"):
            ingest(bank, other, text_file)
        with pytest.raises(BankMismatch):
            bank.load_memory(other)
    assert len(bank.documents()) == 1


def test_one_writer_at_a_time(directory, model, text_file):
    directory.create("b", model).close()
    first, second = directory.open("b"), directory.open("b")
    with first.writing():
        with pytest.raises(BankBusy, match="another process"):
            ingest(second, model, text_file)
    assert ingest(second, model, text_file).action == "ingested"


@pytest.mark.heavy
def test_huge_text_file_streams_with_bounded_memory(directory, model, tmp_path):
    psutil = pytest.importorskip("psutil")
    big = tmp_path / "huge.txt"
    line = (book(2000) + "\n").encode()
    with open(big, "wb") as f:
        for _ in range(200 * 2**20 // len(line)):
            f.write(line)
    bank = directory.create("b", model)
    rss = psutil.Process().memory_info().rss
    seen = []
    with pytest.raises(KeyboardInterrupt):
        ingest(bank, model, big, progress=interrupt_after(20, seen))
    assert seen[-1][1] >= 199 * 2**20 and seen[-1][0] < 2**20  # started at once, far from reading it all
    assert psutil.Process().memory_info().rss - rss < 100 * 2**20
    assert bank.documents()[0].n_segments == 20


# -- corruption ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncate", "garble", "delete"])
def test_damaged_index_file_is_detected_and_rebuilt(directory, model, text_file, damage, caplog):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    q = queries(model)
    before = search_all(bank.load_memory(), q)
    bank.close()
    (f,) = directory.path("b").glob("keys-1-*.faiss")
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "garble":
        f.write_bytes(data[:100] + bytes(200) + data[300:])
    else:
        f.unlink()
    with caplog.at_level(logging.WARNING), directory.open("b") as bank:
        after = search_all(bank.load_memory(), q)
        assert f.name in caplog.text and "rebuilding" in caplog.text
        assert f.read_bytes() == data  # rewritten, identical to the original
        for a, b in zip(before, after):
            assert torch.equal(a, b)


def test_corrupt_sqlite_is_reported_not_recreated(directory, model, text_file):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    bank.close()
    db = directory.path("b") / "bank.db"
    garbage = b"this is not a database" * 500
    db.write_bytes(garbage)
    with pytest.raises(BankCorrupt, match="not a readable LongMem bank"):
        directory.open("b")
    assert db.read_bytes() == garbage


def test_schemas_migrate_forward_and_a_newer_one_is_refused(directory, model, text_file):
    """A bank written before passages existed (schema 2) gets them, cut from its stored text, when first opened, its
    ``csz`` column renamed ``chunk_size`` and its classifiers a column for their heads."""
    from longmem.storage.schema import MIGRATIONS

    with directory.create("b", model) as bank:
        ingest(bank, model, text_file)
        want = [(r["char_start"], r["char_end"], r["text"]) for r in bank.db.query("SELECT * FROM passages")]
    as_made_before_kv_files(directory, "b")
    db = directory.path("b") / "bank.db"
    with sqlite3.connect(db) as conn:  # as if written at schema 2: opening applies migrations 3 and on
        conn.execute("DELETE FROM migrations WHERE id > 2")
        conn.executescript("DROP TABLE passages_fts; DROP TABLE passages; "
                           "ALTER TABLE bank RENAME COLUMN chunk_size TO csz")
    with directory.open("b") as bank:
        assert bank.info.chunk_size == model.chunk_size
        assert [r[0] for r in bank.db.execute("SELECT id FROM migrations")] == list(range(1, len(MIGRATIONS) + 1))
        assert "head" in bank.db["classifiers"].columns_dict
        got = [(r["char_start"], r["char_end"], r["text"]) for r in bank.db.query("SELECT * FROM passages")]
        assert got == want and len(got) > 3  # the same passages as ingestion cut
        assert len(bank.search_passages(want[2][2], 100)) == len(got) and bank.verify().ok  # its words: in all
    with sqlite3.connect(db) as conn:  # a later LongMem added a migration this one does not know
        conn.execute("INSERT INTO migrations VALUES (?, 'from the future', 'later')", [len(MIGRATIONS) + 1])
    with pytest.raises(BankError, match="newer LongMem .*upgrade longmem"):
        directory.open("b")


@pytest.mark.parametrize("mapped", [False, True])
def test_cut_kv_files_fail_verification_and_loading(directory, model, text_file, mapped):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    files = bank.kv_files()
    with open(files.paths[0], "r+b") as f:  # the keys' file ends inside segment 2
        f.truncate((segment_row(bank, 2) + 1) * files.row_bytes)
    report = bank.verify()
    assert not report.ok and "segment 2" in report.problems[0] and "past the end of the K/V files" in report.problems[0]
    with pytest.raises(BankCorrupt, match="segment 2 are missing" if not mapped else "K/V files do not hold"):
        bank.load_memory(mapped=mapped)


def test_damaged_contents_of_the_right_size_fail_verification(directory, model, text_file):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    files = bank.kv_files()
    with open(files.paths[0], "r+b") as f:  # flip one byte of segment 3's keys
        f.seek(segment_row(bank, 3) * files.row_bytes + 100)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x40]))
    with bank.db.atomic():  # and one character of a segment's text
        bank.db.execute("UPDATE segments SET text = 'X' || substr(text, 2) WHERE id = 4")
    report = bank.verify()
    assert not report.ok
    assert any("segment 3: keys/values damaged" in p for p in report.problems)
    assert any("segment 4 (document 1): token ids or text damaged" in p for p in report.problems)


def test_a_handle_opened_before_a_rename_cannot_write(directory, model, text_file):
    directory.create("x", model).close()
    stale = directory.open("x")
    directory.rename("x", "y")
    directory.create("x", model).close()  # a new bank under the old name
    with pytest.raises(BankError, match="renamed or deleted since it was opened"):
        ingest(stale, model, text_file)
    assert directory.open("x").documents() == [] and directory.open("y").documents() == []


def test_capacity_loads_only_the_newest_chunks_and_quotes_them(directory, model, text_file):
    bank = directory.create("b", model)
    ingest(bank, model, text_file)
    full = bank.load_memory()
    part = bank.load_memory(capacity=200)
    assert len(part) == 200
    assert torch.equal(part.rows[0].k[:, :100], full.rows[0].k[:, full.rows[0].n - 100:full.rows[0].n])
    serial = int(part.search(queries(model), n_chunks=2).chunk_ids[0, 0, 0, 0])
    assert serial >= full.rows[0].n - 100 and bank.chunk_text(serial).text


def test_passages_of_a_memory_loaded_before_a_deletion_are_refused(directory, model, text_file):
    bank = directory.create("b", model)
    doc = ingest(bank, model, text_file).document
    bank.load_memory()
    directory.open("b").delete_document(doc.id)
    with pytest.raises(KeyError, match="load it again"):
        bank.chunk_text(0)


def test_leftovers_of_killed_processes_are_swept(directory, model):
    directory.create("a", model).close()
    dead = directory.root / ".old.deleting-999999999"
    dead.mkdir()
    directory.delete("a")
    assert not dead.exists()


# -- crashes and concurrency, with real processes ------------------------------------------------------------------

WORKER = """
import sys
from tiny import tiny_model
from longmem.storage import BankDirectory
from longmem.ingest.pipeline import ingest
model = tiny_model("llama", segment_len=32)
ingest(BankDirectory(sys.argv[1]).open(sys.argv[2]), model, sys.argv[3])
print("done")
"""


def start_worker(directory, name, path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, str(directory.root), name, str(path)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_segments(directory, name, n, proc, timeout=120.0) -> int:
    con = sqlite3.connect(f"file:{directory.path(name) / 'bank.db'}?mode=ro", uri=True)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            got = con.execute("SELECT count(*) FROM segments").fetchone()[0]
            if got >= n:
                return got
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.005)
    finally:
        con.close()
    raise TimeoutError


@pytest.mark.heavy
def test_kill_9_mid_ingest_leaves_a_bank_that_opens_verifies_and_resumes(directory, model, tmp_path):
    p = tmp_path / "long.txt"
    p.write_text(book(24000))
    directory.create("crash", model).close()
    proc = start_worker(directory, "crash", p)
    wait_for_segments(directory, "crash", 40, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with directory.open("crash") as bank:
        (doc,) = bank.documents()
        assert doc.status == "ingesting" and 40 <= doc.n_segments < 24000 // 32
        report = bank.verify()
        assert report.ok, report.problems
        assert len(bank.load_memory()) == sum(r[1] // 2 * 2 for r in table(bank))
        cut = passage_table(bank)  # what the committed segments completed, indexed
        assert cut and cut[-1][0] < doc.n_segments and cut[-1][2] <= sum(len(r[3]) for r in table(bank))
        assert ingest(bank, model, p).action == "resumed"
        whole = directory.create("whole", model)
        ingest(whole, model, p)
        assert table(bank) == table(whole)
        assert passage_table(bank) == passage_table(whole) and passage_table(bank)[:len(cut)] == cut
        q = queries(model)
        for a, b in zip(search_all(bank.load_memory(), q), search_all(whole.load_memory(), q)):
            assert torch.equal(a, b)


@pytest.mark.heavy
def test_readers_see_consistent_memory_while_a_writer_ingests(directory, model, tmp_path):
    p = tmp_path / "long.txt"
    p.write_text(book(16000, seed=5))
    directory.create("live", model).close()
    proc = start_worker(directory, "live", p)
    wait_for_segments(directory, "live", 5, proc)
    sizes, during = [], 0
    while proc.poll() is None:
        with directory.open("live") as bank:
            assert bank.verify(repair_index=False).ok  # one snapshot: a commit meanwhile is not damage
            mem = bank.load_memory()
            n = len(mem)
            assert n == int(bank.layout.first_chunk[-1]) * 2  # memory holds exactly the chunks of its snapshot
            assert mem.rows[0].indexes[0].ntotal == n // 2
            during += bank.documents()[0].status == "ingesting"
            sizes.append(n)
    out, err = proc.communicate()
    assert proc.returncode == 0 and "done" in out, err
    assert during >= 2 and sizes == sorted(sizes)
    with directory.open("live") as bank:
        assert bank.verify().ok and bank.documents()[0].status == "complete"
        whole = directory.create("whole", model)
        ingest(whole, model, p)
        assert table(bank) == table(whole)


def test_resume_under_other_reading_conditions_is_refused(directory, model, text_file, monkeypatch):
    bank = directory.create("b", model)
    with pytest.raises(KeyboardInterrupt):
        ingest(bank, model, text_file, progress=interrupt_after(2))
    monkeypatch.setattr("longmem.ingest.readers.BLOCK_BYTES", 1024)
    with pytest.raises(BankError, match="cannot resume"):
        ingest(bank, model, text_file)
    assert bank.documents()[0].n_segments == 2


def test_resume_as_another_kind_of_document_is_refused(directory, model, tmp_path):
    """A subtitle file begun as plain text (before .srt had a reader of its own) is not resumed as subtitles: the
    stored offset counts the other stream."""
    cues = "\n\n".join(f"{i}\n00:00:{i:02d},000 --> 00:00:{i:02d},900\n{book(60, seed=i)}" for i in range(1, 40))
    begun = tmp_path / "film.txt"
    begun.write_text(cues)
    bank = directory.create("b", model)
    with pytest.raises(KeyboardInterrupt):
        ingest(bank, model, begun, progress=interrupt_after(1))
    (tmp_path / "film.srt").write_bytes(begun.read_bytes())  # the same file (same sha256) under its own suffix
    with pytest.raises(BankError, match="read another way when it was begun"):
        ingest(bank, model, tmp_path / "film.srt")
    assert [d.kind for d in bank.documents()] == ["text"] and bank.documents()[0].status != "complete"


def test_a_bank_written_by_the_flat_layout_opens_unchanged(tmp_path):
    """``tests/fixtures/banks-flat-layout``: a bank written by the code before the package moved into subpackages
    (commit ae1f5c1, ``longmem.store.Store`` + ``longmem.ingest.ingest`` on ``tiny_model("llama", segment_len=32)``).
    Today's code opens it (a copy: opening may write), verifies it, loads its memory with the same tiny model, finds
    its passages by words and reads its chat."""
    import shutil

    root = tmp_path / "banks"
    shutil.copytree(TESTS / "fixtures" / "banks-flat-layout", root)
    m = tiny_model("llama", segment_len=32)
    with BankDirectory(root).open("old-book") as bank:
        report = bank.verify()
        assert report.ok, report.problems
        [doc] = bank.documents()
        assert (doc.title, doc.status, doc.n_segments) == ("An old book", "complete", 7)
        assert bank.info.chunk_size == m.chunk_size == 2  # its csz column, renamed by migration 4
        bank.check(m)
        memory = bank.load_memory(m)
        assert len(memory) == bank.stats()["chunks"] * m.chunk_size == 108 * 2
        best = bank.passages([bank.search_passages("lighthouse keeper", 1)[0][0]])[0]
        assert "Ezra Vale" in best.text and best.document == "An old book"
        assert [t["content"] for t in bank.chat_turns()] == ["Who kept the lighthouse?", "Ezra Vale."]


def test_a_classifier_saved_under_the_old_chunk_size_name_reads_under_the_new_one(directory, model):
    with directory.create("cls", model) as bank:
        bank.save_classifier("signs", {"spec": {"name": "signs"}, "csz": 2})
        assert bank.classifiers()["signs"] == {"spec": {"name": "signs"}, "chunk_size": 2}
