"""Readers apart from memory (``longmem.model.readers``): which reader "auto" means, and a bank answered through
another model than its own without re-ingestion, memory off, the reply naming the reader: in the workspace (both
dtypes), the evaluation's entrants and ``longmem chat --json``; the bank, SQLite and faiss real, the readers tiny
GGUF files written in the test (and, in the integration test, the embedded 135M as the bank's model)."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch
from helpers import story
from tiny import chat_model
from tiny_gguf import tiny_gguf

from longmem.cli.main import main
from longmem.eval.answering import Asked, Entrants, Haystack, ReadingSize
from longmem.model import readers
from longmem.model.backbone import DEFAULT_NAME, BackboneError
from longmem.model.baselines import BackboneLM
from longmem.model.downloads import DOWNLOADS, model_path
from longmem.service import Settings, Workspace
from longmem.storage import BankDirectory

QUESTION = "What drifted over the harbour?"
JOB_TIMEOUT = 600  # seconds: a guard against a hung job, not a speed target


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache (nothing fetched) and no reader named by the environment."""
    monkeypatch.setenv("LONGMEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(readers.READER_ENV, raising=False)
    return tmp_path / "cache"


def pretend_fetched(name: str) -> None:
    """A file of the pinned size where a fetched model lives (``fetched`` checks the size; sparse, so no disk)."""
    path = model_path(DOWNLOADS[name])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(DOWNLOADS[name].size)


@pytest.fixture(scope="module", autouse=True)
def module_cache(tmp_path_factory):
    """The module's own cache: the GGUF files converted here stay out of the user's (where the app lists them)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LONGMEM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory):
    """A tiny random Qwen2 model written as GGUF, with a chat template: a reader none of the banks was made with."""
    path = tmp_path_factory.mktemp("reader") / "tiny-qwen.gguf"
    tiny_gguf(path, "qwen2", seed=3)
    return str(path)


def test_auto_is_the_best_installed_reader_unless_the_environment_names_one(cache, monkeypatch):
    assert readers.installed() == ["default"] and readers.choose("auto") == "default" == readers.choose(None)
    pretend_fetched("qwen2.5-coder-0.5b")
    assert readers.installed() == ["qwen2.5-coder-0.5b", "default"] and readers.choose("") == "qwen2.5-coder-0.5b"
    pretend_fetched("qwen2.5-coder-1.5b")
    assert readers.installed()[0] == "qwen2.5-coder-1.5b" == readers.choose("auto")  # the larger first
    monkeypatch.setenv(readers.READER_ENV, "default")
    assert readers.choose("auto") == "default"  # make run READER=default; the test suite's own setting
    assert readers.choose("qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b"  # a name given wins over the environment
    assert readers.choose("/models/x.gguf") == "/models/x.gguf"


def test_readers_are_named_as_people_know_them(tmp_path):
    assert readers.label("default") == DEFAULT_NAME and readers.label("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"
    assert readers.label("/models/My-Model.Q4_K_M.gguf") == "My-Model.Q4_K_M"
    assert readers.same_model("default", "default") and not readers.same_model("qwen2.5-coder-0.5b", "default")
    (tmp_path / "m.gguf").write_bytes(b"")
    assert readers.same_model(str(tmp_path / "m.gguf"), str(tmp_path / "." / "m.gguf"))  # one file, two spellings


def test_a_reader_that_is_not_there_says_how_to_get_it(cache, tmp_path):
    with pytest.raises(BackboneError, match="longmem models get qwen2.5-coder-1.5b"):
        readers.load_reader("qwen2.5-coder-1.5b")
    with pytest.raises(BackboneError, match="no such GGUF file"):
        readers.load_reader(str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_bank_answers_through_another_reader_without_reingesting(tmp_path, qwen_gguf, dtype):
    ws = Workspace(chat_model(segment_len=512, dtype=dtype), BankDirectory(tmp_path / "banks"))
    try:
        book = tmp_path / "story.txt"
        book.write_text(story())
        state = ws.jobs.wait(ws.ingest("b", [book], create=True), timeout=JOB_TIMEOUT)
        assert state.status == "done", state.message
        with ws.directory.open("b") as bank:
            before = (bank.version(), bank.stats()["tokens"])
        quick = Settings(max_new_tokens=8, temperature=0.0, abstain=False, reader=qwen_gguf)
        reply = ws.chat("b", QUESTION, quick)
        text = "".join(reply)
        assert reply.reader == "tiny-qwen" and reply.memory is False  # (a random reader's words are not checked)
        assert reply.retrieved == [] and reply.citations  # it read the found passages, and no memory
        assert "zeppelin" in " ".join(c.text for c in reply.citations)
        with ws.directory.open("b") as bank:
            assert (bank.version(), bank.stats()["tokens"]) == before  # nothing was ingested again
        own = ws.chat("b", QUESTION, Settings(max_new_tokens=8, temperature=0.0, abstain=False, reader="default"))
        "".join(own)
        assert own.memory is True and own.reader == DEFAULT_NAME and own.retrieved  # the bank's model, its memory
        turns = [t for t in ws.chat_history("b") if t["role"] == "assistant"]
        assert [(t["reader"], t["memory"]) for t in turns] == [("tiny-qwen", False), (DEFAULT_NAME, True)]
        assert turns[0]["content"] == text  # the conversation keeps what the other reader said
    finally:
        ws.close()


def test_the_workspace_offers_its_default_reader_and_the_installed_ones(tmp_path, cache, qwen_gguf):
    ws = Workspace(chat_model(), BankDirectory(tmp_path / "banks"), reader=qwen_gguf)
    try:
        assert ws.default_reader == qwen_gguf and ws.model_info()["reader"] == "tiny-qwen"
        assert ws.readers() == [(DEFAULT_NAME, "default"), ("tiny-qwen", qwen_gguf)]
        assert [r["name"] for r in ws.fetchable_readers()] == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
        assert not any(r["fetched"] for r in ws.fetchable_readers())
    finally:
        ws.close()


def test_the_evaluations_app_reads_with_the_reader_as_bm25_rag_does(loaded, qwen_gguf):
    """With another reader, the app's entrant and BM25-RAG read the same passages with the same model (the check off,
    no chapter titles to narrow by): the same answer; LongMem's memory is not read."""
    model, bank, memory = loaded
    reader = readers.load_reader(qwen_gguf, torch.float32, "cpu", model.segment_len)
    size = ReadingSize(entrants=["app", "rag_bm25"], abstain=0.0, new_tokens=8, reader=qwen_gguf)
    entrants = Entrants(model, reader, None, size, None, reader)
    hay = Haystack(bank, memory, torch.zeros(0, dtype=torch.int64).numpy())
    reads = {"lexical": []}
    got = entrants.answers({"app", "rag_bm25"}, Asked(QUESTION, ("zeppelin",), [], lambda f: False, []), hay, reads)
    assert got["app"]["answer"] == got["rag_bm25"]["answer"] and len(reads["lexical"]) == 1
    plain = Entrants(model, BackboneLM(model.backbone, model.segment_len), None, size)
    assert plain.app_reader is model and entrants.app_reader is reader


def test_the_script_s_answer_is_the_app_s_draft_only_where_both_read_the_same_prompt_the_same_way(bank_of,
                                                                                                 qwen_gguf):
    """Reading as the script (a window of the whole short book), the app's prompt is the script's word for word with
    the same reader, window and decoding: the eval takes the script's answer from the app's draft, which is what the
    script's reader answers; with another prompt, or another decoding, the script's reader answers itself."""
    from dataclasses import replace as changed

    from longmem.eval.ragscript import script_answer
    from longmem.tasks.setup import SCRIPT_READING

    model = chat_model(segment_len=512)
    text = story(chapters=1, paragraphs=3)  # under 1,600 characters: one window, as the script cuts it
    bank = bank_of(model, text)
    reader = readers.load_reader(qwen_gguf, torch.float32, "cpu", 2048)
    size = ReadingSize(entrants=["app", "rag_script"], new_tokens=6, reader=qwen_gguf, no_repeat=0,
                       **SCRIPT_READING.reading)
    script = BackboneLM(reader.backbone, 2048)
    entrants = Entrants(model, reader, None, size, None, reader, script)
    hay = Haystack(bank, bank.load_memory(model), torch.zeros(0, dtype=torch.int64).numpy(), text=text)
    asked = Asked(QUESTION, ("zeppelin",), [], lambda f: False, [])
    got = entrants.answers({"app", "rag_script"}, asked, hay, {"windows": [], "script": []})
    assert entrants.decodes_as_script() and got["rag_script"]["same_prompt"]
    assert got["rag_script"]["answer"] == got["app"]["draft"] == script_answer(script, hay.script.prompt(QUESTION)[0],
                                                                                 6)
    for other in (changed(size, prompt="book"), changed(size, no_repeat=4)):
        again = Entrants(model, reader, None, other, None, reader, script).answers(
            {"app", "rag_script"}, asked, hay, {"windows": [], "script": []})
        assert not again["rag_script"]["same_prompt"] and again["rag_script"]["answer"] == got["rag_script"]["answer"]


def reply_of(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out  # one JSON object, nothing else on standard output
    return json.loads(lines[0])


@pytest.mark.heavy
def test_chat_json_prints_one_object_naming_the_reader(tmp_path, qwen_gguf, capsys):
    bank_model = tmp_path / "bank-model.gguf"
    tiny_gguf(bank_model, "llama", seed=1)
    book = tmp_path / "story.txt"
    book.write_text(story())
    code = main(["chat", "--backbone", str(bank_model), "--untrained", "--file", str(book), "--ask", QUESTION,
                 "--reader", qwen_gguf, "--json", "--max-new-tokens", "8", "--dtype", "float32"])
    assert code == 0
    got = reply_of(capsys.readouterr().out)
    assert set(got) == {"answer", "said", "reader", "memory", "passages"}
    assert got["reader"] == "tiny-qwen" and got["memory"] is False and isinstance(got["said"], bool)
    assert got["passages"] and all(set(p) == {"document", "place", "text", "rests"} for p in got["passages"])
    assert any("zeppelin" in p["text"] for p in got["passages"])
    assert main(["chat", "--file", str(book), "--json"]) == 2  # --json answers one question, given with --ask


@pytest.mark.integration
def test_a_135m_bank_answers_through_a_tiny_qwen2_gguf(tmp_path, qwen_gguf, capsys):
    """The issue's case: the embedded 135M ingests, a Qwen2 GGUF reads; the reply names it and says memory was not
    read (the reader is random: what it says is not checked, only who said it and what it read)."""
    book = tmp_path / "story.txt"
    book.write_text(story())
    assert os.environ[readers.READER_ENV] == "default"  # the suite never answers with a fetched reader
    code = main(["chat", "--file", str(book), "--ask", QUESTION, "--reader", qwen_gguf, "--json",
                 "--max-new-tokens", "8"])
    assert code == 0
    got = reply_of(capsys.readouterr().out)
    assert got["reader"] == "tiny-qwen" and got["memory"] is False
    assert any("zeppelin" in p["text"] for p in got["passages"])
    code = main(["chat", "--file", str(book), "--ask", QUESTION, "--json", "--max-new-tokens", "8"])
    got = reply_of(capsys.readouterr().out)
    assert code == 0 and got["reader"] == DEFAULT_NAME and got["memory"] is True  # auto: the embedded 135M here


def test_the_check_is_calibrated_on_recorded_drafts_without_asking_the_reader():
    from longmem.eval.calibrate import checked, choose, outcomes
    from longmem.tasks.answer import NOT_SAID

    passage = "The harbour lay still that morning. A grey zeppelin drifted over the harbour at dawn. Gulls cried."
    rows = [  # right; an invention after a right sentence; an unanswerable question answered; one left unsaid
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A grey zeppelin drifted over it.",
         "passages": [passage], "answer": "A grey zeppelin drifted over it.", "least": 0.5},
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A purple balloon from Paris.",
         "passages": [passage], "answer": NOT_SAID, "least": 0.5},
        {"question": "Who owned the zeppelin?", "golds": (), "draft": "Count Oskar von Brandt owned it.",
         "passages": [passage], "answer": NOT_SAID, "least": 0.5},
    ]
    assert checked(rows[1]["draft"], QUESTION, [passage], 0.5) == NOT_SAID
    assert checked(rows[1]["draft"], QUESTION, [passage], 0.0) == rows[1]["draft"]  # 0: every draft shown
    at = {t: outcomes(rows, t) for t in (0.0, 0.5)}
    assert (at[0.5]["right"], at[0.5]["declined"], at[0.5]["wrong"], at[0.5]["not_said"]) == (1, 1, 0, 1)
    assert at[0.5]["agrees"] == 3 and at[0.0]["agrees"] == 0  # the run's own threshold gives back its replies
    assert (at[0.0]["wrong"], at[0.0]["invented"]) == (1, 1) and round(at[0.0]["wrong_pct"]) == 67
    assert choose(list(at.values()))["least"] == 0.5 and choose([at[0.0]], wrong_at_most=50) is None
    # a run that never declined (decline 1): each draft with the reader's probability of "The book does not say."
    never = [r | {"declines_at": 1.0, "decline": p} for r, p in zip(rows, (0.2, 0.9, 0.7))]
    swept = {d: outcomes(never, 0.5, d) for d in (0.5, 0.8, 1.0)}
    assert [(o["right"], o["declined"], o["not_said"]) for o in swept.values()] == [(1, 1, 1), (1, 1, 1), (1, 1, 1)]
    assert outcomes(never, 0.0, 0.5)["invented"] == 0 and outcomes(never, 0.0, 0.8)["invented"] == 1
    assert outcomes(never, 0.0, 0.1)["right"] == 0  # sure of declining everywhere: even the right draft goes
    with pytest.raises(ValueError, match="never declined"):
        outcomes([r | {"declines_at": 0.5, "decline": 0.2} for r in rows], 0.5, 0.8)


def test_an_outcome_is_paired_with_the_script_s_replies_recorded_in_a_run(tmp_path):
    """``calibrate --script``: each outcome beside the RAG script's right answers over the same answerable questions,
    with the questions only one of them gets right; the script's replies read from a run's record."""
    import json

    from longmem.eval.calibrate import outcomes, script_right

    passage = "The harbour lay still that morning. A grey zeppelin drifted over the harbour at dawn. Gulls cried."
    rows = [{"id": f"b.txt:{q}", "question": q, "golds": g, "draft": d, "passages": [passage], "answer": d,
             "least": 0.0} for q, g, d in [(QUESTION, ("zeppelin",), "A grey zeppelin."),
                                         ("What flew at dusk?", ("gulls",), "A heron."),
                                         ("Who owned it?", (), "Nobody.")]]
    unit = {"key": "natural-dev/b.txt", "value": {"scores": {"rag_script": [
        {"id": rows[0]["id"], "answerable": True, "contains": 0.0},
        {"id": rows[1]["id"], "answerable": True, "contains": 1.0},
        {"id": rows[2]["id"], "answerable": False, "contains": 0.0}]}}}
    (tmp_path / "natural.tasks.jsonl").write_text(json.dumps({**unit, "value": {"scores": {}}}) + "\n"
                                                  + json.dumps(unit) + "\n")  # the last record of a unit wins
    script = script_right(tmp_path)
    assert script == {rows[0]["id"]: False, rows[1]["id"]: True}
    o = outcomes(rows, 0.0, script=script)
    assert (o["right"], o["script_right"], o["only_app"], o["only_script"]) == (1, 1, 1, 1)
    assert "script_right" not in outcomes(rows, 0.0)
    (tmp_path / "natural.tasks.jsonl").write_text(json.dumps({**unit, "value": {"scores": {}}}) + "\n")
    with pytest.raises(ValueError, match="rag_script"):
        script_right(tmp_path)

def test_each_check_is_counted_by_the_right_drafts_it_kills_and_the_wrong_ones_it_stops():
    from longmem.eval.calibrate import check_costs

    passage = "The harbour lay still that morning. A grey zeppelin drifted over the harbour at dawn. Gulls cried."
    rows = [  # right and sure; right but unsure; wrong (invented words); an unanswerable one answered, the reader
        #       sure the book does not say
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A grey zeppelin.", "decline": 0.1,
         "probs": [0.9] * 4},
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A grey zeppelin.", "decline": 0.1,
         "probs": [0.9, 0.05, 0.9, 0.9]},
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A purple balloon from Paris.", "decline": 0.2,
         "probs": [0.5] * 4},
        {"question": "Who owned the zeppelin?", "golds": (), "draft": "The harbour owned it at dawn.",
         "decline": 0.95, "probs": [0.5] * 4},
    ]
    rows = [r | {"passages": [passage], "declines_at": 1.0} for r in rows]
    costs = {c["check"]: c for c in check_costs(rows, 0.5, 0.7, 0.1)}
    assert (costs["words"]["alone_kills_right"], costs["words"]["alone_stops_wrong"]) == (0, 1)  # the balloon
    assert (costs["decline"]["alone_kills_right"], costs["decline"]["alone_stops_wrong"]) == (0, 1)  # the owner
    assert (costs["sure"]["alone_kills_right"], costs["sure"]["alone_stops_wrong"]) == (1, 0)  # the unsure one
    assert costs["sure"]["within_kills_right"] == 1 and costs["decline"]["within_stops_wrong"] == 1
    with pytest.raises(ValueError, match="never declined"):
        check_costs([r | {"declines_at": 0.7} for r in rows], 0.5, 0.7, 0.1)
    assert "confirm" not in costs  # not asked of the reader: not a check here


def test_the_reader_s_confirmation_is_calibrated_and_counted_on_a_run_that_asked_it():
    """``Reading.confirm`` read off the record: a draft the reader confirmed below the threshold is not shown."""
    from longmem.eval.calibrate import check_costs, outcomes

    passage = "The harbour lay still that morning. A grey zeppelin drifted over the harbour at dawn. Gulls cried."
    rows = [  # right, confirmed; right, barely confirmed; an unanswerable one answered, unconfirmed
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A grey zeppelin.", "confirm": 0.95},
        {"question": QUESTION, "golds": ("zeppelin",), "draft": "A grey zeppelin.", "confirm": 0.7},
        {"question": "Who owned the zeppelin?", "golds": (), "draft": "The harbour owned it.", "confirm": 0.4},
    ]
    rows = [r | {"passages": [passage], "declines_at": 1.0, "decline": 0.1, "probs": [0.9] * 4, "answer": "",
                 "least": 0.0} for r in rows]
    at = {c: outcomes(rows, 0.0, confirm=c) for c in (None, 0.5, 0.8)}
    assert [(o["right"], o["declined"], o["not_said"], o["invented"]) for o in at.values()] == [
        (2, 0, 0, 1), (2, 0, 1, 0), (1, 1, 1, 0)]
    costs = {c["check"]: c for c in check_costs(rows, 0.0, 1.0, 0.0, confirm=0.8)}
    assert (costs["confirm"]["alone_kills_right"], costs["confirm"]["alone_stops_wrong"]) == (1, 1)
    with pytest.raises(ValueError, match="asked its reader"):
        outcomes([{k: v for k, v in r.items() if k != "confirm"} for r in rows], 0.0, confirm=0.5)


def test_the_answer_benchmark_times_a_readers_prefill_and_decoding(qwen_gguf):
    from longmem.bench.bank import DECODE_TOKENS, _reader_rates, answer_rows, answer_targets

    reader = readers.load_reader(qwen_gguf, torch.float32, "cpu", 256)
    ids = torch.randint(3, 200, (1, 40))
    with torch.inference_mode():
        rates = _reader_rates(reader, [ids, ids[:, :20]])
    assert rates["prefill_tokens"] == 60 and rates["prefill_tok_s"] > 0 and rates["decoded"] <= DECODE_TOKENS
    answer = {"reader": "tiny-qwen", "tokens": 1000, "first_token_s": 11.0, "reader_rss_vs_weights": 1.1,
              "reader_weights_mb": 10.0, "load_memory_s": 0.5, "prompt_tokens": 40, "first_token_max_s": 12.0,
              "memory_find_s": 0.2, "questions": [{}, {}], "cold": {"first_token_s": 13.0, "shown_s": 2.0},
              "shown_s": 0.3, "finder": "BM25 windows of the raw text", **rates}
    targets = answer_targets(answer)
    assert set(targets) == {"reader_first_token_s", "reader_shown_s", "reader_decode_tok_s", "reader_rss_vs_weights"}
    assert not targets["reader_first_token_s"]["met"] and targets["reader_rss_vs_weights"]["met"]  # 11 > 10 s; 1.1
    assert targets["reader_shown_s"]["met"]  # 0.3 <= 1 s

    def goal(key):
        return str(targets[key]["target"]), "yes" if targets[key]["met"] else "**no**"
    cells = [row[0] for row in answer_rows(answer, goal)]
    assert any("tiny-qwen reading, memory off" in c for c in cells) and any("decoding" in c for c in cells)
    assert any("BM25 windows of the raw text" in c for c in cells) and any("passages read shown" in c for c in cells)


def test_the_chat_tab_names_who_answered_and_whether_memory_was_read():
    from app.chat_tab import answered_by, citations_message

    assert answered_by("qwen2.5-coder-1.5b", memory=False) == " · answered by qwen2.5-coder-1.5b, memory not read"
    assert answered_by(DEFAULT_NAME) == f" · answered by {DEFAULT_NAME}, with the bank's memory"
    assert answered_by(None) == ""  # a turn stored before readers could be chosen
    title = citations_message([], said=False, reader="tiny-qwen", memory=False)["metadata"]["title"]
    assert title == "The closest passages the book has: 0 · answered by tiny-qwen, memory not read"
    pending = citations_message([], reader="tiny-qwen", reading=True)["metadata"]  # shown while the reader reads
    assert pending == {"title": "tiny-qwen is reading 0 passages found in the book…", "status": "pending"}


def test_a_reader_that_can_tell_is_asked_to_say_when_the_excerpts_do_not_answer():
    from longmem.tasks.reading import INSTRUCTION, PROMPTS, Reading, reading_prompt

    assert Reading().prompt == "book" and PROMPTS["book"] == INSTRUCTION  # the 135M's prompt stays as measured
    assert PROMPTS["book-or-not"].startswith(INSTRUCTION) and "The book does not say." in PROMPTS["book-or-not"]
    with pytest.raises(ValueError, match="prompt must be one of"):
        Reading(prompt="be brief")
    assert reading_prompt(QUESTION, []) == QUESTION  # nothing found: the question alone, whatever the prompt


def test_a_reader_of_long_spans_may_be_told_after_the_question_too():
    from longmem.storage.passages import Passage
    from longmem.tasks.reading import AFTER, DECLINE, INSTRUCTION, Found, Reading, prompt_for, reading_prompt

    p = Passage(id=1, document_id=1, document="d", chapter=None, char_start=0, char_end=4, document_chars=10,
                text="Fog.")
    after = prompt_for(QUESTION, [Found(p, 1.0)], Reading(prompt="book-or-not-after"))
    assert after.startswith(INSTRUCTION) and after.endswith(f"Question: {QUESTION}\n{AFTER['book-or-not-after']}")
    assert DECLINE in AFTER["book-or-not-after"] and Reading(prompt="book-or-not-after", decline=0.7).declines
    assert prompt_for(QUESTION, [Found(p, 1.0)], Reading()) == reading_prompt(QUESTION, [Found(p, 1.0)])
    assert prompt_for(QUESTION, [], Reading(prompt="book-or-not-after")) == QUESTION


def test_another_reader_reads_as_it_was_tuned_but_for_what_the_asker_turns_off(monkeypatch):
    from longmem.tasks import setup
    from longmem.tasks.reading import Reading
    from longmem.tasks.setup import ReaderProfile, reading_for

    monkeypatch.setitem(setup.READER_PROFILES, "r", ReaderProfile(reading={"prompt": "book-or-not", "abstain": 0.7}))
    tuned = reading_for("r", Reading(passages=3))
    assert (tuned.prompt, tuned.abstain, tuned.passages) == ("book-or-not", 0.7, 3)
    off = reading_for("r", Reading(abstain=0.0), {"abstain"})  # the check turned off stays off
    assert (off.prompt, off.abstain) == ("book-or-not", 0.0)
    assert reading_for("other", Reading()) == reading_for("other", Reading(passages=3))  # no profile: the script's
    assert reading_for("other", Reading()).finder == "windows"


def test_every_tuned_setting_of_a_reader_is_a_field_the_reading_and_the_eval_both_have():
    """The eval sets a reader's own settings on its ``ReadingSize`` by name (``entrants_for``), the chat on its
    ``Reading``: a setting either lacks would be dropped or invented silently."""
    from dataclasses import fields

    from longmem.eval.answering import ReadingSize
    from longmem.tasks.reading import Reading
    from longmem.tasks.setup import READER_PROFILES

    names = {f.name for f in fields(Reading)} & {f.name for f in fields(ReadingSize)}
    assert READER_PROFILES and all(set(p.reading) <= names for p in READER_PROFILES.values())
    Reading(**READER_PROFILES["qwen2.5-coder-1.5b"].reading)  # each profile is a valid reading


def test_one_set_up_gives_a_reader_its_own_window_and_the_bank_s_model_its_memory(qwen_gguf, monkeypatch):
    """``tasks.setup.reading_setup``: the bank's own model reads as it is (its window, its memory, the reading asked
    for); another reader is loaded with its profile's window (within its native context) and settings, but for the
    fields the asker chose."""
    from longmem.tasks import setup
    from longmem.tasks.reading import Reading
    from longmem.tasks.setup import ReaderProfile, reading_setup

    model = chat_model(segment_len=128)
    own = reading_setup(model, model.config.backbone, Reading(passages=3))
    assert own.own and own.lm is model and own.reading == Reading(passages=3)
    plain = reading_setup(model, qwen_gguf, Reading(passages=3))  # no profile: the RAG script's reading, in a window
    assert not plain.own and plain.lm.segment_len == 2048  # of its own, within the reader's context (2,048 here)
    assert plain.reading == replace(Reading(), **setup.SCRIPT_READING.reading) and plain.label == "tiny-qwen"
    monkeypatch.setitem(setup.READER_PROFILES, qwen_gguf, ReaderProfile(window=512, reading={
        "spans": True, "budget": 300, "abstain": 0.7}))
    tuned = reading_setup(model, qwen_gguf, Reading(abstain=0.0), told={"abstain"})
    assert tuned.lm.segment_len == 512 and tuned.reading.spans and tuned.reading.budget == 300
    assert tuned.reading.abstain == 0.0  # the asker turned the check off
    monkeypatch.setitem(setup.READER_PROFILES, qwen_gguf, ReaderProfile(window=10**6))
    assert reading_setup(model, qwen_gguf).lm.segment_len == 2048  # bounded by the reader's own context
    assert setup.load(qwen_gguf, model, 300).segment_len == 300  # a window told (the eval's ``window``)


def test_the_workspace_reads_with_the_readers_tuned_settings(tmp_path, qwen_gguf, monkeypatch):
    from longmem.service import sessions
    from longmem.tasks import setup
    from longmem.tasks.setup import ReaderProfile

    monkeypatch.setitem(setup.READER_PROFILES, qwen_gguf, ReaderProfile(reading={"prompt": "book-or-not",
                                                                                 "abstain": 0.7}))
    seen = []
    real = sessions.answer
    monkeypatch.setattr(sessions, "answer", lambda chat, finder, q, reading, *a, **k:
                        seen.append(reading) or real(chat, finder, q, reading, *a, **k))
    ws = Workspace(chat_model(segment_len=512), BankDirectory(tmp_path / "banks"))
    try:
        book = tmp_path / "story.txt"
        book.write_text(story())
        assert ws.jobs.wait(ws.ingest("b", [book], create=True), timeout=JOB_TIMEOUT).status == "done"
        for settings in (Settings(max_new_tokens=4, reader=qwen_gguf), Settings(max_new_tokens=4, abstain=False,
                                                                                 reader=qwen_gguf),
                         Settings(max_new_tokens=4, reader="default")):
            "".join(ws.chat("b", QUESTION, settings))
    finally:
        ws.close()
    assert [(r.prompt, r.abstain) for r in seen] == [("book-or-not", 0.7), ("book-or-not", 0.0), ("book", 0.5)]
