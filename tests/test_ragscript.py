"""The RAG script a user would write (``eval.ragscript``), the anchor of the reading suites: windows of the raw text,
BM25 over them, the best four in a one-line prompt, read greedily by a real (tiny) backbone with its own window."""

from __future__ import annotations

import pytest
from helpers import story
from tiny import chat_model

from longmem.eval.ragscript import BM25, PROMPT, RagScript, script_answer, windows, words
from longmem.model.baselines import BackboneLM


def test_windows_cover_the_text_with_half_overlaps_and_end_at_its_end():
    assert windows("") == []
    assert windows("x" * 1000) == [(0, 1000)]
    assert windows("x" * 3000) == [(0, 1600), (800, 2400), (1600, 3000)]
    assert windows("x" * 2400) == [(0, 1600), (800, 2400)]
    text = "y" * 10_001
    spans = windows(text, 100, 50)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(b - a <= 100 and b2 - b <= 50 for (a, b), (_, b2) in zip(spans, spans[1:]))
    with pytest.raises(ValueError):
        windows("abc", 10, 0)


def test_bm25_ranks_the_window_with_the_rare_words_first():
    docs = [words(t) for t in ["the cat sat on the mat", "the dog and the cat", "a zeppelin over the harbour",
                               "the the the the"]]
    index = BM25(docs)
    assert index.top(words("What drifted over the harbour?"), 4)[0][0] == 2
    assert [i for i, _ in index.top(words("the cat"), 2)] == [1, 0]  # equal counts: the shorter window first
    assert index.top(words("unicorn"), 4) == []
    s = index.scores(words("zeppelin"))
    assert s[2] > 0 and s[0] == s[1] == s[3] == 0


def test_the_script_reads_its_best_four_windows_in_a_one_line_prompt():
    text = story(chapters=3, paragraphs=8)
    script = RagScript(text)
    prompt, read = script.prompt("What drifted over the harbour? A zeppelin?")
    assert len(read) == 4 and "zeppelin" in text[read[0][0]:read[0][1]]
    assert prompt.startswith(PROMPT.split("{context}")[0]) and prompt.endswith("Question: What drifted over the "
                                                                               "harbour? A zeppelin?")
    assert all(text[a:b].strip() in prompt for a, b in read)
    assert script.prompt("Qwxyz?") == ("Qwxyz?", [])


def test_the_script_s_reader_answers_greedily_the_same_twice():
    lm = BackboneLM(chat_model(segment_len=128).backbone, 512)
    script = RagScript(story())
    prompt, _ = script.prompt("What drifted over the harbour?")
    a, b = script_answer(lm, prompt, 6), script_answer(lm, prompt, 6)
    assert a == b and a.strip()


def test_the_script_is_an_entrant_of_the_suites_about_whole_books_only():
    from longmem.eval.answering import ReadingSize, check_entrants

    check_entrants("natural", ["app", "rag_script"])
    with pytest.raises(ValueError, match="rag_script reads a whole book's text"):
        check_entrants("bookqa", ["app", "rag_script"])
    assert "rag_script" not in ReadingSize().entrants  # bookqa's and facts' default: every entrant they allow
