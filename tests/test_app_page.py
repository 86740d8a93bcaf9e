"""The page's own logic, without a server: errors shown beside the work (``app.common.reported``) or raised for API
clients (``friendly``), uploads named by the user's file name, a citation's context as paragraphs, what a reload
restores, and the Classify tab's sample file."""

from __future__ import annotations

import csv
import os

import gradio as gr
import pytest
from gradio.utils import get_upload_folder
from tiny import chat_model

from app.chat_tab import citations_message, context_html, make_settings
from app.classify_tab import SAMPLE, SAMPLE_SPLIT, preset_choices
from app.common import Told, friendly, own_names, reported
from app.ui import RESTORE_TICKS, build_app, memo_secret
from longmem.service.workspace import Workspace
from longmem.storage import BankDirectory
from longmem.tasks.reading import Citation
from longmem.text.io import InputError


def is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def test_an_uploaded_file_is_named_as_the_user_named_it():
    tmp = os.path.join(get_upload_folder(), "3f9c2a7d0b1e", "My Book.txt")
    assert own_names(f"{tmp}: the file is empty") == "My Book.txt: the file is empty"
    assert own_names("/home/me/book.txt: the file is empty") == "/home/me/book.txt: the file is empty"


def test_a_failure_goes_to_the_notice_and_leaves_every_other_output_as_it_is():
    def refuse(path):
        raise InputError(f"{os.path.join(get_upload_folder(), 'ab12', 'empty.txt')}: the file is empty")

    notice, *rest = reported(refuse, 3)("x")
    assert notice["visible"] and "empty.txt: the file is empty" in notice["value"]
    assert get_upload_folder() not in notice["value"] and "notice-error" in notice["value"]
    assert len(rest) == 3 and all(is_skip(v) for v in rest)


def test_success_clears_the_notice_and_a_confirmation_is_said_there():
    notice, a, b = reported(lambda: (1, 2), 2)()
    assert notice["visible"] is False and (a, b) == (1, 2)
    notice, value = reported(lambda: Told("removed 'x' from shelf", [[1]]), 1)()
    assert "notice-info" in notice["value"] and "removed" in notice["value"] and value == [[1]]


def test_a_streamed_answer_that_fails_midway_keeps_what_was_shown():
    def stream():
        yield "first"
        raise ValueError("the bank went away")

    steps = list(reported(stream, 1)())
    assert steps[0][1] == "first" and steps[0][0]["visible"] is False
    assert "the bank went away" in steps[1][0]["value"] and is_skip(steps[1][1])


def test_api_callers_get_values_and_errors_raised():
    assert friendly(lambda: gr.update(value="shelf", choices=["shelf"]), 1)() == "shelf"
    assert friendly(lambda: Told("done", "a", gr.update(visible=False)), 2)() == ("a", {"__type__": "update",
                                                                                       "visible": False})
    def unknown():
        raise KeyError("no bank named 'x'")

    def stream():
        yield "first"
        raise ValueError("the bank went away")

    with pytest.raises(gr.Error, match="no bank named 'x'"):
        friendly(unknown, 1)()
    with pytest.raises(gr.Error, match="went away"):
        list(friendly(stream, 1)())


def citation(text: str, context: str, support=None, nearest=None) -> Citation:
    return Citation(number=1, document="A Book", place="A Book, Part One, chapter II, 10% through the book",
                    text=text, context=context, passage_id=1, finders=("lexical",), support=support, nearest=nearest)


def test_the_context_reads_as_paragraphs_with_the_passage_marked_in_each():
    text = "II\n\nThe keeper lit the\nlamp at dusk. He wrote the time."
    c = citation(text, "It was late.\nThe sea rose.\n\n" + text + "\n\nMorning came.",
                 support=(4, 36))  # "The keeper lit the\nlamp at dusk."
    out = context_html(c)
    assert out.count("<p>") == 4  # before, the heading, the passage's paragraph, after
    assert "<p>It was late. The sea rose.</p>" in out  # hard-wrapped lines joined
    assert "<p><mark>II</mark></p>" in out
    assert "<mark><b>The keeper lit the lamp at dusk.</b></mark><mark> He wrote the time.</mark>" in out
    assert "<p>Morning came.</p>" in out


def test_where_no_sentence_supports_the_answer_the_one_nearest_the_question_is_quoted_in_italics():
    text = "The keeper lit the lamp at dusk. He wrote the time in the log. Then he slept."
    near = (text.index("He"), text.index(" Then"))
    c = citation(text, text, nearest=near)
    assert "<i>He wrote the time in the log.</i>" in context_html(c) and "<b>" not in context_html(c)
    block = citations_message([c], said=False)["content"]
    assert "“He wrote the time in the log.”" in block  # quoted instead of the passage's opening
    supported = citation(text, text, support=(0, text.index(" He")), nearest=near)
    assert "<i>" not in context_html(supported) and "“The keeper lit the lamp at dusk.”" in citations_message(
        [supported])["content"]
    assert "“The keeper lit the lamp at dusk. He wrote" in citations_message([citation(text, text)])["content"]


def test_the_passage_the_answer_rests_on_is_named_in_the_block_and_marked():
    from dataclasses import replace

    text = "The keeper lit the lamp at dusk."
    a, b = citation(text, text, support=(0, len(text))), citation("Gulls cried.", "Gulls cried.")
    block = citations_message([replace(b, number=1), replace(a, number=2, rests=True)])
    assert block["metadata"]["title"].startswith("Read from the book: 2 passages, the answer rests on [2]")
    assert block["content"].count("(the answer rests on this)") == 1
    assert block["content"].index("(the answer rests on this)") > block["content"].index("[2]")
    assert "rests on" not in citations_message([a], said=False)["metadata"]["title"]  # not said: nothing rests


def test_a_passage_missing_from_its_context_is_shown_alone_and_escaped():
    out = context_html(citation("a < b & c", "unrelated text"))
    assert out == "<p>a &lt; b &amp; c</p>"


@pytest.fixture
def page(tmp_path):
    ws = Workspace(chat_model(), BankDirectory(tmp_path / "banks"), work_dir=tmp_path / "work")
    for name in ("gatsby", "lost-lady"):
        ws.create_bank(name)
    demo = build_app(ws)
    restore = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_load")
    yield ws, demo, lambda memo: restore(memo)[:-1]  # the last output: whether the memo was applied
    ws.close()


def test_a_reload_gives_back_the_chosen_banks_and_tab(page):
    ws, demo, restore = page
    *pickers, tabs = restore({"bank": "lost-lady", "classify": "gatsby", "tab": "banks"})
    values = [p.get("value") for p in pickers]
    assert values.count("lost-lady") == 2 and values.count("gatsby") == 1  # Chat and Continue, then Classify
    assert all(p["choices"] == ["gatsby", "lost-lady"] for p in pickers)
    assert tabs.selected == "banks"


def test_a_reload_forgets_a_bank_deleted_meanwhile_and_an_unknown_tab(page):
    ws, demo, restore = page
    ws.delete_bank("lost-lady")
    *pickers, tabs = restore({"bank": "lost-lady", "tab": "nowhere"})
    assert all("value" not in p and p["choices"] == ["gatsby"] for p in pickers)
    assert is_skip(tabs)
    *pickers, tabs = restore(None)  # a first visit
    assert all("value" not in p for p in pickers) and is_skip(tabs)


def test_a_memo_read_after_the_page_loaded_is_applied_once(page):
    """A page under load can mount the memo after its load event ran with the empty default; the memo's change
    event restores then, once, and later changes (a bank picked, a tab opened) restore nothing."""
    ws, demo, _ = page
    fns = {getattr(f.fn, "__name__", ""): f.fn for f in demo.fns.values()}
    on_load, on_memo = fns["on_load"], fns["on_memo"]
    assert on_load({})[-1] is False  # loaded before the memo was read: nothing applied yet
    memo = {"bank": "lost-lady", "tab": "classify"}
    *pickers, tabs, done = on_memo(memo, False)
    assert done is True and tabs.selected == "classify"
    assert [p.get("value") for p in pickers].count("lost-lady") == 2
    assert all(is_skip(out) for out in on_memo({**memo, "bank": "gatsby"}, True))
    assert all(is_skip(out) for out in on_memo({}, False))
    assert on_load(memo)[-1] is True


def test_a_reloaded_page_asks_again_until_its_memo_is_applied(page):
    """The backstop for a restore lost to the order of the load and memo events: a timer applies a memo neither
    applied, then stops; with nothing remembered (a first visit) it stops after RESTORE_TICKS ticks."""
    ws, demo, _ = page
    on_tick = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_tick")
    memo = {"bank": "lost-lady", "tab": "classify"}
    *pickers, tabs, done, n, timer = on_tick(memo, False, 0)  # missed by both events: applied now
    assert done is True and n == 1 and timer.active is False and tabs.selected == "classify"
    assert [p.get("value") for p in pickers].count("lost-lady") == 2
    *outs, n, timer = on_tick(memo, True, 3)  # applied before: nothing again, and stop
    assert all(is_skip(o) for o in outs) and timer.active is False
    *outs, n, timer = on_tick({}, False, 0)  # the memo not read yet (or a first visit): ask again
    assert all(is_skip(o) for o in outs) and n == 1 and is_skip(timer)
    *outs, n, timer = on_tick({}, False, RESTORE_TICKS - 1)
    assert all(is_skip(o) for o in outs) and timer.active is False


def test_the_open_tab_is_heard_from_the_tabs_not_from_each_tab(page):
    """Gradio fires the first tab's own select event as the page mounts; written into the memo, it came back after a
    reader's first click on another tab and threw the reader back (the browser test clicks so). The select event of
    the tabs, which the mount does not fire, writes the tab into the memo; no tab's own event writes the memo."""
    ws, demo, _ = page
    memo_writers = [f for f in demo.fns.values() if any(isinstance(o, gr.BrowserState) for o in f.outputs)]
    heard_from = {f.name: [demo.blocks[t] for t, _ in f.targets] for f in memo_writers}
    assert not any(isinstance(b, gr.Tab) for blocks in heard_from.values() for b in blocks)
    assert len(heard_from["remember_tab"]) == 1 and isinstance(heard_from["remember_tab"][0], gr.Tabs)
    remember = next(f.fn for f in memo_writers if f.name == "remember_tab")
    assert remember({"bank": "gatsby"}, gr.SelectData(None, {"index": 3, "value": "Memory banks", "id": "banks"})) \
        == {"bank": "gatsby", "tab": "banks"}
    assert is_skip(remember({}, gr.SelectData(None, {"index": 9, "value": "?", "id": "nowhere"})))


def test_the_page_memo_key_is_stable_for_a_banks_directory(tmp_path):
    one = Workspace(chat_model(), BankDirectory(tmp_path / "a"), work_dir=tmp_path / "w1")
    again = Workspace(chat_model(), BankDirectory(tmp_path / "a"), work_dir=tmp_path / "w2")
    other = Workspace(chat_model(), BankDirectory(tmp_path / "b"), work_dir=tmp_path / "w3")
    try:
        assert memo_secret(one) == memo_secret(again) != memo_secret(other)
    finally:
        for ws in (one, again, other):
            ws.close()


def test_the_sample_file_fills_the_sample_split_with_both_labels():
    with open(SAMPLE, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sum(SAMPLE_SPLIT.values()) == len(rows) == 400
    assert {r["label"] for r in rows} == {"positive", "negative"}
    assert len({r["text"] for r in rows}) == len(rows)  # no duplicates


def test_templates_are_offered_by_their_labels():
    names = dict((v, k) for k, v in preset_choices())
    assert names["SST-2"] == "positive, negative (SST-2)" and names["SST-5"].startswith("terrible, bad")


def test_the_chat_offers_a_library_s_books_and_hides_the_picker_for_one(page, tmp_path):
    from helpers import story

    from longmem.ingest.pipeline import ingest

    ws, demo, _ = page
    books = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "library_books")
    assert books(None)["visible"] is False and books("no-such-bank")["visible"] is False
    with ws.directory.open("gatsby") as bank:
        for n, title in enumerate(("The Silver Harbour", "The Iron Mill")):
            (tmp_path / f"{n}.txt").write_text(story(seed=n))
            ingest(bank, ws.model, tmp_path / f"{n}.txt", title=title)
            shown = books("gatsby")
            assert shown["visible"] is (n == 1) and shown["value"] == []
        ids = {d.title: d.id for d in bank.documents()}
    assert shown["choices"] == [(t, ids[t]) for t in ("The Silver Harbour", "The Iron Mill")]
    assert books("gatsby", [ids["The Iron Mill"], 999])["value"] == [ids["The Iron Mill"]]  # picks still there kept
    settings = make_settings(0.0, 16, 0, 2)
    settings.books = (ids["The Iron Mill"],)
    assert settings.reading_config().books == (ids["The Iron Mill"],)


def test_a_job_shows_bytes_while_it_reads_a_file_and_items_while_it_counts_them():
    from app.common import job_html
    from longmem.service.jobs import JobState

    reading = JobState("ingest-1", "ingest", "b", "book.txt", status="running", bytes_done=2**20, bytes_total=2**21,
                       file_tokens=1000, tokens_done=1000)
    assert "1,000 / ~2,000 tokens" in job_html(reading) and "1.00 / 2.00 MiB" in job_html(reading)
    fitting = JobState("ingest-1", "ingest", "b", "book.txt", status="running", bytes_done=300, bytes_total=4000,
                       unit="text features", step="mood: fitting its head on 2,000 examples")
    assert "300 / 4,000 text features" in job_html(fitting) and "MiB" not in job_html(fitting)
