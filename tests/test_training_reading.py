"""Reading items for training (``training/reading.py``): the app's prompt and the backbone's answer as an item, items
as training documents, and ``python -m training --reading-items``."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch

import training.reading as reading
from longmem.model.baselines import BackboneLM
from longmem.tasks.answer import answer, answer_sampling
from longmem.tasks.chat import Chat
from longmem.tasks.reading import PassageFinder, Reading, reading_prompt
from training.data import Batchfier, Document
from training.reading import (
    ReadingItem,
    answer_from,
    asked_books,
    book_items,
    question_from,
    read_items,
    reading_documents,
    reading_item,
)

SEG = 32


def item(book="b.txt", prompt=(5, 6, 7), answer_ids=(8, 9), position=0.5) -> ReadingItem:
    return ReadingItem(book, "Who?", position, list(prompt), list(answer_ids), "An answer.", True, "fp")


def test_question_from_takes_one_question_on_the_first_line():
    assert question_from("What did the miller carry?\nMore text.") == "What did the miller carry?"
    assert question_from('  "Who wrote the letter to Martha?"  ') == "Who wrote the letter to Martha?"
    assert question_from("The miller carried a letter.") is None  # not a question
    assert question_from("Who? Why did he go there then?") is None  # two
    assert question_from("Why?") is None  # too short to ask anything
    assert question_from("") is None


def test_an_item_is_the_apps_prompt_and_the_backbones_own_answer(loaded):
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    question = "What did the zeppelin carry before dawn?"
    source = next(p for p in bank.passages([pid for pid, _ in bank.passage_texts()]) if "zeppelin" in p.text)
    got = reading_item(model, finder, "story.txt", question, source)
    assert got is not None and got.source_read  # BM25 finds the one passage with the word
    # what BM25-RAG reads and answers, the same way
    chat = Chat(BackboneLM(model.backbone, model.segment_len), None, answer_sampling())
    reply = answer(chat, finder, question, Reading(finder="lexical", abstain=0.0))
    text = "".join(reply).strip()
    assert got.answer == text
    assert got.prompt_ids == chat.prompt_ids(question, reading_prompt(question, reply.found),
                                             history=False)[0].tolist()
    tok = model.backbone.tokenizer
    words = got.answer_ids[:-1] if got.answer_ids[-1:] == [tok.eos_token_id] else got.answer_ids
    assert tok.decode(words).strip() == text
    assert got.position == pytest.approx(source.char_end / source.document_chars)
    assert got.backbone == model.backbone.fingerprint()


def test_an_interrupted_book_goes_on_where_it_stopped(loaded, monkeypatch):
    """The question writer (Qwen in use) is outside what is tested here: it asks about each passage's first words."""
    model, bank, _ = loaded
    asked_about = []

    def writer(_, passage: str) -> str:
        asked_about.append(passage)
        return f"What did the {' '.join(passage.split()[1:3])} do?"

    monkeypatch.setattr(reading, "write_question", writer)
    monkeypatch.setattr(reading, "MIN_PASSAGE_CHARS", 0)
    whole = list(book_items(model, None, bank, "story.txt", 4, seed=0))
    first = list(book_items(model, None, bank, "story.txt", 2, seed=0))
    asked_about.clear()
    rest = list(book_items(model, None, bank, "story.txt", 2, seed=0, asked={i.position for i in first}))
    assert len(whole) == 4 and first + rest == whole  # no passage asked about twice, none skipped
    assert len(asked_about) == 2  # the first two passages were not written about again


def test_items_round_trip_and_a_cut_last_line_is_skipped(tmp_path):
    path = tmp_path / "items.jsonl"
    rows = [item(), item(book="c.txt")]
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows) + '{"book": "d.txt", "quest')
    assert read_items(path) == rows
    assert read_items(path, backbone="fp") == rows


def test_items_of_another_backbone_or_a_broken_line_are_refused(tmp_path):
    path = tmp_path / "items.jsonl"
    good = json.dumps(asdict(item()))
    path.write_text(f"{good}\n{good}\n")
    with pytest.raises(ValueError, match="line 1: its token ids are another backbone's"):
        read_items(path, backbone="other")
    path.write_text(f'{good}\n{{"book": 1}}\n{good}\n')
    with pytest.raises(ValueError, match="line 2: not a reading item"):
        read_items(path)


def test_a_document_reads_the_book_into_memory_then_the_prompt_and_answer():
    ids = np.arange(1000, 1000 + 10 * SEG, dtype=np.int32)
    docs = reading_documents([item(position=0.5)], {"b.txt": Document("b.txt", ids)}, SEG, context_segments=2)
    (doc,) = docs
    assert len(doc.ids) == 3 * SEG  # two segments of context, one of reading: whole segments only
    context, reading = doc.ids[:2 * SEG], doc.ids[2 * SEG:]
    end = int(context[-1]) - 1000 + 1  # the book's tokens up to here are in memory: the passage's and a little after
    assert np.array_equal(context, ids[end - 2 * SEG:end]) and end >= 0.5 * len(ids)
    assert reading[:5].tolist() == [5, 6, 7, 8, 9]  # the prompt opens the segment, as the app's window does
    assert np.array_equal(reading[5:], ids[end:end + SEG - 5])  # the book goes on after it
    assert np.flatnonzero(doc.answers).tolist() == [2 * SEG + 3, 2 * SEG + 4]  # the answer, weighted as answers are


def test_documents_leave_out_what_does_not_fit():
    ids = np.arange(4 * SEG, dtype=np.int32)
    books = {"b.txt": Document("b.txt", ids)}
    assert reading_documents([item(book="other.txt")], books, SEG, 1) == []  # no such book
    assert reading_documents([item(prompt=range(SEG))], books, SEG, 1) == []  # prompt and answer pass a segment
    assert reading_documents([item()], books, SEG, 4) == []  # the book is shorter than its context and the rest
    (early,) = reading_documents([item(position=0.0)], books, SEG, 0)  # no context: the prompt starts the document
    assert early.ids[:5].tolist() == [5, 6, 7, 8, 9] and len(early.ids) == SEG
    with pytest.raises(ValueError, match="context_segments"):
        reading_documents([item()], books, SEG, -1)


def test_reading_documents_batch_with_their_answers_marked():
    ids = np.arange(1000, 1000 + 8 * SEG, dtype=np.int32)
    items = [item(position=p) for p in (0.3, 0.6, 0.9)]
    docs = reading_documents(items, {"b.txt": Document("b.txt", ids)}, SEG, 1)
    b = Batchfier(docs, batch_size=3, segment_len=SEG).batch(1)  # every row's second segment: the reading one
    assert b.ids[:, :5].tolist() == [[5, 6, 7, 8, 9]] * 3
    assert b.answers.sum().item() == 6 and not b.reset.any()


def test_the_books_left_out_are_those_the_team_s_question_sets_ask_about():
    root = Path(__file__).resolve().parents[1] / "longmem" / "eval" / "data"
    books = asked_books()
    asked = {json.loads(line)["book"] for name in ("natural-tune", "unanswerable-tune", "natural-tune2",
                                                   "unanswerable-tune2", "natural-tune3", "natural-aside",
                                                   "unanswerable-aside", "natural-fresh", "unanswerable-fresh")
             for line in (root / f"{name}.jsonl").read_text().splitlines() if line}
    assert books == asked and len(books) >= 8


def test_a_question_set_missing_from_the_package_is_named(monkeypatch):
    import longmem.eval.natural as natural

    monkeypatch.setattr(natural, "ASIDE_SETS", [*natural.ASIDE_SETS, "natural-gone"])
    with pytest.raises(FileNotFoundError, match="'natural-gone'"):
        asked_books()


def split_books(root: Path) -> None:
    """A data folder: books a.txt (training split) and t.txt (test split), named in its MANIFEST.md."""
    books = root / "books"
    books.mkdir()
    (books / "a.txt").write_text("The miller carried a letter. " * 200)
    (books / "t.txt").write_text("A test book. " * 200)
    (root / "MANIFEST.md").write_text("| split | file |\n|---|---|\n| train | a.txt |\n| test | t.txt |\n")


def test_training_refuses_items_about_books_outside_its_split(tmp_path):
    from tiny import char_tokenizer

    from training.__main__ import build_data, parse_args

    split_books(tmp_path)
    path = tmp_path / "items.jsonl"
    for name, ok in (("a.txt", True), ("t.txt", False)):
        path.write_text(json.dumps(asdict(item(book=name))) + "\n")
        argv = ["--out", str(tmp_path / "run"), "--data", str(tmp_path), "--reading-items", str(path),
                "--eval-books", "0"]
        args = parse_args(argv)
        if ok:
            with pytest.raises(SystemExit, match="another backbone's"):
                build_data(args, char_tokenizer(), SEG, backbone="not fp")
            with pytest.raises(SystemExit, match="--reading-context must be >= 0"):
                build_data(parse_args([*argv, "--reading-context", "-1"]), char_tokenizer(), SEG, backbone="fp")
            train, _ = build_data(args, char_tokenizer(), SEG, backbone="fp")
            (doc,) = [d for d in train if d.name.startswith("reading-")]
            assert doc.answers is not None and doc.answers.sum() == 2
        else:
            with pytest.raises(SystemExit, match="outside the training split"):
                build_data(args, char_tokenizer(), SEG)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_item_in_either_dtype(bank_of, dtype):
    from helpers import story
    from tiny import chat_model

    model = chat_model(segment_len=512, dtype=dtype)
    bank = bank_of(model, story())
    source = next(p for p in bank.passages([pid for pid, _ in bank.passage_texts()]) if "zeppelin" in p.text)
    got = reading_item(model, PassageFinder(bank, model, bank.load_memory(model)), "story.txt",
                       "Where did the zeppelin go?", source)
    assert got is not None and got.source_read and len(got.prompt_ids) > 0


def test_answer_from_takes_one_complete_line():
    assert answer_from("The miller carried a letter.\nMore.") == "The miller carried a letter."
    assert answer_from('  He said "no."  ') == 'He said "no."'
    assert answer_from("The miller carried a letter to the") is None  # cut off mid-sentence
    assert answer_from("  \n ") is None


def _zeppelin(bank, has: bool):
    passages = bank.passages([pid for pid, _ in bank.passage_texts()])
    return next(p for p in passages if ("zeppelin" in p.text) == has)


def test_the_writer_teaches_where_the_questions_passage_is_read(loaded, monkeypatch):
    """The teacher (Qwen in use) is outside what is tested here: a fixed reply stands for it."""
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    question = "What did the zeppelin carry before dawn?"
    asked = []

    def teacher(_, passage: str, q: str) -> str:
        asked.append((passage, q))
        return "The zeppelin carried mail."

    monkeypatch.setattr(reading, "write_answer", teacher)
    source = _zeppelin(bank, has=True)
    own = reading_item(model, finder, "story.txt", question, source)
    got = reading_item(model, finder, "story.txt", question, source, teacher=object())
    assert asked == [(source.text, question)]  # it reads the question's passage alone
    assert got.answered_by == "writer" and own.answered_by == "backbone"
    assert got.answer == "The zeppelin carried mail." and got.source_read
    assert got.prompt_ids == own.prompt_ids  # the same prompt: what the app reads
    tok = model.backbone.tokenizer
    ended = [] if tok.eos_token_id is None else [tok.eos_token_id]  # a teacher's answer is whole: it ends
    assert got.answer_ids == tok("The zeppelin carried mail.", add_special_tokens=False).input_ids + ended


def test_the_backbone_answers_where_the_passage_is_not_read_or_the_teacher_fails(loaded, monkeypatch):
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    question = "What did the zeppelin carry before dawn?"
    own = reading_item(model, finder, "story.txt", question, _zeppelin(bank, has=True))
    asked = []
    monkeypatch.setattr(reading, "write_answer", lambda *a: asked.append(a) or "Mail.")
    unread = reading_item(model, finder, "story.txt", question, _zeppelin(bank, has=False), teacher=object())
    assert not asked and not unread.source_read and unread.answered_by == "backbone"
    assert unread.answer == own.answer  # the backbone's answer to the same prompt
    monkeypatch.setattr(reading, "write_answer", lambda *a: None)  # a reply that is not an answer
    failed = reading_item(model, finder, "story.txt", question, _zeppelin(bank, has=True), teacher=object())
    assert failed.answered_by == "backbone" and failed.answer == own.answer


def test_items_without_a_teacher_field_were_the_backbones_and_a_bad_answer_by_is_refused(tmp_path, loaded):
    path = tmp_path / "items.jsonl"
    old = asdict(item())
    del old["answered_by"]  # written before --answer-by
    path.write_text(json.dumps(old) + "\n")
    assert read_items(path)[0].answered_by == "backbone"
    model, bank, _ = loaded
    with pytest.raises(ValueError, match="answer_by must be one of"):
        next(book_items(model, None, bank, "story.txt", 1, seed=0, answer_by="oracle"))


def test_where_the_passage_was_not_read_another_answer_can_be_taught():
    ids = np.arange(1000, 1000 + 8 * SEG, dtype=np.int32)
    books = {"b.txt": Document("b.txt", ids)}
    read, unread = item(), replace(item(), source_read=False)
    kept = reading_documents([read, unread], books, SEG, 1)
    swapped = reading_documents([read, unread], books, SEG, 1, unread=[3, 2, 1])
    assert np.array_equal(kept[0].ids, swapped[0].ids)  # the passage was read: its own answer
    assert kept[1].ids[SEG:SEG + 5].tolist() == [5, 6, 7, 8, 9]
    assert swapped[1].ids[SEG:SEG + 6].tolist() == [5, 6, 7, 3, 2, 1]  # the prompt, then what is taught instead
    assert np.flatnonzero(swapped[1].answers).tolist() == [SEG + 3, SEG + 4, SEG + 5]


def test_training_teaches_the_apps_words_where_the_passage_was_not_read(tmp_path):
    from tiny import char_tokenizer

    from longmem.tasks.answer import NOT_SAID
    from training.__main__ import build_data, parse_args

    split_books(tmp_path)
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps(asdict(replace(item(book="a.txt"), source_read=False))) + "\n")
    argv = ["--out", str(tmp_path / "run"), "--data", str(tmp_path), "--reading-items", str(path), "--eval-books", "0"]
    tok = char_tokenizer()
    train, _ = build_data(parse_args([*argv, "--reading-unread", "not-said"]), tok, 64, backbone="fp")
    (doc,) = [d for d in train if d.name.startswith("reading-")]
    taught = doc.ids[doc.answers]
    assert tok.decode(taught.tolist()).startswith(NOT_SAID.split(".")[0])
    train, _ = build_data(parse_args(argv), tok, 64, backbone="fp")
    (doc,) = [d for d in train if d.name.startswith("reading-")]
    assert doc.ids[doc.answers].tolist() == [8, 9]  # the item's own answer
