"""A bank's keys and values in append-only files (``storage.kvfiles``): written, mapped, moved out of SQLite and
compacted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_bank import as_made_before_kv_files, book, queries, same_chunks, search_all, table
from tiny import tiny_model

from longmem.ingest.pipeline import ingest
from longmem.storage import BankBusy, BankCorrupt, BankDirectory, memory_files
from longmem.storage.kvfiles import HEADROOM_CHUNKS, HEADROOM_SHARE, KVFiles, headroom

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture
def model():
    return tiny_model("llama", segment_len=32)


@pytest.fixture
def directory(tmp_path) -> BankDirectory:
    return BankDirectory(tmp_path / "banks")


def text(tmp_path: Path, name: str = "book.txt", n: int = 3000, seed: int = 0) -> Path:
    p = tmp_path / name
    p.write_text(book(n, seed))
    return p


def rows(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(3, n, 4, 8, generator=torch.Generator().manual_seed(seed)).to(dtype)  # (Hkv, n, C, d)


# -- the files -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_appended_rows_read_and_map_back_with_their_checksum(tmp_path, dtype):
    files = KVFiles(tmp_path, 0, (3, 4, 8), dtype)
    k1, v1, k2, v2 = rows(5, dtype, 1), rows(5, dtype, 2), rows(7, dtype, 3), rows(7, dtype, 4)
    c1, c2 = files.append(0, k1, v1), files.append(5, k2, v2)
    assert files.rows_on_disk() == 12 + HEADROOM_CHUNKS  # zero rows of headroom after the committed ones
    assert (files.crc(0, 5), files.crc(5, 7)) == (c1, c2) and c1 != c2
    k, v = files.read(5, 7)
    assert torch.equal(k, k2) and torch.equal(v, v2) and k.is_contiguous()
    mk, mv = files.map(5, 7)  # a mapping that does not start on a page boundary
    assert mk.shape == (3, 7 + HEADROOM_CHUNKS, 4, 8) and mk.dtype == dtype
    assert torch.equal(mk[:, :7], k2) and torch.equal(mv[:, :7], v2) and not mk[:, 7:].any()
    mk[:, 0] = 0  # copy-on-write: this process's pages change, the file does not
    assert torch.equal(files.read(5, 1)[0], k2[:, :1]) and not mk[:, 0].any()


def test_a_killed_writers_tail_is_overwritten_and_the_files_never_shrink(tmp_path):
    files = KVFiles(tmp_path, 0, (3, 4, 8), torch.float32)
    files.append(0, rows(4, torch.float32, 1), rows(4, torch.float32, 1))
    files.append(4, rows(HEADROOM_CHUNKS + 9, torch.float32, 2), rows(HEADROOM_CHUNKS + 9, torch.float32, 2))
    size = files.paths[0].stat().st_size  # the second segment was never committed: a tail
    k3 = rows(2, torch.float32, 3)
    files.append(4, k3, k3)  # the next segment is written where the committed rows end
    assert torch.equal(files.read(4, 2)[0], k3) and files.paths[0].stat().st_size == size
    with pytest.raises(OSError, match="fewer than"):
        files.read(files.rows_on_disk() - 1, 2)  # past the end of the files
    with pytest.raises(FileNotFoundError):
        KVFiles(tmp_path, 1, (3, 4, 8), torch.float32).read(0, 1)  # another epoch's files: none


def test_a_large_banks_files_keep_a_share_of_their_rows_as_headroom(tmp_path):
    files = KVFiles(tmp_path, 0, (1, 1, 1), torch.float32)  # 4-byte rows: many of them, cheaply
    n = 4 * HEADROOM_SHARE * HEADROOM_CHUNKS
    files.append(0, torch.zeros(1, n, 1, 1), torch.zeros(1, n, 1, 1))
    assert headroom(n) == n // HEADROOM_SHARE > HEADROOM_CHUNKS and files.rows_on_disk() == n + headroom(n)
    assert files.map(0, n)[0].shape[1] == n + headroom(n)  # all of it is room a mapped memory grows into


def test_compaction_copies_runs_and_their_checksums_to_the_next_epoch(tmp_path):
    old = KVFiles(tmp_path, 0, (3, 4, 8), torch.bfloat16)
    parts = [(rows(n, torch.bfloat16, s), rows(n, torch.bfloat16, s + 10)) for s, n in enumerate((3, 5, 2))]
    at, crcs = 0, []
    for k, v in parts:
        crcs.append(old.append(at, k, v))
        at += k.shape[1]
    new = KVFiles(tmp_path, 1, (3, 4, 8), torch.bfloat16)
    seen = []
    assert old.compact([(0, 3), (8, 2)], new, lambda d, t: seen.append((d, t))) == [crcs[0], crcs[2]]
    assert seen[-1] == (10, 10)
    k, v = new.read(3, 2)
    assert torch.equal(k, parts[2][0]) and torch.equal(v, parts[2][1])
    new.sweep()
    assert not any(p.exists() for p in old.paths) and all(p.exists() for p in new.paths)


# -- a bank on its files ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_a_mapped_bank_retrieves_what_a_copied_one_does(directory, model, tmp_path, kv_dtype):
    bank = directory.create("b", model, kv_dtype=kv_dtype)
    ingest(bank, model, text(tmp_path))
    q = queries(model)
    copied, mapped = bank.load_memory(mapped=False), bank.load_memory(mapped=True)
    assert copied.rows[0].k.is_contiguous() and not mapped.rows[0].k.is_contiguous()  # a view of the files
    assert same_chunks(search_all(copied, q), search_all(mapped, q))
    n = len(mapped)  # a chat adds to a mapped memory: into its headroom, not the files
    before = [p.read_bytes() for p in bank.kv_files().paths]
    spec = model.backbone.spec
    mapped.add(torch.ones(1, spec.n_kv_heads, 8, spec.head_dim), torch.ones(1, spec.n_kv_heads, 8, spec.head_dim))
    assert len(mapped) == n + 8 and [p.read_bytes() for p in bank.kv_files().paths] == before
    mapped.truncate(n)
    assert same_chunks(search_all(copied, q), search_all(mapped, q))
    assert bank.verify().ok


@pytest.mark.parametrize("native", [False, True])  # a CPU that multiplies bfloat16 natively, or not
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_a_mapped_bank_s_memory_holds_no_faiss_index_and_searches_its_index_files_keys(
        directory, model, tmp_path, kv_dtype, native, monkeypatch):
    """A mapped memory reads its chunk keys where its index files lie (``StoredKeys``) and is searched by matrix
    product, over a bfloat16 copy of a bfloat16 bank's keys (multiplied in float32 blocks where bfloat16 is not
    native), a float32 copy of a float32 bank's."""
    monkeypatch.setattr(memory_files, "cpu_bf16_features", lambda: ["avx512_bf16"] if native else [])
    bank = directory.create("b", model, kv_dtype=kv_dtype)
    ingest(bank, model, text(tmp_path))
    q = queries(model)
    copied = bank.load_memory(mapped=False)
    mapped = bank.load_memory(model, mapped=True)  # searched where the model runs: the CPU, named as a device
    row = mapped.rows[0]
    assert copied.rows[0].indexes is not None and row.indexes is None and row.matmul
    assert [tuple(k.shape) for k in row.stored.keys] == [(row.n, model.backbone.spec.head_dim)] * len(row.stored.keys)
    assert same_chunks(search_all(copied, q), search_all(mapped, q))
    assert row.stored is None and row.mirror.dtype == getattr(torch, kv_dtype) and row.upcast is not native


def test_a_mapped_bank_s_memory_searches_approximately_without_a_faiss_index(directory, model, tmp_path):
    """``Memory.approximate`` on a mapped bank's memory (no exact index held): IVF copies made from the chunks' keys;
    comparing every list, it finds what exact search finds."""
    bank = directory.create("b", model)
    ingest(bank, model, text(tmp_path))
    q = queries(model)
    want = search_all(bank.load_memory(mapped=False), q)
    mapped = bank.load_memory(model, mapped=True).approximate(1, probes=10 ** 6)
    assert mapped.rows[0].indexes is None
    assert same_chunks(want, search_all(mapped, q)) and mapped.rows[0].coarse is not None


@pytest.mark.parametrize("repair", [False, True])
def test_a_mapped_bank_whose_index_file_is_missing_pools_the_keys_or_writes_the_file_again(
        directory, model, tmp_path, repair):
    bank = directory.create("b", model)
    ingest(bank, model, text(tmp_path))
    q = queries(model)
    want = search_all(bank.load_memory(mapped=False), q)
    bank.close()
    (f,) = directory.path("b").glob("keys-1-*.faiss")
    data = f.read_bytes()
    f.unlink()
    with directory.open("b") as bank:
        memory = bank.load_memory(mapped=True, repair=repair)
        row = memory.rows[0]
        if repair:  # the file is written again; this once, the memory is made from the indexes it was made with
            assert f.read_bytes() == data and row.stored is None and row.indexes is not None
        else:  # the head whose file is missing is pooled from the chunks' own keys
            assert not f.exists() and row.stored.keys[1].shape[0] == 0 and row.stored.keys[0].shape[0] == row.n
        assert same_chunks(want, search_all(memory, q))
        assert row.indexes is None  # released at the search either way


def test_a_bank_made_before_the_files_moves_into_them_on_first_load(directory, model, tmp_path, monkeypatch):
    with directory.create("b", model) as bank:
        ingest(bank, model, text(tmp_path))
        q = queries(model)
        want = search_all(bank.load_memory(), q)
        stored = table(bank)
    as_made_before_kv_files(directory, "b")
    monkeypatch.setattr(memory_files, "MOVE_BATCH", 2)
    with directory.open("b") as bank:
        n = bank.kv_rows_left()
        assert n > 4 and table(bank) == stored  # read from SQLite as it is
        seen = []

        def stop_after_two_batches(done, total):
            seen.append((done, total))
            if len(seen) == 2:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            bank.load_memory(moving=stop_after_two_batches)
        assert bank.kv_rows_left() == n - 4 and table(bank) == stored and bank.verify().ok  # half moved: consistent
    with directory.open("b") as bank:
        moved = []
        got = search_all(bank.load_memory(moving=lambda d, t: moved.append((d, t))), q)
        assert moved[-1] == (n - 4, n - 4) and bank.kv_rows_left() == 0
        assert table(bank) == stored and bank.verify().ok
        for a, b in zip(want, got):
            assert torch.equal(a, b)


def test_a_bank_another_process_writes_is_read_from_sqlite_as_it_is(directory, model, tmp_path):
    with directory.create("b", model) as bank:
        ingest(bank, model, text(tmp_path))
        q = queries(model)
        want = search_all(bank.load_memory(), q)
    as_made_before_kv_files(directory, "b")
    with directory.open("b") as writer, directory.open("b") as reader, writer.writing():
        with pytest.raises(BankBusy):
            reader.move_kv_to_files()
        got = search_all(reader.load_memory(mapped=True), q)  # mapped asked for: copied, the files are not ready
        assert reader.kv_rows_left() > 0
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_deleting_a_document_compacts_the_files_and_a_reader_keeps_its_mapping(directory, model, tmp_path):
    first, second = text(tmp_path, "a.txt", 2000, 1), text(tmp_path, "b.txt", 2500, 2)
    q = queries(model)
    with directory.create("only", model) as only:
        ingest(only, model, second)
        want = search_all(only.load_memory(), q)
    bank = directory.create("b", model)
    doc = ingest(bank, model, first).document
    ingest(bank, model, second)
    reader = directory.open("b")
    held = reader.load_memory(mapped=True)
    before = search_all(held, q)
    old_paths = bank.kv_files().paths
    bank.delete_document(doc.id)
    assert not any(p.exists() for p in old_paths) and all(p.exists() for p in bank.kv_files().paths)
    assert bank.verify().ok
    assert same_chunks(want, search_all(bank.load_memory(mapped=True), q))
    for a, b in zip(before, search_all(held, q)):  # the reader's mapping of the old files is intact
        assert torch.equal(a, b)
    reader.close()
    bank.close()


def test_a_provisional_segment_leaves_a_tail_the_next_write_overwrites(directory, model, tmp_path):
    bank = directory.create("b", model)
    with bank.provisional():
        ingest(bank, model, text(tmp_path, "try.txt", 1500, 5))
    assert bank.version() == (0, 0) and bank.kv_files().rows_on_disk() > HEADROOM_CHUNKS  # rolled back: a tail
    ingest(bank, model, text(tmp_path))
    with directory.create("fresh", model) as fresh:
        ingest(fresh, model, text(tmp_path))
        assert table(bank) == table(fresh) and bank.verify().ok


def test_an_empty_bank_loads_mapped_or_not(directory, model):
    bank = directory.create("b", model)
    assert len(bank.load_memory(mapped=True)) == 0 == len(bank.load_memory(mapped=False))


@pytest.mark.parametrize("mapped", [False, True])
def test_missing_kv_files_are_named_not_recreated(directory, model, tmp_path, mapped):
    bank = directory.create("b", model)
    ingest(bank, model, text(tmp_path))
    for p in bank.kv_files().paths:
        p.unlink()
    with pytest.raises(BankCorrupt, match="K/V files are missing"):
        bank.load_memory(mapped=mapped)
    assert not any(p.exists() for p in bank.kv_files().paths)
    assert not bank.verify().ok
