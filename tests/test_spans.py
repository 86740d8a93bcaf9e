"""Spans (``tasks.spans``): the found passages widened by their neighbours, joined where they touch, in book order,
within the reading budget; read through ``answer`` they are what the prompt shows and what the reply cites (real
bank, SQLite and FTS5; tiny llama)."""

from __future__ import annotations

import pytest
from helpers import story
from tiny import chat_model

from longmem.ingest.pipeline import ingest
from longmem.model.lm import Sampling
from longmem.storage import BankDirectory
from longmem.tasks.answer import answer
from longmem.tasks.chat import Chat
from longmem.tasks.reading import Found, PassageFinder, Reading, find_for_chat, reading_prompt
from longmem.tasks.spans import HEADING, widen

QUESTION = "What drifted over the harbour? A zeppelin?"


def count(text: str) -> int:
    return len(text.split())


@pytest.fixture
def bank(tmp_path):
    model = chat_model(segment_len=512)
    (tmp_path / "story.txt").write_text(story(chapters=3, paragraphs=8))
    with BankDirectory(tmp_path / "banks").create("b", model) as bank:
        ingest(bank, model, tmp_path / "story.txt")
        yield bank


def passages(bank):
    ids = [i for i, _ in bank.passage_texts()]
    return bank.passages(ids)


def test_a_passage_is_read_with_its_neighbours_as_one_span_of_the_book_s_text(bank):
    ps = passages(bank)
    assert len(ps) >= 8
    mid = ps[4]
    (span,) = widen(bank, [Found(mid, 1.0, {"lexical": 1})], count, 10**6, neighbours=1)
    assert span.ids == (ps[3].id, mid.id, ps[5].id) and span.passage.id == mid.id
    text = bank.document_text(mid.document_id)
    assert span.passage.text == text[ps[3].char_start: ps[5].char_end]
    assert (span.passage.char_start, span.passage.char_end) == (ps[3].char_start, ps[5].char_end)
    assert span.ranks == {"lexical": 1} and span.score == 1.0
    first = widen(bank, [Found(ps[0], 1.0)], count, 10**6, neighbours=2)[0]  # fewer at the book's start
    assert first.ids == tuple(p.id for p in ps[:3])
    alone = widen(bank, [Found(mid, 1.0)], count, 10**6, neighbours=0)[0]
    assert alone.ids == (mid.id,) and alone.passage == mid


def test_spans_that_touch_are_joined_and_shown_in_book_order(bank):
    ps = passages(bank)
    found = [Found(ps[7], 3.0), Found(ps[1], 2.0), Found(ps[5], 1.0), Found(ps[6], 0.5)]
    spans = widen(bank, found, count, 10**6, neighbours=1)
    # found 7, 1, 5, 6 (6 touches 5 and 7); then neighbours 8, 0, 2, 4: spans 0..2 and 4..8; 3 lies between
    assert [s.ids for s in spans] == [tuple(p.id for p in ps[0:3]), tuple(p.id for p in ps[4:9])]
    assert [s.passage.id for s in spans] == [ps[1].id, ps[7].id] and spans[1].score == 3.0
    touching = widen(bank, [Found(ps[1], 1.0), Found(ps[4], 1.0)], count, 10**6, neighbours=1)
    assert [s.ids for s in touching] == [tuple(p.id for p in ps[0:6])]  # 0..2 and 3..5 touch: one span
    apart = widen(bank, [Found(ps[6], 1.0), Found(ps[1], 1.0)], count, 10**6, neighbours=0)
    assert [s.ids for s in apart] == [(ps[1].id,), (ps[6].id,)]  # in book order, not by rank


def test_what_is_found_comes_first_then_its_neighbours_nearest_first(bank):
    ps = passages(bank)
    cost = {p.id: count(p.text) for p in ps}
    alone = cost[ps[4].id] + cost[ps[12].id] + 2 * HEADING
    # both found passages fit alone; the neighbours only where the budget is left
    assert [s.ids for s in widen(bank, [Found(ps[4], 1.0), Found(ps[12], 0.5)], count, alone, 1)] == [
        (ps[4].id,), (ps[12].id,)]
    before = alone + cost[ps[3].id]  # room for the best one's neighbour before it, not after
    assert [s.ids for s in widen(bank, [Found(ps[4], 1.0), Found(ps[12], 0.5)], count, before, 1)] == [
        (ps[3].id, ps[4].id), (ps[12].id,)]
    assert widen(bank, [Found(ps[4], 1.0)], count, cost[ps[4].id] + HEADING - 1, 1) == []  # nothing fits
    far = widen(bank, [Found(ps[8], 1.0)], count, 10**6, neighbours=2)[0]
    assert far.ids == tuple(p.id for p in ps[6:11])
    big, little = sorted(ps[2:14], key=lambda p: cost[p.id])[::-1][0], sorted(ps[2:14], key=lambda p: cost[p.id])[0]
    assert cost[big.id] > cost[little.id]
    kept = widen(bank, [Found(big, 1.0), Found(little, 0.5)], count, cost[little.id] + HEADING, 1)
    assert [s.ids for s in kept] == [(little.id,)]  # the best does not fit and is skipped; the next one does


def test_an_answer_reading_spans_shows_and_cites_them(bank):
    model = chat_model(segment_len=512)
    memory = bank.load_memory(model)
    finder = PassageFinder(bank, model, memory)
    chat = Chat(model, None, Sampling(max_new_tokens=4))
    reading = Reading(passages=2, budget=400, spans=True, neighbours=1, abstain=0.0)
    found = find_for_chat(finder, chat, QUESTION, reading)
    assert found and any("zeppelin" in f.passage.text for f in found)
    assert any(len(f.ids) > 1 for f in found)  # widened
    starts = [(f.passage.document_id, f.passage.char_start) for f in found]
    assert starts == sorted(starts)
    reply = answer(chat, finder, QUESTION, reading)
    "".join(reply)
    assert [f.ids for f in reply.found] == [f.ids for f in found]
    assert [c.text for c in reply.citations] == [f.passage.text for f in found]  # the story has no hard wraps
    prompt = reading_prompt(QUESTION, reply.found)
    assert all(f.passage.text in prompt for f in reply.found)


def test_spans_need_the_bank():
    from longmem.tasks.reading import fit_for_chat

    chat = Chat(chat_model(segment_len=128), None, Sampling(max_new_tokens=4))
    with pytest.raises(ValueError, match="needs the bank"):
        fit_for_chat([Found(None, 1.0)], chat, "Who?", Reading(spans=True))
    assert fit_for_chat([], chat, "Who?", Reading(spans=True)) == []  # nothing found: nothing to widen


def test_a_recorded_span_is_read_back_as_the_text_the_check_read(bank):
    """``eval.calibrate`` checks a recorded draft again against what it read: a passage's id gives its text, a span's
    ids the document's text from the first to the last."""
    from longmem.eval.calibrate import read_texts

    ps = passages(bank)
    span = widen(bank, [Found(ps[4], 1.0)], count, 10**6, neighbours=1)[0]
    assert read_texts(bank, [ps[1].id, list(span.ids), [ps[7].id], 10**9]) == [ps[1].text, span.passage.text,
                                                                                ps[7].text]
