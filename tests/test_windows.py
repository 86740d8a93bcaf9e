"""Windows of a bank's text ranked by BM25 (``tasks.windows``): the RAG script's reading, which a reader other than
the bank's model reads by default (issue 92). The bank's windows and their ranking are the script's, the prompt is
the script's prompt, and an answer cites each window with its place."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from helpers import story
from tiny import chat_model

from longmem.eval.ragscript import SCRIPT_WINDOW, RagScript
from longmem.ingest.pipeline import ingest
from longmem.model.baselines import BackboneLM
from longmem.service.replies import Reply
from longmem.storage import BankDirectory
from longmem.tasks.answer import ANSWER_SAMPLING, answer
from longmem.tasks.chat import Chat
from longmem.tasks.reading import PassageFinder, Reading, prompt_for
from longmem.tasks.setup import READER_PROFILES, SCRIPT_READING, profile, reading_for
from longmem.tasks.windows import BM25, K1, B, WindowIndex, windows, words

QUESTION = "What drifted over the harbour? A zeppelin?"


@pytest.fixture
def model():
    return chat_model(segment_len=512)


@pytest.fixture
def library(tmp_path, model):
    """A bank of two books: the story, and another story without its zeppelin."""
    bank = BankDirectory(tmp_path / "banks").create("lib", model)
    for name, text in (("one.txt", story(chapters=3, paragraphs=8)), ("two.txt", story(seed=1, zeppelin=False))):
        (tmp_path / name).write_text(text)
        ingest(bank, model, tmp_path / name)
    yield bank
    bank.close()


def script_reading(**told) -> Reading:
    return Reading(**{**SCRIPT_READING.reading, **told})


def test_bm25_from_its_postings_scores_as_the_dense_formula_does():
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(30)]
    docs = [[rng.choice(vocab) for _ in range(rng.randint(0, 40))] for _ in range(50)]
    index = BM25(docs)
    n, mean = len(docs), sum(map(len, docs)) / len(docs)
    query = ["w1", "w7", "w7", "w29", "nowhere"]
    for i, d in enumerate(docs):
        expected = 0.0
        for w in dict.fromkeys(query):
            m = sum(w in x for x in docs)
            if m == 0 or w not in d:
                continue
            idf = math.log((n - m + 0.5) / (m + 0.5) + 1.0)
            c = d.count(w)
            expected += idf * c * (K1 + 1) / (c + K1 * (1 - B + B * len(d) / mean))
        assert index.scores(query)[i] == pytest.approx(expected, rel=1e-12)
    ranked = index.top(query, 50)
    scores = index.scores(query)
    assert [i for i, _ in ranked] == sorted((i for i in range(n) if scores[i] > 0), key=lambda i: (-scores[i], i))
    assert all(s == scores[i] for i, s in ranked)
    assert [i for i, _ in index.top(query, 50, keep=lambda i: i % 2 == 0)] == [i for i, _ in ranked if i % 2 == 0]


def test_a_bank_s_windows_are_the_script_s_and_rank_as_its_do(library, bank_of, model):
    index = WindowIndex(library)
    for doc in library.documents():
        text = library.document_text(doc.id)
        assert [(a, b) for d, a, b in index.spans if d == doc.id] == windows(text)
    text = story(chapters=3, paragraphs=8)
    alone = bank_of(model, text)  # a bank of one book: the script's idf, its ranking to the bit
    script = RagScript(alone.document_text(alone.documents()[0].id))
    top = WindowIndex(alone).top(QUESTION, 4)
    assert [(a, b) for _, a, b, _ in top] == script.find(QUESTION) and top[0][3] >= top[-1][3] > 0
    assert [s for *_, s in top] == [script.index.scores(words(QUESTION))[script.spans.index((a, b))]
                                    for _, a, b, _ in top]


def test_a_library_s_windows_stay_in_one_book_and_in_the_books_asked_about(library):
    index = WindowIndex(library)
    lengths = {d.id: len(library.document_text(d.id)) for d in library.documents()}
    assert {d for d, *_ in index.spans} == set(lengths)
    assert all(0 <= a < b <= lengths[d] for d, a, b in index.spans)
    one, two = sorted(lengths)
    assert {d for d, *_ in index.top("the harbour at dawn", 40)} == {one, two}
    assert {d for d, *_ in index.top("the harbour at dawn", 40, [two])} == {two}
    assert index.top("zeppelin", 4, [two]) == []  # the second book has none


def test_a_window_is_cited_with_the_place_of_the_passage_it_starts_in(library):
    index = WindowIndex(library)
    doc, a, b, _ = index.top(QUESTION, 1)[0]
    p = index.passage(doc, a, b)
    (start,) = library.passages(library.passages_overlapping(doc, a, a + 1))
    assert (p.char_start, p.char_end, p.text) == (a, b, library.document_text(doc)[a:b])
    assert (p.id, p.document, p.label, p.chapter) == (start.id, start.document, start.label, start.chapter)
    assert p.place().startswith(start.document) and p.place().endswith("through the book")


def test_the_reading_prompt_is_the_script_s_word_for_word(library, model):
    one = library.documents()[0]
    finder = PassageFinder(library, model, library.load_memory(model))
    found = finder.find(QUESTION, script_reading(books=(one.id,)))
    assert [f.ranks for f in found] == [{"windows": i} for i in range(1, 5)]
    assert prompt_for(QUESTION, found, script_reading()) == RagScript(library.document_text(one.id)).prompt(
        QUESTION)[0]
    assert prompt_for(QUESTION, [], script_reading()) == QUESTION


def test_the_decline_prompt_is_the_script_s_told_to_decline(library, model):
    """The decline prompt measured as a change from the script's reading: the same excerpts, bare, best first, under
    the script's line with the decline sentence added; a reading with it can be held to its decline."""
    from longmem.tasks.reading import DECLINE, PROMPTS

    one = library.documents()[0]
    finder = PassageFinder(library, model, library.load_memory(model))
    found = finder.find(QUESTION, script_reading(books=(one.id,)))
    plain = prompt_for(QUESTION, found, script_reading())
    told = prompt_for(QUESTION, found, replace(script_reading(), prompt="plain-or-not"))
    assert told == plain.replace(PROMPTS["plain"], f"{PROMPTS['plain']} If they do not answer it, say: {DECLINE}", 1)
    assert replace(script_reading(), prompt="plain-or-not", decline=0.5).declines
    assert not replace(script_reading(), decline=0.5).declines  # the script's own line cannot decline

def test_a_reader_answers_from_the_windows_and_cites_them(library, model):
    """Short windows, so that a tiny reader's 512-token window holds them: the answer reads them best first and
    cites each with its place, its text in its surroundings."""
    memory = library.load_memory(model)
    finder = PassageFinder(library, model, memory, windows=WindowIndex(library, size=200, step=100))
    chat = Chat(BackboneLM(model.backbone, 512), None, ANSWER_SAMPLING)
    reply = answer(chat, finder, QUESTION, script_reading(), reader="tiny")
    text = "".join(reply)
    assert reply.complete and reply.said and text and not reply.memory
    assert 1 <= len(reply.found) <= 4 and [f.ranks["windows"] for f in reply.found] == list(
        range(1, len(reply.found) + 1))  # best first, as the script reads them
    assert "zeppelin" in reply.found[0].passage.text.lower()
    for c, f in zip(reply.citations, reply.found):
        assert c.place == f.passage.place() and c.text in c.context


def test_the_finder_keeps_its_window_index_until_the_bank_changes(library, model, tmp_path):
    finder = PassageFinder(library, model, library.load_memory(model))
    index = finder.windows
    assert finder.windows is index and not index.stale()
    (tmp_path / "three.txt").write_text(story(seed=2, chapters=1))
    ingest(library, model, tmp_path / "three.txt")
    assert index.stale() and finder.windows is not index and len(finder.windows.spans) > len(index.spans)


def test_a_reader_other_than_the_bank_s_model_reads_as_the_script_unless_told():
    assert READER_PROFILES["qwen2.5-coder-1.5b"] is SCRIPT_READING and profile("any/other.gguf") is SCRIPT_READING
    assert SCRIPT_READING.window == SCRIPT_WINDOW
    read = reading_for("any/other.gguf", Reading())
    assert (read.finder, read.prompt, read.passages, read.best_last) == ("windows", "plain", 4, False)
    assert (read.abstain, read.decline, read.sure, read.spans) == (0.0, 0.0, 0.0, False)
    assert reading_for("any/other.gguf", Reading(abstain=0.5), {"abstain"}).abstain == 0.5  # told: kept


def test_a_reply_says_when_the_passages_are_found_before_its_first_piece():
    reply = Reply()
    reply.found(["c"])
    reply.emit("An")
    reply.emit("swer.")
    reply.finish()
    assert list(reply.updates()) == [None, "An", "swer."] and reply.citations == ["c"]
    again = Reply()
    again.found([])
    again.emit("x")
    again.finish()
    assert list(again) == ["x"]  # plain iteration: the pieces alone
    early = Reply()
    early.emit("a")
    early.emit("b")
    pieces = iter(early)
    assert next(pieces) == "a" and not early.cancelled
    pieces.close()  # a reader that stops early stops the generation
    assert early.cancelled
