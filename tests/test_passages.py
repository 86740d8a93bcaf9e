"""Passages: cutting text into sentence-bounded spans (streamed, resumed), storing them with their segments and their
FTS5 index in a real bank, finding them by words and by the chunks memory retrieved, keeping the index sound."""

from __future__ import annotations

import sqlite3
import textwrap
from dataclasses import replace

import pytest
from helpers import story
from tiny import tiny_model

from longmem.ingest.pipeline import ingest
from longmem.storage import BankDirectory
from longmem.storage import passages as bank_passages
from longmem.storage.passages import Passage
from longmem.text.passages import ELLIPSIS, MAX_TOKENS, Chapters, PassageCutter, cut_passages, excerpt, reflow

# ---------------------------------------------------------------------------------------------------- cutting


def test_passages_end_at_sentences_and_quote_the_text_exactly():
    text = story()
    spans = cut_passages(text, n_tokens=len(text) // 4)
    assert len(spans) > 5
    assert all(text[s.start:s.end] == s.text and s.text == s.text.strip() for s in spans)
    assert all(s.text.endswith((".", "I", "II", "III", "STORY")) for s in spans)  # sentence ends or headings
    assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))
    words = lambda t: t.split()  # noqa: E731
    assert sum(len(words(s.text)) for s in spans) == len(words(text))  # no word lost or repeated


@pytest.mark.parametrize("piece", [4, 36, 500, 100_000])
def test_streaming_in_any_pieces_cuts_like_the_whole(piece):
    """Pieces of the same characters per token (ingestion feeds whole segments, each with its own ratio)."""
    text = story(seed=1)
    text += " " * (-len(text) % 4)
    whole = cut_passages(text, n_tokens=len(text) // 4)
    cutter, got = PassageCutter(), []
    for i in range(0, len(text), piece):
        chunk = text[i:i + piece]
        got += cutter.feed(chunk, len(chunk) // 4)
    got += cutter.finish()
    assert got == whole


def test_a_cutter_rebuilt_from_start_and_tail_goes_on_as_the_first_would():
    text = story(seed=2)
    first, out = PassageCutter(), []
    out += first.feed(text[:3000], 750)
    again = PassageCutter(first.start, first.tail)  # what a resumed ingestion rebuilds from the bank
    rest = again.feed(text[3000:], (len(text) - 3000) // 4) + again.finish()
    assert out + rest == cut_passages(text, n_tokens=len(text) // 4)


def test_a_line_without_sentence_ends_is_cut_at_spaces():
    text = " ".join(f"word{i}" for i in range(3000))  # ~24k characters, no full stop
    spans = cut_passages(text, n_tokens=len(text) // 4)
    assert len(spans) > 5 and all(s.n_tokens <= MAX_TOKENS for s in spans)
    assert all(not s.text.startswith(" ") and text[s.start:s.end] == s.text for s in spans)
    assert " ".join(s.text for s in spans) == text


def test_demonstrations_are_one_passage_each():
    demos = [f"Review: film number {i} was {'good' if i % 2 else 'bad'}. Sentiment: "
             f"{'positive' if i % 2 else 'negative'}" for i in range(30)]
    spans = cut_passages("\n\n".join(demos), demonstrations=True)
    assert [s.text for s in spans] == demos


def test_chapters_name_the_heading_a_place_is_under():
    text = story()
    chapters = Chapters(text)
    assert chapters.headings == ["CHAPTER I", "CHAPTER II", "CHAPTER III"]  # as the book prints them
    assert chapters.labels == ["Chapter I", "Chapter II", "Chapter III"]  # as a place names them
    assert chapters.heading(0) is None and chapters.label(0) is None  # the title page comes before chapter one
    at = text.index("zeppelin")
    assert (chapters.heading(at), chapters.label(at)) == (chapters.headings[1], chapters.labels[1])


def parted() -> str:
    """A book in two parts of two chapters each (PART ONE: I, II; PART TWO: I, II), hard-wrapped at 60 characters as
    Project Gutenberg prints books; every word but "The" is unique ("p2s3w4": chapter 2, sentence 3, word 4)."""
    out = ["TWO PARTS\n\n\n"]
    for c in range(4):
        out.append(("PART ONE\n\n\n" if c == 0 else "PART TWO\n\n\n" if c == 2 else "") + ["I", "II"][c % 2] + "\n\n\n")
        for para in range(3):
            words = " ".join(f"{'The ' if w == 0 else ''}p{c}s{s}w{w}{'.' if w == 7 else ''}"
                             for s in range(para * 4, para * 4 + 4) for w in range(8))
            out.append(textwrap.fill(words, 60) + "\n\n")
    return "".join(out)


def test_a_place_names_the_part_the_chapter_and_where_in_the_book():
    text = parted()
    chapters = Chapters(text)
    assert chapters.labels == ["Part One, chapter I", "Part One, chapter II", "Part Two, chapter I",
                               "Part Two, chapter II"]
    assert chapters.headings == ["PART ONE I", "II", "PART TWO I", "II"]  # as the book prints them
    at = text.index("The p3s5w0")
    ref = Passage(id=1, document_id=1, document="Two Parts", chapter=chapters.heading(at), char_start=at,
                     char_end=at + 10, document_chars=len(text), text="The p3s5w0", label=chapters.label(at))
    percent = f"{at / len(text):.0%}"
    assert ref.place() == f"Two Parts, Part Two, chapter II, {percent} through the book"
    assert ref.prompt_place() == f"Two Parts, chapter II, {percent} in"  # the wording the answers were measured with
    ref = replace(ref, label=None)
    # banks made before labels stored the heading's lines joined by spaces: still read as a book's places
    assert replace(ref, chapter="VII").place() == f"Two Parts, chapter VII, {percent} through the book"
    assert replace(ref, chapter="PART TWO I").place() == f"Two Parts, Part Two, chapter I, {percent} through the book"
    assert replace(ref, chapter=None).place() == f"Two Parts, {percent} through the book"


def test_reflow_joins_a_books_hard_wrapped_lines_into_paragraphs():
    wrapped = ("It was two years before Niel Herbert came home\nagain, and when he came  the first\n   acquaintance "
               "he met was\nIvy Peters.\n\n\n\"Hullo, Niel.\"\r\n\r\nA well-\nknown face.")
    assert reflow(wrapped) == ("It was two years before Niel Herbert came home again, and when he came the first "
                               "acquaintance he met was Ivy Peters.\n\n\"Hullo, Niel.\"\n\nA well- known face.")
    assert reflow(" a\nb \n\n") == " a b\n\n"  # the ends are mapped, not removed: pieces join as the whole


def test_the_text_around_a_passage_is_cut_at_sentences_or_whole_words():
    # the fragment: "ster, why don't you go away?" started inside a word
    cut = excerpt("ster, why don't you go away? I said so ", "And then he left.", " She went back to her home and")
    assert cut.before == f"{ELLIPSIS}why don't you go away? I said so "
    assert cut.after == f" She went back to her home{ELLIPSIS}"
    near = excerpt("ster. Why don't you go away? I said so ", "And then he left.", " She went back. And the")
    assert (near.before, near.after) == ("Why don't you go away? I said so ", " She went back.")  # sentences in reach
    whole = excerpt("\n\nFirst words\nof the book. ", "The passage.", " The end\n", cut_before=False, cut_after=False)
    assert whole.context == "First words of the book. The passage. The end"
    split = excerpt("one two three.\n", "\nFour five", " six seven.\n\nEight nine ten eleven twelve thirteen")
    assert split.context == f"{ELLIPSIS}two three.\n\nFour five six seven.\n\nEight nine ten eleven twelve{ELLIPSIS}"
    assert split.text == "Four five"  # a paragraph break split between a chunk and its neighbour stays one

    text = parted()
    book = reflow(text)
    for p in cut_passages(text, n_tokens=len(text) // 4)[1:-1]:
        for reach in (30, 150, 600):
            lo = max(0, p.start - reach)
            shown = excerpt(text[lo:p.start], p.text, text[p.end:p.end + reach], cut_before=lo > 0)
            assert shown.text == reflow(p.text) and shown.context[len(shown.before):].startswith(shown.text)
            assert "\n" not in shown.context.replace("\n\n", "")  # no hard-wrapped line breaks left
            inner = shown.context.strip(ELLIPSIS)
            i = book.index(inner)  # the book's own words, reflowed, from a whole word to a whole word
            assert (i == 0 or book[i - 1].isspace()) and (i + len(inner) == len(book) or book[i + len(inner)].isspace())
            assert shown.before.startswith(ELLIPSIS) or lo == 0 or shown.before[:3] in ("The", "I\n\n", "II\n", "PAR")


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="min_tokens"):
        PassageCutter(min_tokens=300, target_tokens=200)


# ------------------------------------------------------------------------------------------------------- bank


@pytest.fixture
def model():
    return tiny_model("llama", segment_len=64)  # one token a character: passages of 100-250 characters


@pytest.fixture
def bank(bank_of, model):
    return bank_of(model, story())


def passages(bank) -> list[tuple]:
    sql = "SELECT segment_id, char_start, char_end, chapter, text FROM passages ORDER BY id"
    return bank.db.execute(sql).fetchall()


def test_ingestion_stores_every_passage_with_its_segment_and_chapter(bank, model):
    text = story()
    rows = passages(bank)
    spans = cut_passages(text, n_tokens=len(model.backbone.tokenizer(text).input_ids))
    assert [(r[1], r[2], r[4]) for r in rows] == [(s.start, s.end, s.text) for s in spans]
    seg_ends = dict(bank.db.execute("SELECT id, (SELECT sum(length(t.text)) FROM segments t WHERE t.document_id = "
                                    "s.document_id AND t.seq <= s.seq) FROM segments s").fetchall())
    assert all(end <= seg_ends[seg] for seg, _, end, _, _ in rows)  # stored with the segment that completed it
    zeppelin = next(r for r in rows if "zeppelin" in r[4])
    assert zeppelin[3] == Chapters(text).heading(zeppelin[1])  # the heading of the chapter it starts in
    label = bank.db.execute("SELECT label FROM passages WHERE text LIKE '%zeppelin%'").fetchone()[0]
    assert label == Chapters(text).label((zeppelin[1] + zeppelin[2]) // 2) == "Chapter II"  # most of it is in
    assert bank.verify().ok


def test_words_find_their_passage(bank):
    (best, score), *rest = bank.search_passages("What drifted over the harbour, a zeppelin?", 5)
    (ref,) = bank.passages([best])
    assert "zeppelin" in ref.text and score > 0 and all(s < score for _, s in rest)
    assert ref.document == "story" and ref.chapter and 0.2 < ref.position < 0.8
    assert (ref.chapter, ref.label) == ("CHAPTER II", "Chapter II")
    assert ref.place() == f"story, Chapter II, {ref.position:.0%} through the book"  # for the reader
    assert ref.prompt_place() == f"story, CHAPTER II, {ref.position:.0%} in"  # for the model, as measured
    ref = replace(ref, label=None)  # a bank made before labels
    assert replace(ref, chapter="IV.").place().startswith("story, chapter IV, ")  # a bare number gets its word
    assert bank.search_passages("the and of", 5) == []  # nothing but stopwords


def test_memory_chunks_vote_for_the_passage_that_holds_them(bank, model):
    memory = bank.load_memory(model)
    places = bank.chunk_places()
    text = story()
    at = text.index("zeppelin")
    # the chunk that holds the zeppelin: segments tile the text, chunks are chunk_size tokens (= characters here)
    serial = at // model.chunk_size
    beyond = len(memory) // model.chunk_size + 10  # a serial beyond the bank
    votes = places.votes({serial: 5, serial + 1: 2, beyond: 9})
    (pid, n), = votes.items()
    assert n == 7 and "zeppelin" in bank.passages([pid])[0].text



def test_passage_texts_and_overlaps_name_the_stored_passages(bank, tmp_path, model):
    other = tmp_path / "other.txt"
    other.write_text(story(seed=9, zeppelin=False))
    ingest(bank, model, other)
    first, second = (d.id for d in bank.documents())
    rows = passages(bank)
    everything = bank.passage_texts()
    assert [t for _, t in everything] == [r[4] for r in rows]
    own = bank.passage_texts(second)
    assert own and set(own) < set(everything)
    assert all(r.document_id == second for r in bank.passages([p for p, _ in own]))
    at = story().index("zeppelin")
    hit = bank.passages_overlapping(first, at, at + len("zeppelin"))
    assert len(hit) == 1 and "zeppelin" in bank.passages(hit)[0].text
    (ref,) = bank.passages(hit)
    assert bank.passages_overlapping(first, ref.char_end, ref.char_end) == []  # an empty span overlaps nothing
    both = bank.passages_overlapping(first, ref.char_end - 1, ref.char_end + 1)  # the boundary between two passages
    assert hit[0] in both and len(both) <= 2


def test_a_provisional_document_is_placed_after_the_memory_and_then_forgotten(bank, tmp_path, model):
    from longmem.ingest.pipeline import cut_segments, store_segment
    from longmem.ingest.readers import Block

    memory = bank.load_memory(model)
    before = (len(memory), passages(bank))
    text = "A brass orrery spun in the attic of the lighthouse. " * 4
    tok, info = model.backbone.tokenizer, bank.info_cached
    with bank.provisional():
        cutter, ref = PassageCutter(), {"title": "trial", "source": "trial", "kind": "text", "options": {},
                                        "sha256": "trial", "meta": {}}
        for seq, seg in enumerate(cut_segments(tok, [Block(text, 0, len(text))], info.segment_len, info.chunk_size)):
            ref, k, v = store_segment(bank, model, ref, seq, seg, cutter)
            memory.add(k[None], v[None], tokens=seg.ids[None, :k.shape[1]])
        bank.finish_document(ref, cutter.finish())
        places = bank.chunk_places(appended=ref)
        serial = before[0] // model.chunk_size + text.index("orrery") // model.chunk_size
        (pid, n), = places.votes({serial: 3}).items()
        assert n == 3 and "orrery" in bank.passages([pid])[0].text
        assert bank.search_passages("orrery", 1)
    assert bank.search_passages("orrery", 1) == [] and passages(bank) == before[1]
    assert bank.documents()[-1].title != "trial" and bank.verify(repair_index=False).ok

def test_deleting_a_document_removes_its_passages_and_their_index_rows(bank, tmp_path, model):
    other = tmp_path / "other.txt"
    other.write_text(story(seed=9, zeppelin=False))
    ingest(bank, model, other)
    first = bank.documents()[0].id
    bank.delete_document(first)
    assert {r[0] for r in bank.db.execute("SELECT document_id FROM passages")} == {bank.documents()[0].id}
    assert bank_passages.fts_problems(bank.db, deep=False) == []
    assert bank.search_passages("zeppelin", 5) == [] and bank.search_passages("harbour", 1)


@pytest.mark.parametrize("damage", ["drop", "corrupt", "stale"])
def test_a_missing_or_damaged_index_is_rebuilt_by_verify(bank, damage):
    want = bank.search_passages("zeppelin harbour", 3)
    with bank.writing(), bank.db.atomic():
        if damage == "drop":
            bank.db.execute("DROP TABLE passages_fts")
        elif damage == "corrupt":  # scribble over the index's own blocks
            bank.db.execute("UPDATE passages_fts_data SET block = randomblob(length(block)) WHERE id > 10")
        else:  # a passage the index does not know: written around the triggers
            bank.db.execute("DROP TRIGGER passages_ai")
            bank.db.execute("INSERT INTO passages (document_id, segment_id, char_start, char_end, n_tokens, text) "
                            "SELECT document_id, segment_id, char_end + 1, char_end + 2, 1, 'zeppelin' "
                            "FROM passages WHERE id = (SELECT max(id) FROM passages)")
    report = bank.verify(repair_index=False)
    assert not report.ok and "full-text index" in report.problems[0]
    report = bank.verify()
    assert report.ok and any("rebuilt from the passages" in n for n in report.notes), report
    assert bank.verify(repair_index=False).ok
    if damage == "stale":  # the passage written around the triggers is found now
        newest = bank.db.execute("SELECT max(id) FROM passages").fetchone()[0]
        assert bank.search_passages("zeppelin", 1)[0][0] == newest
    else:
        assert bank.search_passages("zeppelin harbour", 3) == want


def test_rebuild_cuts_the_same_passages_again(bank):
    before = passages(bank)
    with bank.writing(), bank.db.atomic():
        bank.db.execute("DELETE FROM passages WHERE id % 3 = 0")
    assert not bank.verify(repair_index=False).ok or len(passages(bank)) < len(before)
    assert bank.rebuild_passages() == len(before)
    assert [r[1:] for r in passages(bank)] == [r[1:] for r in before] and bank.verify().ok


def test_a_file_of_demonstrations_gets_one_passage_per_demonstration(tmp_path, model):
    from longmem.ingest.readers import DemoFormat

    rows = [("positive", "a gorgeous moving film"), ("negative", "a dull and tired plot")] * 10
    f = tmp_path / "demos.tsv"
    f.write_text("label\ttext\n" + "".join(f"{lab}\t{txt} number {i}\n" for i, (lab, txt) in enumerate(rows)))
    with BankDirectory(tmp_path / "banks").create("d", model) as bank:
        ingest(bank, model, f, DemoFormat())
        texts = [r[4] for r in passages(bank)]
    assert texts == [f"Review: {txt} number {i} Sentiment: {lab}" for i, (lab, txt) in enumerate(rows)]


def test_an_fts_query_quotes_words_and_drops_stopwords():
    assert bank_passages.fts_query('Who is "the" narrator of it?') == '"narrator"'
    assert bank_passages.fts_query("Daisy's husband, Tom") == '"daisy" OR "husband" OR "tom"'
    assert bank_passages.fts_query("the of and") is None
    conn = sqlite3.connect(":memory:")  # the query is valid FTS5 syntax whatever the question holds
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    conn.execute("INSERT INTO t VALUES ('narrator')")
    for q in ['AND OR NOT "', "x* (y) NEAR/2 z:", "narrator"]:
        query = bank_passages.fts_query(q)
        assert query is None or conn.execute("SELECT count(*) FROM t WHERE t MATCH ?", [query]).fetchone()
