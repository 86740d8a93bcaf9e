"""``Bank.copy_document``: another bank's document committed as it is there (no model run), the shapes it refuses,
and what an interrupted copy leaves."""

from __future__ import annotations

import pytest
import torch
from test_bank import book, interrupt_after, passage_table, queries, search_all, table
from tiny import tiny_model

from longmem.ingest.pipeline import ingest
from longmem.storage import BankDirectory, BankError
from longmem.storage.writes import COPYING


@pytest.fixture
def model():
    return tiny_model("llama", segment_len=32)


@pytest.fixture
def directory(tmp_path) -> BankDirectory:
    return BankDirectory(tmp_path / "banks")


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "book.txt"
    p.write_text(book(3000))
    return p


def test_a_document_copied_from_another_bank_is_the_same_document(directory, model, text_file, tmp_path):
    """``copy_document`` commits another bank's document as it is there (no model run): the same segments, keys,
    values, passages and chapters, and the same search over its memory."""
    src = directory.create("src", model)
    doc = ingest(src, model, text_file).document
    lib = directory.create("lib", model)
    with lib.writing():
        new = lib.copy_document(src, doc.id, title="Copied")
        lib.sync_index()
    (got,) = lib.documents()
    assert got.id == new and got.title == "Copied" and got.status == "complete" and got.sha256 == doc.sha256
    assert (got.n_segments, got.n_tokens) == (doc.n_segments, doc.n_tokens)
    assert table(lib) == table(src) and passage_table(lib) == passage_table(src)
    q = queries(model)
    for a, b in zip(search_all(src.load_memory(), q), search_all(lib.load_memory(), q)):
        assert torch.equal(a, b)
    assert lib.verify().ok


def test_an_interrupted_copy_is_a_document_of_its_own_not_the_books_ingestion(directory, model, text_file,
                                                                               monkeypatch):
    """A copy cut off after its first segment is left unfinished under ``COPYING`` + the book's sha256: ingesting the
    book's file later makes a whole document of its own, it does not resume the copy (which would append the book
    again after the copied segments)."""
    src = directory.create("src", model)
    doc = ingest(src, model, text_file).document
    lib = directory.create("lib", model)
    real, calls = src.segment_kv, []

    def cut_off(seg_id):
        calls.append(seg_id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(seg_id)
    monkeypatch.setattr(src, "segment_kv", cut_off)
    with lib.writing(), pytest.raises(KeyboardInterrupt):
        lib.copy_document(src, doc.id)
    (partial,) = lib.documents()
    assert partial.status == "ingesting" and partial.sha256 == COPYING + doc.sha256 and partial.n_segments == 1
    book_doc = ingest(lib, model, text_file).document
    assert book_doc.id != partial.id and book_doc.status == "complete" and book_doc.sha256 == doc.sha256
    assert (book_doc.n_segments, book_doc.n_tokens) == (doc.n_segments, doc.n_tokens)
    assert lib.document(partial.id).n_segments == 1 and lib.verify().ok


def test_a_document_of_another_shape_or_unfinished_is_not_copied(directory, model, text_file, tmp_path):
    src = directory.create("src", model)
    doc = ingest(src, model, text_file).document
    other = directory.create("other", tiny_model("llama", segment_len=16))
    with other.writing(), pytest.raises(BankError, match="segment_len 32 vs 16"):
        other.copy_document(src, doc.id)
    half = directory.create("half", model)
    with pytest.raises(KeyboardInterrupt):
        ingest(half, model, text_file, progress=interrupt_after(2))
    lib = directory.create("lib", model)
    with lib.writing(), pytest.raises(BankError, match="not complete"):
        lib.copy_document(half, half.documents()[0].id)
    assert lib.documents() == [] and other.documents() == []
