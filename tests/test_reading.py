"""Reading: fusion of the finders, the memory finder's votes, the reading prompt within its budget, cited answers
through the workspace (real bank, SQLite, FTS5, faiss; tiny llama)."""

from __future__ import annotations

import json
import re

import pytest
from helpers import story
from tiny import chat_model

from longmem.ingest.pipeline import ingest
from longmem.model.lm import Sampling
from longmem.service import Settings, Workspace
from longmem.storage import BankDirectory
from longmem.tasks.chat import Chat
from longmem.tasks.reading import (
    INSTRUCTION,
    PASSAGES_READ,
    READING_TOPK,
    PassageFinder,
    Reading,
    citations,
    find_for_chat,
    fit,
    fuse,
    reading_prompt,
)
from longmem.text.passages import ELLIPSIS

QUESTION = "What drifted over the harbour? A zeppelin?"


def test_reciprocal_rank_fusion_by_hand():
    got = fuse({"memory": [7, 3, 9], "lexical": [3, 5]}, k=60)
    want = {7: 1 / 61, 3: 1 / 62 + 1 / 61, 9: 1 / 63, 5: 1 / 62}
    assert [p for p, _ in got] == [3, 7, 5, 9]  # 5 and 9 tie on nothing: 1/62 > 1/63
    assert all(s == pytest.approx(want[p]) for p, s in got)
    assert [p for p, _ in fuse({"a": [1, 2], "b": [2, 1]})] == [1, 2]  # equal scores: the best single rank, then id


def test_reading_settings_are_checked():
    with pytest.raises(ValueError, match="finder must be one of"):
        Reading(finder="vector")
    with pytest.raises(ValueError, match=">= 0"):
        Reading(passages=-1)
    with pytest.raises(ValueError, match="topk must be >= 1"):
        Reading(topk=0)


def test_the_app_the_cli_and_the_records_read_as_many_passages():
    """One default for how many passages an answer reads: the app's chat, ``longmem chat`` and the reading suites'
    full sizes (what the records measure is what the app does)."""
    from longmem.cli.main import build_parser
    from longmem.eval import bookqa, facts, natural

    cli = build_parser().parse_args(["chat", "--bank", "b", "--ask", "q"]).passages
    got = [Settings().passages, Reading().passages, cli, bookqa.FULL.passages, natural.FULL.passages,
           facts.FULL.passages]
    assert got == [PASSAGES_READ] * 6


def test_an_answer_reads_fewer_memory_tokens_while_it_reads_passages():
    class Mem:
        chunk_size = 4

    found = ["a passage"]
    assert Reading().chunks(Mem, found, model_topk=1024) == READING_TOPK // 4  # 64 chunks of 4
    assert Reading().chunks(Mem, [], model_topk=1024) is None  # nothing read: the model's own K
    assert Reading(topk=None).chunks(Mem, found, model_topk=1024) is None
    assert Reading(topk=2048).chunks(Mem, found, model_topk=1024) == 256  # never more than the model's own
    assert Reading(topk=2).chunks(Mem, found, model_topk=1024) == 1  # at least one chunk


def test_the_chat_searches_memory_at_the_reading_k_while_it_reads(tmp_path, monkeypatch):
    from tiny import CHAT_TEMPLATE, small_config, tiny_llama

    from longmem.memory.memory import Memory
    from longmem.model.longmem import LongMemModel

    backbone = tiny_llama()
    backbone.tokenizer.chat_template = CHAT_TEMPLATE
    model = LongMemModel(backbone, small_config(segment_len=512, topk=1024))  # chunks of 2: 512 per query
    ws = Workspace(model, BankDirectory(tmp_path / "banks"), work_dir=tmp_path / "work")
    book = tmp_path / "story.txt"
    book.write_text(story())
    assert ws.jobs.wait(ws.ingest("b", [book], create=True), timeout=600).status == "done"
    asked: list[int] = []
    for name in ("search", "select"):
        real = getattr(Memory, name)
        monkeypatch.setattr(Memory, name, lambda self, q, n, real=real: asked.append(n) or real(self, q, n))
    try:
        for settings, want in [(Settings(finder="lexical"), READING_TOPK // 2), (Settings(finder="none"), 512),
                               (Settings(finder="lexical", chunks=5), 5)]:
            asked.clear()
            reply = ws.chat("b", QUESTION, Settings(**{**settings.__dict__, "max_new_tokens": 2, "temperature": 0}))
            list(reply)
            assert bool(reply.citations) == (settings.finder != "none") and set(asked) == {want}, settings
    finally:
        ws.close()


def test_the_excerpts_read_need_not_search_memory(searched_queries):
    model = chat_model(segment_len=256)
    memory = model.new_memory(capacity=None)
    model.memorize(model.backbone.tokenizer(story()[:400], return_tensors="pt").input_ids, memory)
    excerpts = f"Read these excerpts.\n\n[1] (story)\nA zeppelin drifted over the harbour.\n\nQuestion: {QUESTION}"
    searched = searched_queries
    chat = Chat(model, memory, Sampling(max_new_tokens=2, temperature=0))
    list(chat.ask("Hello?"))  # an earlier turn, in the window
    for search_excerpts in (True, False):
        searched.clear()
        prompt = chat.prompt_ids(QUESTION, excerpts).shape[1]  # the earlier turn, the excerpts, the question
        list(chat.ask(QUESTION, excerpts, search_excerpts=search_excerpts))
        tail = len(" " + QUESTION + "\n<assistant>")  # one token per character, the space before the question too
        assert sum(searched) == (prompt if search_excerpts else tail) + 1, search_excerpts  # then each answer token
        #                                                                        but the last (nothing comes after it)
        chat.history = chat.history[:2]


def test_each_finder_ranks_passages_and_fusion_keeps_their_ranks(loaded):
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    lexical = finder.rank(QUESTION, "lexical", 10)
    assert "zeppelin" in lexical[0].passage.text and lexical[0].ranks == {"lexical": 1}
    by_memory = finder.rank(QUESTION, "memory", 10)
    assert by_memory and all(f.ranks["memory"] == i for i, f in enumerate(by_memory, 1))
    assert [f.score for f in by_memory] == sorted((f.score for f in by_memory), reverse=True)  # votes, best first
    fused = finder.rank(QUESTION, "fused", 10)
    assert {f.passage.id for f in fused} <= {f.passage.id for f in lexical + by_memory}
    top = fused[0]
    want = sum(1 / (60 + r) for r in top.ranks.values())
    assert top.score == pytest.approx(want) and all(f.score <= top.score for f in fused)
    assert finder.find(QUESTION, Reading(finder="none")) == [] and len(finder.find(QUESTION, Reading(passages=2))) == 2


STORIES = ("The Silver Harbour", "The Iron Mill", "The Last Ferry")


@pytest.fixture
def collection(bank_of):
    """A tiny chat llama, a bank of a collection of three titled stories (the zeppelin in the second) and a finder."""
    model = chat_model(segment_len=512)
    bank = bank_of(model, story(titles=STORIES))
    return bank, PassageFinder(bank, model, bank.load_memory(model))


def test_a_question_naming_a_story_is_looked_for_in_it(collection):
    bank, finder = collection
    assert bank.chapter_labels() == [f"Chapter {n}: {t}" for n, t in zip(("I", "II", "III"), STORIES)]
    question = "In 'The Last Ferry', what drifted over the harbour? A zeppelin?"
    plain = finder.rank(question, "lexical", 10)
    assert "zeppelin" in plain[0].passage.text and plain[0].passage.label.endswith("The Iron Mill")
    scoped = finder.rank(question, "lexical", 10, sections=True)
    assert scoped and {f.passage.label for f in scoped} == {"Chapter III: The Last Ferry"}
    assert [f.score for f in scoped] == sorted((f.score for f in scoped), reverse=True)  # still BM25's order
    assert finder.rank(QUESTION, "lexical", 10, sections=True) == finder.rank(QUESTION, "lexical", 10)  # none named
    read = finder.find(question, Reading())  # the app's reading looks in the story; a baseline's does not
    assert read == scoped[:PASSAGES_READ] and finder.find(question, Reading(sections=False)) == plain[:PASSAGES_READ]


def test_a_question_about_how_a_story_ends_reads_its_last_passages(collection):
    bank, finder = collection
    last = [p for p, in bank.db.execute("SELECT id FROM passages WHERE label = 'Chapter II: The Iron Mill' "
                                        "ORDER BY id")][-3:]
    found = finder.rank("In 'The Iron Mill', what finally happened to the miller?", "lexical", 3, sections=True)
    assert [f.passage.id for f in found] == last[::-1]  # the last first: read best last, they read in book order
    assert bank.last_passages(["Chapter II: The Iron Mill"], 2) == last[:-3:-1]


def test_a_named_story_without_the_question_s_words_leaves_the_whole_book_searched(collection):
    bank, finder = collection
    (pid,) = next(r for r in bank.db.execute("SELECT id FROM passages WHERE label LIKE '%Last Ferry' AND text NOT "
                                             "LIKE '%harbour%' AND text NOT LIKE '%drift%' ORDER BY id DESC"))
    bank.db.execute("UPDATE passages SET label = 'Chapter IV: Quixotic Zebras' WHERE id = ?", [pid])
    question = "In 'Quixotic Zebras', what drifted over the harbour? A zeppelin?"
    assert bank.search_passages(question, 10, ["Chapter IV: Quixotic Zebras"]) == []
    assert finder.rank(question, "lexical", 10, sections=True) == finder.rank(question, "lexical", 10)


def test_the_memory_finder_follows_what_the_memory_layer_retrieved(loaded, monkeypatch):
    """Votes are the chunks the model's own search returned for the question, mapped to passages."""
    import longmem.tasks.reading as reading

    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)
    zeppelin = bank.search_passages("zeppelin", 1)[0][0]
    (ref,) = bank.passages([zeppelin])
    serial = (ref.char_start + 10) // model.chunk_size  # a token is a character here
    monkeypatch.setattr(reading, "memory_votes", lambda *a: {serial: 40, 0: 3})
    ranked = finder.rank("anything", "memory", 5)
    assert [f.passage.id for f in ranked][:1] == [zeppelin] and ranked[0].score == 40


def test_the_prompt_holds_numbered_excerpts_within_the_budget(loaded):
    model, bank, memory = loaded
    found = PassageFinder(bank, model, memory).rank(QUESTION, "fused", 10)
    tok = model.backbone.tokenizer
    kept = fit(found, tok, budget=500)
    assert kept and sum(len(tok(f.passage.text).input_ids) + 8 for f in kept) <= 500
    assert len(fit(found, tok, budget=10)) == 0 and fit(found, tok, budget=10**6) == found
    prompt = reading_prompt(QUESTION, kept)
    assert prompt.startswith(INSTRUCTION) and prompt.endswith(f"Question: {QUESTION}")
    assert all(f"[{i}] ({f.passage.prompt_place()})\n{f.passage.text}" in prompt for i, f in enumerate(kept, 1))
    assert reading_prompt(QUESTION, []) == QUESTION


def test_best_last_puts_the_best_passage_nearest_the_question(tmp_path):
    model = chat_model(segment_len=512)  # room for two passages of the tiny tokenizer's characters
    (tmp_path / "story.txt").write_text(story())
    bank = BankDirectory(tmp_path / "banks").create("b", model)
    ingest(bank, model, tmp_path / "story.txt")
    memory = bank.load_memory(model)
    finder = PassageFinder(bank, model, memory)
    chat = Chat(model, memory, Sampling(max_new_tokens=8))
    first = find_for_chat(finder, chat, QUESTION, Reading(finder="lexical", passages=2, best_last=False))
    last = find_for_chat(finder, chat, QUESTION, Reading(finder="lexical", passages=2, best_last=True))
    assert len(first) == 2 and last == first[::-1] and "zeppelin" in last[-1].passage.text
    prompt = reading_prompt(QUESTION, last)
    assert prompt.index("zeppelin") > prompt.index(last[0].passage.text)  # the best excerpt is read last, as [2]
    assert f"[2] ({last[-1].passage.prompt_place()})" in prompt
    assert [c.number for c in citations(bank, last)] == [1, 2] and "zeppelin" in citations(bank, last)[1].text
    bank.close()


@pytest.fixture
def ws(tmp_path):
    ws = Workspace(chat_model(segment_len=512), BankDirectory(tmp_path / "banks"), work_dir=tmp_path / "work")
    book = tmp_path / "story.txt"
    book.write_text(story())
    assert ws.jobs.wait(ws.ingest("b", [book], create=True), timeout=600).status == "done"
    yield ws
    ws.close()


def test_a_chat_answer_reads_and_cites_its_passages(ws, monkeypatch):
    seen = []
    generate = ws.model.generate
    monkeypatch.setattr(ws.model, "generate", lambda ids, *a, **k: seen.append(ids) or generate(ids, *a, **k))
    reply = ws.chat("b", QUESTION, Settings(max_new_tokens=8, temperature=0, finder="lexical", passages=3))
    list(reply)
    assert 1 <= len(reply.citations) <= 3 and "zeppelin" in reply.citations[-1].text  # the best, read last
    c = reply.citations[-1]
    assert c.number == len(reply.citations) and re.fullmatch(r"story, Chapter II, \d+% through the book", c.place)
    assert c.text in c.context and len(c.context) > len(c.text)
    words = set(story().split())
    shown = c.context.strip(ELLIPSIS).split()  # "…" where the text around was cut inside a sentence
    assert shown[0] in words and shown[-1] in words  # whole words at both ends
    read = ws.model.backbone.tokenizer.decode(seen[0][0])
    assert c.text in read and QUESTION in read  # the model read the excerpt before the question
    (turn_q, turn_a) = ws.chat_history("b")
    assert turn_q["content"] == QUESTION and turn_a["citations"] == reply.citations  # stored with the turn


def test_reading_off_is_the_paper_memory_fusion_alone(ws):
    reply = ws.chat("b", QUESTION, Settings(max_new_tokens=4, temperature=0, finder="none"))
    list(reply)
    assert reply.citations == [] and ws.chat_history("b")[-1]["citations"] == []


def test_turns_stored_before_reading_existed_still_load(ws):
    with ws.directory.open("b") as bank:  # the 0.1 layout: a list of what memory retrieved
        bank.db["chat_turns"].insert_all([
            {"role": "user", "content": "old?", "passages": "[]", "created": "then"},
            {"role": "assistant", "content": "yes", "created": "then", "passages": json.dumps([
                {"document": "story", "location": "part 1 of 2", "text": "t", "context": "c t c", "hits": 3}])}])
    old = ws.chat_history("b")[-1]
    assert old["citations"] == [] and old["retrieved"][0].hits == 3


@pytest.fixture
def library(bank_of, tmp_path):
    """A bank of two books, both telling of a zeppelin over the harbour (different seeds), and a finder."""
    model = chat_model(segment_len=512)
    bank = bank_of(model, story(seed=1), filename="harbour.txt")
    second = tmp_path / "ferry.txt"
    second.write_text(story(seed=2))
    ingest(bank, model, second, title="The Ferry of Saint Anne")
    docs = {d.title: d.id for d in bank.documents()}
    return bank, docs, PassageFinder(bank, model, bank.load_memory(model))


@pytest.mark.parametrize("finder", ["lexical", "memory", "fused"])
def test_a_library_s_finder_looks_in_the_books_picked(library, finder):
    bank, docs, find = library
    everywhere = find.rank(QUESTION, finder, 50)
    assert {f.passage.document_id for f in everywhere} == set(docs.values())  # the whole library
    ferry = docs["The Ferry of Saint Anne"]
    only = find.rank(QUESTION, finder, 50, books=(ferry,))
    assert only and {f.passage.document_id for f in only} == {ferry}
    assert [f.passage.document for f in only][0] == "The Ferry of Saint Anne"  # a citation names its book
    read = find.find(QUESTION, Reading(finder=finder, books=(ferry,)))
    assert read and all(f.passage.document_id == ferry for f in read)


def test_a_question_naming_a_book_of_the_library_is_looked_for_in_it(library):
    bank, docs, find = library
    ferry = docs["The Ferry of Saint Anne"]
    question = "In The Ferry of Saint Anne, what drifted over the harbour? A zeppelin?"
    assert find.books_for(question) == [ferry]
    assert find.books_for("In *The Ferry of Saint Anne*, who?") == [ferry]  # a title in asterisks, as in Markdown
    assert find.books_for(QUESTION) is None  # none named: the whole bank
    named = find.rank(question, "fused", 50, sections=True)
    assert named and {f.passage.document_id for f in named} == {ferry}
    assert len({f.passage.document_id for f in find.rank(question, "fused", 50)}) == 2  # sections off: everywhere
    other = next(i for t, i in docs.items() if i != ferry)
    assert find.books_for(question, (other,)) == [other]  # a book named but not picked: the picked ones
