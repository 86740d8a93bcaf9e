"""Finder questions (``training/questions.py``): a writer's reply read as a question and its answer, replies that are
not kept and why, the plan of passages (books in turns, resumed), records round-tripping, rows written together as
each would be alone."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from helpers import story
from tiny import CHAT_TEMPLATE, tiny_llama

import training.questions as questions
from training.questions import (
    EXAMPLES,
    FinderQuestion,
    book_passages,
    copies_example,
    grounded,
    parse_reply,
    plan,
    prompt_for,
    read_questions,
    record,
    write_batch,
)

PASSAGE = ("The gardener found Wilson's body a little way off in the grass, and the holocaust was complete. "
           "Gatsby's pool lay still under the late afternoon sun. " * 4)


def test_a_reply_is_a_question_line_and_an_answer_line():
    assert parse_reply("Question: Who found Wilson's body?\nAnswer: The gardener.") == (
        "Who found Wilson's body?", "The gardener")
    assert parse_reply('Question: "Who found the body?"\n\nAnswer: the gardener') == ("Who found the body?",
                                                                                    "the gardener")
    assert parse_reply("Who found Wilson's body?\nThe gardener") is None  # no labels
    assert parse_reply("Question: Who found it? And when?\nAnswer: the gardener") is None  # two questions
    assert parse_reply("Question: Who?\nAnswer: the gardener") is None  # too short
    assert parse_reply("Question: Who found Wilson's body?") is None  # no answer
    assert parse_reply("Question: Who found Wilson's body?\nAnswer: " + "word " * 31) is None  # an answer too long


def test_an_answer_is_grounded_when_most_of_its_words_are_the_passages():
    assert grounded("The gardener", PASSAGE)
    assert grounded("Wilson's body, in the grass", PASSAGE)
    assert not grounded("A chauffeur from Long Island", PASSAGE)
    assert not grounded("", PASSAGE)


def test_a_question_copied_from_the_examples_is_caught():
    assert copies_example(EXAMPLES[1])
    assert copies_example("How much did Hash Todhunter pay for the cat?")
    assert not copies_example("Who found Wilson's body in the grass near the pool?")


@pytest.mark.parametrize("reply, why", [
    ("Question: Who found Wilson's body?\nAnswer: The gardener.", None),
    ("Who found it", "not a question and an answer"),
    ("Question: What is the main theme of the passage?\nAnswer: the pool", "asks about the passage"),
    ("Question: Who found Wilson's body?\nAnswer: A chauffeur from Long Island", "answer not in the passage"),
])
def test_a_record_is_kept_or_says_why_not(reply, why):
    r = record("b.txt", (10, 10 + len(PASSAGE), PASSAGE), reply, "writer", "id")
    assert r.why == why and r.kept == (why is None) and (r.book, r.start) == ("b.txt", 10)
    assert r.question == (None if why else "Who found Wilson's body?")


def test_a_copied_example_is_not_kept_when_examples_are_shown(monkeypatch):
    span = (0, len(PASSAGE), PASSAGE)
    reply = "Question: " + EXAMPLES[0] + "\nAnswer: the gardener"
    assert record("b.txt", span, reply, "w", "id").kept == (questions.SHOWN == 0)
    monkeypatch.setattr(questions, "SHOWN", 4)
    assert record("b.txt", span, reply, "w", "id").why == "copies an example"
    assert sum(q in prompt_for(PASSAGE, "a") for q in EXAMPLES) == 4  # four of them, shown with the passage


def test_records_round_trip_a_cut_last_line_is_skipped_and_a_broken_one_named(tmp_path):
    rows = [FinderQuestion("b.txt", 0, 9, "Who?", "him", "w", "id"),
            FinderQuestion("b.txt", 9, 20, None, None, "w", "id", why="not a question and an answer")]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows) + '{"book": "b.t')
    assert read_questions(path) == rows
    path.write_text('{"book": 1}\n' + json.dumps(asdict(rows[0])) + "\n")
    with pytest.raises(ValueError, match="line 1: not a finder question"):
        read_questions(path)


def test_a_prompt_holds_the_passage_and_the_request_the_same_in_every_run():
    p = prompt_for(PASSAGE, "b.txt:10")
    assert PASSAGE in p and questions.ASK in p and p == prompt_for(PASSAGE, "b.txt:10")


def books(tmp_path: Path, n: int = 3) -> list[Path]:
    out = []
    for i in range(n):
        path = tmp_path / f"book{i}.txt"
        path.write_text(story(chapters=2, paragraphs=8, seed=i))
        out.append(path)
    return out


def test_the_plan_takes_books_in_turns_and_leaves_out_what_is_done(tmp_path):
    paths = books(tmp_path)
    todo = plan(paths, per_book=3, seed=0, done=set())
    assert [b for b, _ in todo[:3]] == ["book0.txt", "book1.txt", "book2.txt"]  # in turns
    assert len(todo) == 9 and all(len(s[2]) >= questions.MIN_PASSAGE_CHARS for _, s in todo)
    text = paths[0].read_text()
    assert all(text[s[0]:s[1]] == s[2] for b, s in todo if b == "book0.txt")  # a span is the book's characters
    done = {(b, s[0]) for b, s in todo[:4]}
    assert sorted(plan(paths, per_book=3, seed=0, done=done)) == sorted(todo[4:])  # resumed: the same passages,
    #                                                                                less those asked
    assert plan(paths, per_book=3, seed=1, done=set()) != todo  # another seed, other passages


def test_passages_are_those_a_bank_cuts_long_enough_to_ask_about(tmp_path):
    from longmem.text.passages import cut_passages

    text = books(tmp_path, 1)[0].read_text()
    spans = book_passages(text)
    assert spans and {s[0] for s in spans} <= {p.start for p in cut_passages(text)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_written_together_are_what_each_writes_alone(dtype):
    writer = tiny_llama(dtype=dtype)
    writer.tokenizer.chat_template = CHAT_TEMPLATE
    prompts = [prompt_for("A short passage about a mill.", "a"), prompt_for(PASSAGE, "b")]
    with pytest.raises(ValueError, match="neither a padding nor an end-of-text token"):
        write_batch(writer, prompts, max_new_tokens=4)
    writer.tokenizer.eos_token = "\n"
    together = write_batch(writer, prompts, max_new_tokens=6)
    alone = [write_batch(writer, [p], max_new_tokens=6)[0] for p in prompts]
    assert len(together) == 2 and together == alone
