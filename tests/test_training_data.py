"""Training data: the book split, cached tokenization, the paper's batchfying, and synthetic recall items."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import char_tokenizer
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from longmem.eval.datasets.recall import (
    EVAL_NAMES,
    make_multi_recall_document,
    make_quote_document,
    make_recall_item,
    multi_recall_documents,
    name_word,
    name_words,
    quote_documents,
    recall_as_documents,
    recall_documents,
)
from training.data import Batchfier, Document, book_split, tokenize_files

TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith slipped quickly "
        "through the glass doors of Victory Mansions.\nThe hallway smelt of boiled cabbage and old rag mats! "
        "At one end of it a coloured poster had been tacked to the wall? \"It is,\" he said.\n\n")


# -----------------------------------------------------------------------------
# book split


def test_book_split_real_manifest(shared_data_dir):
    train, test = book_split(shared_data_dir)
    assert (len(train), len(test)) == (43, 8)
    assert not {p.name for p in train} & {p.name for p in test}
    assert "pg64317.txt" in {p.name for p in test}
    assert [p.name for p in train] == sorted(p.name for p in train)
    assert all(p.is_file() for p in train + test)


def _fake_data(tmp_path: Path, rows: list[tuple[str, str]], files: list[str]) -> Path:
    (tmp_path / "books").mkdir()
    for name in files:
        (tmp_path / "books" / name).write_text(TEXT)
    table = "\n".join(f"| {split} | {name} | opening | 100 |" for split, name in rows)
    (tmp_path / "MANIFEST.md").write_text(f"# Data\n\n| split | file | opening | chars |\n|---|---|---|---|\n{table}\n"
                                          "\n| set | files |\n|---|---|\n| SST-2 | train.tsv |\n")
    return tmp_path


def test_book_split_fake_manifest(tmp_path):
    rows = [("train", "b.txt"), ("test", "t.txt"), ("train", "a.txt")]
    data = _fake_data(tmp_path, rows, ["a.txt", "b.txt", "t.txt", "unlisted.txt"])
    train, test = book_split(data)
    assert [p.name for p in train] == ["a.txt", "b.txt"]
    assert test == [data / "books" / "t.txt"]


def test_book_split_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="MANIFEST.md"):
        book_split(tmp_path)
    data = _fake_data(tmp_path, [("train", "a.txt"), ("test", "gone.txt")], ["a.txt"])
    with pytest.raises(FileNotFoundError, match="gone.txt.*missing"):
        book_split(data)


# -----------------------------------------------------------------------------
# tokenization


def test_tokenize_files_pieces_equal_whole(tmp_path, monkeypatch):
    import longmem.eval.datasets.books as data

    tok = char_tokenizer()
    path = tmp_path / "book.txt"
    path.write_text(TEXT * 30)
    monkeypatch.setattr(data, "PIECE_CHARS", 100)  # many pieces, cut at newlines
    assert len(data._pieces(TEXT * 30, 100)) > 10
    (doc,) = tokenize_files([path], tok)
    assert doc.name == "book.txt" and doc.ids.dtype == np.int32
    np.testing.assert_array_equal(doc.ids, tok(TEXT * 30, add_special_tokens=False)["input_ids"])


def test_pieces_cover_text_without_newlines():
    from longmem.eval.datasets.books import _pieces

    text = "x" * 80 + "\n\n\n" + "y" * 80 + "\n" + "z" * 250
    pieces = _pieces(text, 100)
    assert "".join(pieces) == text
    assert pieces[:2] == ["x" * 80 + "\n\n\n", "y" * 80 + "\n"]  # cut after newlines, a run of them kept whole
    assert [len(p) for p in pieces[2:]] == [100, 100, 50]  # no newline in reach: hard cuts


def test_tokenize_files_cache(tmp_path, monkeypatch):
    tok = char_tokenizer()
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text(TEXT)
    paths[1].write_text(TEXT[::-1])
    cache = tmp_path / "cache"
    first = tokenize_files(paths, tok, cache_dir=cache)
    assert len(list(cache.glob("*.npy"))) == 2 and not list(cache.glob("*.tmp"))

    def boom(*args, **kwargs):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(type(tok), "__call__", boom)
    second = tokenize_files(paths, tok, cache_dir=cache)
    for a, b in zip(first, second):
        assert a.name == b.name and b.ids.dtype == np.int32
        np.testing.assert_array_equal(a.ids, b.ids)
    paths[1].write_text(TEXT + "!")  # changed bytes: a different cache entry, so the tokenizer runs again
    with pytest.raises(AssertionError, match="tokenized again"):
        tokenize_files(paths, tok, cache_dir=cache)


# -----------------------------------------------------------------------------
# batchfying


def _docs(lengths: list[int]) -> list[Document]:
    """Document k holds ids k*1000 + position: every token says where it came from."""
    return [Document(f"d{k}", (k * 1000 + np.arange(n)).astype(np.int32)) for k, n in enumerate(lengths)]


LENGTHS = [37, 8, 50, 21, 64, 13, 3, 29, 44, 16]  # with segment_len 4: 9, 2, 12, 5, 16, 3, 0 (dropped), 7, 11, 4


def _segments(b) -> list[tuple[int, int]]:
    """(document, segment) of each row of a batch, read from the token values; checks each lies in one document."""
    out = []
    for row in b.ids.numpy():
        k, pos = divmod(int(row[0]), 1000)
        assert (row == k * 1000 + pos + np.arange(len(row))).all(), "a segment spans two documents"
        assert pos % len(row) == 0, "segments are not aligned to the document start"
        out.append((k, pos // len(row)))
    return out


def test_batchfier_rows_follow_documents():
    bf = Batchfier(_docs(LENGTHS), batch_size=3, segment_len=4, seed=1)
    assert bf.steps_per_epoch > 0
    seen = set()
    prev = None
    for step in range(bf.steps_per_epoch):
        b = bf.batch(step)
        assert b.ids.shape == (3, 4) and b.ids.dtype == torch.int64 and b.reset.dtype == torch.bool
        segs = _segments(b)
        assert b.doc == [f"d{k}" for k, _ in segs]
        for j, (k, s) in enumerate(segs):
            assert (k, s) not in seen, "segment emitted twice in one epoch"
            seen.add((k, s))
            assert bool(b.reset[j]) == (s == 0)  # reset exactly at a document's first segment
            if prev is not None and s > 0:
                assert prev[j] == (k, s - 1), "row does not continue its document"
            if prev is not None and s == 0:  # a row only leaves a document after its last used segment
                assert prev[j][0] != k
        prev = segs
    assert len(seen) == bf.steps_per_epoch * 3 == bf.segments_used
    assert all(k != 6 for k, _ in seen)  # shorter than a segment: dropped


def test_batchfier_answer_marks_travel_with_their_tokens():
    docs = _docs(LENGTHS)
    for d in docs[::2]:  # every other document has recall answers: here, the tokens whose position is a multiple of 3
        d.answers = d.ids % 1000 % 3 == 0
    for cut in (None, 3):  # whole documents, and documents cut into parts of 3 segments
        bf = Batchfier(docs, batch_size=3, segment_len=4, seed=2, max_doc_segments=cut)
        for step in range(bf.steps_per_epoch):
            b = bf.batch(step)
            assert b.answers.shape == b.ids.shape and b.answers.dtype == torch.bool
            k = (b.ids // 1000).numpy()  # (B, L) the document each token came from
            want = (k % 2 == 0) & (b.ids.numpy() % 1000 % 3 == 0)
            assert (b.answers.numpy() == want).all()


def test_batchfier_groups_balanced_and_truncated():
    bf = Batchfier(_docs(LENGTHS), batch_size=3, segment_len=4)
    sizes = sorted(sum(int(bf.n_segments[i]) for i in g) for g in bf.groups)
    assert sizes[-1] - sizes[0] <= max(bf.n_segments)  # greedy balance
    assert bf.steps_per_epoch == sizes[0]
    assert bf.batch(0).reset.all()


def test_batchfier_deterministic_and_iterate():
    a = Batchfier(_docs(LENGTHS), batch_size=2, segment_len=4, seed=7)
    b = Batchfier(_docs(LENGTHS), batch_size=2, segment_len=4, seed=7)
    n = 2 * a.steps_per_epoch + 3
    it = a.iterate()
    for step in range(n):
        x = next(it)
        y = b.batch(step)
        assert x.step == y.step == step
        assert torch.equal(x.ids, y.ids) and torch.equal(x.reset, y.reset) and x.doc == y.doc
    y = b.batch(3)  # random access back into an earlier epoch
    z = next(iter(Batchfier(_docs(LENGTHS), batch_size=2, segment_len=4, seed=7).iterate(3)))
    assert torch.equal(y.ids, z.ids)
    assert next(iter(a)).step == 0


def test_batchfier_ranks_slice_the_global_batch():
    full = Batchfier(_docs(LENGTHS), batch_size=4, segment_len=4, seed=3)
    ranks = [Batchfier(_docs(LENGTHS), batch_size=2, segment_len=4, seed=3, rank=r, world_size=2) for r in range(2)]
    assert all(r.steps_per_epoch == full.steps_per_epoch for r in ranks)
    for step in range(2 * full.steps_per_epoch):
        f = full.batch(step)
        parts = [r.batch(step) for r in ranks]
        assert torch.equal(torch.cat([p.ids for p in parts]), f.ids)
        assert torch.equal(torch.cat([p.reset for p in parts]), f.reset)
        assert parts[0].doc + parts[1].doc == f.doc


def test_first_step_of_documents_replay_covers_current_documents():
    bf = Batchfier(_docs(LENGTHS), batch_size=3, segment_len=4, seed=5)
    for step in range(2 * bf.steps_per_epoch):
        s = bf.first_step_of_documents(step)
        assert s <= step and s // bf.steps_per_epoch == step // bf.steps_per_epoch
        now = _segments(bf.batch(step))
        replay = [_segments(bf.batch(t)) for t in range(s, step)]
        for j, (k, seg) in enumerate(now):
            # the replay holds this row's segments 0 .. seg-1 of its current document, in order
            mine = [r[j][1] for r in replay if r[j][0] == k]
            assert mine == list(range(seg))
        if step > s:  # and it is the latest such step: some row starts its document at s
            assert bf.batch(s).reset.any()
        assert bf.first_step_of_documents(step, max_back=1) >= step - 1


def test_batchfier_epochs_reshuffle_same_segments():
    lengths = [40, 40, 20, 20, 20, 20, 12, 28, 24, 16, 32, 8]  # segments of 4: 10,10,5,5,5,5,3,7,6,4,8,2 = 70
    docs = _docs(lengths)  # greedy: two rows of exactly 35 segments
    bf = Batchfier(docs, batch_size=2, segment_len=4, seed=0)
    assert bf.segments_used == 70  # no truncation: every epoch covers every segment
    n = bf.steps_per_epoch
    epochs = [[seg for t in range(e * n, (e + 1) * n) for seg in _segments(bf.batch(t))] for e in range(3)]
    assert all(sorted(ep) == sorted(epochs[0]) for ep in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]  # reshuffled every epoch
    assert bf.batch(n).reset.all()  # every row starts a document at an epoch boundary


def test_batchfier_too_little_data():
    with pytest.raises(ValueError, match="3 segments of data cannot fill 8 rows"):
        Batchfier(_docs([12]), batch_size=4, segment_len=4, world_size=2)
    with pytest.raises(ValueError, match="2 documents .* cannot fill 4 rows"):
        Batchfier(_docs([40, 40]), batch_size=4, segment_len=4)
    bf = Batchfier(_docs([40, 40]), batch_size=4, segment_len=4, max_doc_segments=5)  # cut into parts instead
    assert bf.steps_per_epoch == 5 and {d.name for d in bf.documents} >= {"d0#0", "d1#1"}
    with pytest.raises(ValueError, match="rank"):
        Batchfier(_docs(LENGTHS), batch_size=1, segment_len=4, rank=2, world_size=2)


# -----------------------------------------------------------------------------
# recall items


def test_recall_item_char_tokenizer():
    tok = char_tokenizer()
    filler = np.asarray(tok(TEXT * 20, add_special_tokens=False)["input_ids"], dtype=np.int32)
    for seed, kind in [(0, "number"), (1, "name"), (2, None)]:
        item = make_recall_item(tok, filler, np.random.default_rng(seed), distance=500, total=800, kind=kind)
        assert len(item.ids) == 800 and item.ids.dtype == np.int32
        assert tok.decode(item.ids[item.answer_start:]) == " " + item.answer
        text = tok.decode(item.ids)
        restated = tok.decode(item.ids[item.fact_pos:item.answer_pos]).strip()  # "The code to the old safe is"
        assert restated.startswith("The ") and text.endswith(f"? Answer: {restated} {item.answer}")
        assert "\n\nQuestion: " in text
        before = tok.decode(item.ids[:item.answer_start - 500])  # the fact lies at least `distance` tokens back
        assert item.answer in before and tok.decode(item.ids[item.fact_pos:]).startswith(" The ")
        assert tok.decode(item.ids[:item.fact_pos]).rstrip().endswith((".", "!", "?", '"'))  # a sentence's end
        assert 0.05 * 800 - 50 <= item.fact_pos <= 0.2 * 800 + 50
        assert item.fact_pos < item.answer_pos and tok.decode(item.ids[item.answer_pos:]).lstrip().startswith(
            item.answer)
        if kind is not None:
            assert item.kind == kind
            assert item.answer.isdigit() == (kind == "number")
    numbers = [make_recall_item(tok, filler, np.random.default_rng(s), 300, 500, "number").answer for s in range(8)]
    assert all(len(x) == 4 and x.isdigit() for x in numbers) and len(set(numbers)) > 4
    tight = 0
    for distance in range(600, 720, 7):  # near the limit, `distance` decides where the fact may go
        try:
            item = make_recall_item(tok, filler, np.random.default_rng(distance), distance=distance, total=800)
        except ValueError:
            continue
        tight += 1
        assert item.answer in tok.decode(item.ids[:item.answer_start - distance])
    assert tight >= 3


def test_recall_documents_seeds_and_limits():
    tok = char_tokenizer()
    fillers = [np.asarray(tok(t, add_special_tokens=False)["input_ids"], dtype=np.int32)
               for t in (TEXT * 10, TEXT[::-1] * 10, TEXT[:50])]
    a = recall_documents(tok, fillers, n=6, distance=300, total=512, seed=0)
    b = recall_documents(tok, fillers, n=6, distance=300, total=512, seed=0)
    c = recall_documents(tok, fillers, n=6, distance=300, total=512, seed=1)
    assert [x.answer for x in a] == [x.answer for x in b] and all((x.ids == y.ids).all() for x, y in zip(a, b))
    assert [x.answer for x in a] != [x.answer for x in c]
    assert all(len(x.ids) == 512 and x.fact_pos + 300 <= x.answer_start for x in a)
    docs = recall_as_documents(a)
    assert docs[2].name == "recall-2" and (docs[2].ids == a[2].ids).all()
    assert tok.decode(docs[2].ids[docs[2].answers]) == " " + a[2].answer
    with pytest.raises(ValueError, match="cannot hold"):
        make_recall_item(tok, fillers[0], np.random.default_rng(0), distance=500, total=510)
    with pytest.raises(ValueError, match="no filler document"):
        recall_documents(tok, fillers, n=1, distance=10, total=10_000, seed=0)
    item = make_recall_item(tok, fillers[0], np.random.default_rng(0), distance=200)  # total=None: just long enough
    assert item.answer_start - item.fact_pos >= 200 and item.fact_pos <= 0.25 * len(item.ids) and len(item.ids) < 600


def test_training_and_evaluation_draw_names_from_disjoint_pools():
    tok = char_tokenizer()
    filler = np.asarray(tok(TEXT * 40, add_special_tokens=False)["input_ids"], dtype=np.int32)
    eval_first, eval_last = EVAL_NAMES
    evaluated = [make_recall_item(tok, filler, np.random.default_rng(s), 300, 500, "name").answer for s in range(12)]
    assert all(a.split()[0] in eval_first and a.split()[1] in eval_last for a in evaluated)
    assert len(set(evaluated)) > 6
    words = ["Wolf", "National", "Harbour"]
    trained = [make_recall_item(tok, filler, np.random.default_rng(s), 300, 600, "name", names="train",
                                words=words).answer for s in range(16)]
    docs = multi_recall_documents(tok, [filler], n=4, n_facts=8, distance=300, total=2048, seed=0)  # no words here
    from_docs = [tok.decode(d.ids[s:e]).strip() for d in docs
                 for s, e in zip(*[np.flatnonzero(np.diff(np.r_[0, d.answers.astype(int), 0]) == k) for k in (1, -1)])]
    names = [v.split() for v in trained + from_docs if not v.isdigit()]
    assert names and all(len(n) == 2 for n in names)
    parts = [w for n in names for w in n]
    assert not set(parts) & set(eval_first + eval_last)  # never an evaluation name
    assert set(words) & set(parts) and set(parts) - set(words)  # vocabulary words and made-up words
    made_up = [w for w in parts if w not in words]
    assert len(set(made_up)) > 0.8 * len(made_up)  # no small list to learn
    with pytest.raises(ValueError, match="names must be"):
        make_recall_item(tok, filler, np.random.default_rng(0), 300, 500, "name", names="test")


def test_name_words_are_capitalized_whole_word_tokens_and_never_evaluation_names():
    pieces = ["<unk>", "\u0120Wolf", "\u0120National", "\u0120Edmund", "\u0120and", "\u0120Ab", "Harbour",
              "\u2581Lantern", "\u0120McKay", "\u0120Wolf2"]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {p: i for i, p in enumerate(pieces)}, unk_token="<unk>")), unk_token="<unk>")
    # Edmund: an evaluation name; and: lower case; Ab: short; Harbour: no leading space; McKay, Wolf2: not a plain word
    assert name_words(tok) == ["Lantern", "National", "Wolf"]
    assert name_words(char_tokenizer()) == []
    # the word test alone (the probe's "capitalized words") keeps evaluation names: it is a spelling test
    assert [name_word(p) for p in pieces] == ["", "Wolf", "National", "Edmund", "", "", "", "Lantern", "", ""]


def test_multi_recall_document_states_every_fact_long_before_its_question():
    tok = char_tokenizer()
    filler = np.asarray(tok(TEXT * 40, add_special_tokens=False)["input_ids"], dtype=np.int32)
    ids, answers = make_multi_recall_document(tok, filler, np.random.default_rng(3), n_facts=4, distance=900,
                                              total=2048)
    assert len(ids) == 2048 and ids.dtype == np.int32 and answers.shape == ids.shape and answers.dtype == bool
    text = tok.decode(ids)
    qa = list(re.finditer(r"\n\nQuestion: ([^?]*)\? Answer: ([^\n]*)\n\n", text))
    assert len(qa) == 4 and len({m.group(1) for m in qa}) == 4  # four different questions, one answer each
    # the answer marks: one run of tokens per question, the value that ends its answer line (with its space)
    runs = [ids[s:e] for s, e in zip(*[np.flatnonzero(np.diff(np.r_[0, answers.astype(int), 0]) == d)
                                       for d in (1, -1)])]
    assert len(runs) == 4
    for m, run in zip(qa, runs):
        value = tok.decode(run)
        assert value.startswith(" ") and m.group(2).endswith(value)
        assert value.strip() in text[: m.start() - 900]  # stated at least `distance` tokens (1 char = 1 token) back
    starts = [m.start() for m in qa]
    assert max(starts) - min(starts) > 100  # spread over the document, not one block
    again, _ = make_multi_recall_document(tok, filler, np.random.default_rng(3), n_facts=4, distance=900, total=2048)
    assert (again == ids).all()
    docs = multi_recall_documents(tok, [filler], n=3, n_facts=2, distance=500, total=1024, seed=0)
    assert [d.name for d in docs] == ["recall-0", "recall-1", "recall-2"] and all(len(d.ids) == 1024 for d in docs)
    assert all(d.answers.sum() > 0 for d in docs)
    with pytest.raises(ValueError, match="cannot hold"):
        make_multi_recall_document(tok, filler, np.random.default_rng(0), n_facts=4, distance=1000, total=1100)
    with pytest.raises(ValueError, match="n_facts"):
        make_multi_recall_document(tok, filler, np.random.default_rng(0), n_facts=0, distance=10, total=1100)


def test_quote_document_quotes_passages_of_its_own_text_long_after_them():
    # every filler token unique, so a token seen before in the document is a quoted copy
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {f"t{i}": i for i in range(4000)}, unk_token="t0")))
    filler = np.arange(4000, dtype=np.int32)
    ids = make_quote_document(tok, filler, np.random.default_rng(1), n_quotes=5, quote_len=16, distance=300,
                              total=1024)
    assert len(ids) == 1024 and ids.dtype == np.int32
    first, repeats = {}, []
    for i, t in enumerate(ids.tolist()):
        if t in first:
            repeats.append(i - first[t])
        else:
            first[t] = i
    assert len(repeats) == 5 * 16  # the quotes, and nothing else, repeat
    assert min(repeats) >= 300 + 16  # each quoted token comes a passage and `distance` after its first occurrence
    assert (np.diff(list(first)) == 1).all()  # without the quotes, the document is one window of the filler, in order
    docs = quote_documents(tok, [filler], n=2, n_quotes=5, quote_len=16, distance=300, total=1024, seed=0)
    assert [d.name for d in docs] == ["quote-0", "quote-1"] and all(len(d.ids) == 1024 for d in docs)
    assert all(d.answers is None for d in docs)  # plain text to the loss
    with pytest.raises(ValueError, match="cannot hold"):
        make_quote_document(tok, filler, np.random.default_rng(0), n_quotes=5, quote_len=16, distance=1000,
                            total=1024)
