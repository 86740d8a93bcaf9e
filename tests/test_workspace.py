"""The app's library layer (``longmem.service.workspace``): banks, background ingestion, chat with passages,
continuation, on a tiny llama with a real banks directory, SQLite and faiss."""

from __future__ import annotations

import subprocess
import time

import pytest
import torch
from docfiles import bomb_epub, chapter, extraction_children, slow_pdf, write_epub
from tiny import chat_model

from longmem.ingest.limits import MIB
from longmem.memory.view import MemoryView
from longmem.service import Settings, Workspace
from longmem.service.jobs import Cancelled, JobManager
from longmem.storage import BankDirectory
from longmem.storage.records import BankBusy, BankMismatch, UnknownBank
from longmem.text.io import InputError
from longmem.text.passages import ELLIPSIS, reflow

JOB_TIMEOUT = 600  # seconds: a guard against a hung job, not a speed target (a loaded CI machine is slow)

FAST = Settings(max_new_tokens=6, temperature=0.0)


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def ws(tmp_path, request):
    """Every workspace test in both dtypes (bfloat16 runs on any CPU, emulated where it is not native)."""
    return Workspace(chat_model(dtype=request.param), BankDirectory(tmp_path / "banks"))


@pytest.fixture
def book(tmp_path):
    p = tmp_path / "book.txt"
    p.write_text("".join(f"Chapter {i}. The keeper of the lighthouse counted {i * 7} gulls at dawn.\n"
                         for i in range(40)))
    return p


def ingested(ws: Workspace, book, name="b") -> None:
    job = ws.ingest(name, [book], create=True)
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "done", state.message


def test_ingest_runs_as_a_job_with_progress(ws, book):
    job = ws.ingest("b", [book], create=True)
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "done" and "ingested" in state.message
    assert state.bytes_done == state.bytes_total > 0 and state.tokens_done == len(book.read_text())
    [summary] = ws.banks()
    assert summary.name == "b" and summary.documents == 1 and summary.tokens == state.tokens_done
    assert summary.matches_model and not summary.busy


def test_bad_uploads_are_refused_before_a_job_starts(ws, tmp_path):
    empty, binary, odd = tmp_path / "e.txt", tmp_path / "x.txt", tmp_path / "a.xyz"
    empty.write_text("")
    binary.write_bytes(bytes(range(256)) * 10)
    odd.write_text("hello")
    for bad, msg in ((empty, "empty|whitespace"), (binary, "binary|not text"), (odd, "unsupported")):
        with pytest.raises(InputError, match=msg):
            ws.ingest("b", [bad], create=True)
    odd.write_text("hello")
    with pytest.raises(UnknownBank):
        ws.ingest("nope", [odd.rename(tmp_path / "ok.txt")], create=False)
    assert ws.jobs.list() == []


def test_upload_size_limit(tmp_path, book):
    ws = Workspace(chat_model(), BankDirectory(tmp_path / "banks"), max_upload_bytes=100)
    with pytest.raises(InputError, match="limit"):
        ws.ingest("b", [book], create=True)


@pytest.mark.heavy
def test_cancel_stops_a_job_and_keeps_what_was_stored(ws, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("word " * 40000)
    job = ws.ingest("b", [big], create=True)
    while ws.jobs.get(job).tokens_done == 0:
        time.sleep(0.01)
    ws.jobs.cancel(job)
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "cancelled"
    [doc] = ws.documents("b")
    assert doc.status == "ingesting" and 0 < doc.n_tokens < 200000  # resumable: ingesting the file again finishes it
    ingested(ws, big)
    assert ws.documents("b")[0].status == "complete"


def test_jobs_run_in_order_and_report_failures():
    jobs = JobManager()
    seen = []

    def ok(ctx):
        seen.append(1)
        return "fine"

    def boom(ctx):
        raise ValueError("the file is bad")

    def cancelled(ctx):
        raise Cancelled()
    a, b, c = jobs.submit("t", "x", "a", ok), jobs.submit("t", "x", "b", boom), jobs.submit("t", "x", "c", cancelled)
    assert [jobs.wait(j, 10).status for j in (a, b, c)] == ["done", "failed", "cancelled"]
    assert jobs.get(b).message == "the file is bad" and seen == [1]
    assert not jobs.busy("x")


@pytest.mark.heavy
def test_a_chat_while_a_book_is_ingested_answers_as_it_does_alone(ws, book, tmp_path):
    """A chat (a request thread) beside an ingestion job (the job thread) on the one model: each answer is the one
    the idle app gives, and the model is whole afterwards."""
    def answer() -> str:
        text = "".join(ws.chat("b", "How many gulls?", FAST))  # the whole answer (an error is raised here)
        ws.clear_chat("b")  # each answer from the same state
        return text

    ingested(ws, book)
    alone = answer()
    big = tmp_path / "big.txt"
    big.write_text("Another keeper rowed to the rock and back. " * 1500)
    job = ws.ingest("other", [big], create=True)
    during = []
    while ws.jobs.get(job).active:
        during.append(answer())
    assert ws.jobs.wait(job, timeout=JOB_TIMEOUT).status == "done"
    assert alone and len(during) >= 2 and set(during) == {alone}
    assert len(ws.model.backbone.layers) == ws.model.backbone.spec.n_layers
    assert answer() == alone


def test_chat_streams_stores_turns_and_shows_what_memory_retrieved(ws, book):
    ingested(ws, book)
    reply = ws.chat("b", "How many gulls?", FAST)
    pieces = list(reply)
    assert len(pieces) >= 1 and reply.text == "".join(pieces)
    assert reply.retrieved and all(p.document == "book" and p.location.startswith("part ") for p in reply.retrieved)
    shown = reflow(book.read_text())  # a chunk and its context are reflowed, "…" where the context was cut
    assert all(p.text in p.context and p.context.strip(ELLIPSIS) in shown for p in reply.retrieved)
    history = ws.chat_history("b")
    assert [(t["role"], t["content"]) for t in history] == [("user", "How many gulls?"), ("assistant", reply.text)]
    assert history[0]["retrieved"] == [] and history[1]["retrieved"] == reply.retrieved  # stored with the answer


def test_a_dropped_book_gets_a_bank_of_its_own_loads_and_answers(book, tmp_path):
    ws = Workspace(chat_model(segment_len=512), BankDirectory(tmp_path / "banks"))  # a window with room for passages
    ingested(ws, book, name="the-lighthouse")  # a bank of that name exists already: the new one gets a number
    name, job = ws.add_book(book, title="The Lighthouse.txt")
    assert name == "the-lighthouse-2" and ws.loading(name).id == job
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "done" and ws.loading(name).status == "done"
    [doc] = ws.documents(name)
    assert doc.title == "The Lighthouse" and doc.n_tokens == len(book.read_text())
    reply = ws.chat(name, "How many gulls did the keeper count?", FAST)
    list(reply)
    words = " ".join(book.read_text().split())  # citations are reflowed: the book's words, in its order
    assert reply.citations and all(" ".join(c.text.split()) in words for c in reply.citations)  # it read the book
    assert any(c.nearest for c in reply.citations)  # a sentence with the question's words, to quote
    assert ws.chat_history(name)[-1]["citations"] == reply.citations  # stored and read back, spans as tuples
    ws.close()


def test_a_dropped_book_is_named_after_its_own_title_and_names_stay_unique(tmp_path, children):
    ws = Workspace(chat_model(), BankDirectory(tmp_path / "banks"))
    try:
        book = tmp_path / "pg65636.txt"
        book.write_text("The Project Gutenberg eBook of A Lost Lady, by Willa Cather\n\nTitle: A Lost Lady\n\n"
                        "Author: Willa Cather\n\n*** START OF THE PROJECT GUTENBERG EBOOK A LOST LADY ***\n\n"
                        "Thirty or forty years ago, in one of those grey towns along the Burlington railroad.\n")
        epub = write_epub(tmp_path / "pg64317.epub", [chapter("<p>In my younger and more vulnerable years.</p>")],
                          title="The Great Gatsby")
        loaded = [ws.add_book(book, title="pg65636.txt"), ws.add_book(book), ws.add_book(epub)]
        assert [name for name, _ in loaded] == ["a-lost-lady", "a-lost-lady-2", "the-great-gatsby"]
        for (name, job), title in zip(loaded, ["A Lost Lady", "A Lost Lady", "The Great Gatsby"]):
            assert ws.jobs.wait(job, timeout=JOB_TIMEOUT).status == "done"
            [doc] = ws.documents(name)
            assert (doc.title, doc.source) == (title, book.name if name.startswith("a-") else epub.name)
        assert len(children) == 2  # the EPUB's title was read in a child, its text in another (the job's)
    finally:
        ws.close()


def test_a_dropped_file_that_is_refused_leaves_no_bank(ws, tmp_path):
    binary, demos = tmp_path / "x.txt", tmp_path / "reviews.csv"
    binary.write_bytes(bytes(range(256)) * 10)
    demos.write_text("text,label\ngood,1\n")
    with pytest.raises(InputError, match="binary|not text"):
        ws.add_book(binary)
    with pytest.raises(InputError, match="classifier"):
        ws.add_book(demos)
    assert ws.banks() == [] and ws.jobs.list() == [] and ws.loading("x") is None


@pytest.mark.heavy
def test_chat_history_survives_a_new_workspace_and_moves_old_turns_into_memory(ws, book, tmp_path):
    ingested(ws, book)
    for q in ("first question about the keeper", "second one", "a third, longer question about the gulls"):
        list(ws.chat("b", q, FAST))
    again = Workspace(ws.model, ws.directory)
    assert [t["content"] for t in again.chat_history("b")][::2] == ["first question about the keeper", "second one",
                                                                     "a third, longer question about the gulls"]
    before = len(again.run_locked(lambda: again.loaded_memory("b")))
    list(again.chat("b", "and the gulls now?", FAST))  # found in the book: the model answers
    chat = again.sessions.session("b").chat
    assert chat.moved_turns > 0  # the 64-token window cannot hold them all: the oldest went into memory
    assert len(again.sessions.session("b").memory) > before
    again.clear_chat("b")
    assert again.chat_history("b") == []


def test_continue_from_the_end_and_from_a_passage(ws, book):
    ingested(ws, book)
    memory = ws.run_locked(lambda: ws.loaded_memory("b"))
    size = len(memory)
    reply = ws.continue_text("b", None, FAST)
    assert list(reply) and reply.retrieved
    long = ws.continue_text("b", "The keeper said " * 40, FAST)
    list(long)
    assert long.notes and "last" in long.notes[0]
    assert len(ws.run_locked(lambda: ws.loaded_memory("b"))) == size  # continuing never writes into the bank memory


def test_errors_reach_the_reader(ws, tmp_path):
    ws.create_bank("empty")
    with pytest.raises(InputError, match="empty"):
        list(ws.continue_text("empty", None, FAST))
    with pytest.raises(InputError):
        ws.chat("empty", "   ", FAST)
    with pytest.raises(UnknownBank):
        ws.chat("missing", "hi", FAST)
    with pytest.raises(ValueError, match="top-p"):
        list(ws.chat("empty", "hi", Settings(top_p=0)))


def test_a_bank_of_another_model_is_refused(ws, book, tmp_path):
    ingested(ws, book)
    other = Workspace(chat_model(seed=1), ws.directory)
    assert not other.banks()[0].matches_model
    with pytest.raises(BankMismatch):
        list(other.chat("b", "hi", FAST))


def test_finer_chunks_share_keys_and_values(ws, book):
    ingested(ws, book)
    coarse = ws.run_locked(lambda: ws.loaded_memory("b"))
    fine = coarse.rechunk(1)
    assert len(fine) == len(coarse) and fine.chunk_size == 1
    r0, r1 = coarse.rows[0], fine.rows[0]
    assert r1.k.data_ptr() == r0.k.data_ptr()  # a view, not a copy
    q = torch.randn(1, 6, 3, 8)
    view = MemoryView(fine, n_chunks=5)
    found = view.search(q, 2)
    assert found.chunk_ids.shape[-1] == 5 and sum(view.hits.values()) == 6 * 3 * 5
    with pytest.raises(ValueError, match="divide"):
        coarse.rechunk(3)


def test_busy_bank_cannot_be_deleted(ws, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("word " * 20000)
    job = ws.ingest("b", [big], create=True)
    with pytest.raises(BankBusy):
        ws.delete_bank("b")
    ws.jobs.cancel(job)
    ws.jobs.wait(job, 60)
    ws.delete_bank("b")
    assert ws.banks() == []


def test_close_removes_the_temporary_files_it_made(tmp_path):
    ws = Workspace(chat_model(), BankDirectory(tmp_path / "banks"))
    work = ws.scratch_dir()
    (work / "plot.png").write_bytes(b"x")
    ws.close()
    assert not work.exists()
    kept = Workspace(chat_model(), BankDirectory(tmp_path / "banks"), work_dir=tmp_path / "mine")
    kept.scratch_dir()
    kept.close()
    assert (tmp_path / "mine").is_dir()  # a directory the caller gave is the caller's


def test_the_model_panel_says_which_dtype_and_why(tmp_path, monkeypatch):
    ws = Workspace(chat_model(), BankDirectory(tmp_path / "banks"), work_dir=tmp_path / "work")
    try:
        info = ws.model_info()
        assert info["dtype"] == "float32"  # given as float32: "auto" may pick bf16 here, then it says so
        assert info["dtype_reason"] in ("float32, as the model was given",
                                        "float32, chosen automatically: the CPU has no native bfloat16 (no "
                                        "AVX512-BF16 or AMX), where float32 is faster")
        backbone_dir = tmp_path / "backbone"
        ws.model.backbone.model.save_pretrained(backbone_dir)
        ws.model.backbone.tokenizer.save_pretrained(backbone_dir)
        info = ws.load_model(str(backbone_dir), None, "bfloat16")
        assert (info["dtype"], info["dtype_reason"]) == ("bfloat16", "bfloat16, as asked") and ws.dtype == "bfloat16"
        monkeypatch.setenv("LONGMEM_DTYPE", "float32")
        info = ws.load_model(str(backbone_dir), None, "auto")
        assert (info["dtype"], info["dtype_reason"]) == ("float32", "float32, set by LONGMEM_DTYPE")
    finally:
        ws.close()


@pytest.fixture
def children(monkeypatch) -> list:
    """The command lines of the processes this test starts (a spy: they still start)."""
    started = []
    real = subprocess.Popen

    class Spy(real):
        def __init__(self, args, *a, **kw):
            started.append(args)
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    return started


@pytest.mark.heavy
def test_the_upload_check_reads_no_text_and_a_bomb_fails_only_its_job(ws, book, tmp_path, children):
    ingested(ws, book)
    before = [(d.id, d.n_tokens, d.status) for d in ws.documents("b")]
    bomb = bomb_epub(tmp_path / "bomb.epub", 128 * MIB)
    t0 = time.perf_counter()
    ws.check_upload(bomb)  # a zip with an OPF: what the request can see without inflating anything
    assert time.perf_counter() - t0 < 1 and children == []
    job = ws.ingest("b", [bomb])
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "failed" and "bomb.epub" in state.message and "max_zip_ratio" in state.message
    assert len(children) == 1  # one extraction, in the job
    assert [(d.id, d.n_tokens, d.status) for d in ws.documents("b")] == before
    with ws.directory.open("b") as bank:
        assert bank.verify().ok
    ingested(ws, book, "c")  # the job worker goes on with the next job


def test_a_document_is_extracted_once(ws, tmp_path, children):
    book = write_epub(tmp_path / "book.epub", [chapter("<p>It was the best of times.</p>"),
                                              chapter("<p>It was the worst of times.</p>")])
    ingested(ws, book)
    assert len(children) == 1 and "child_main" in children[0][2]
    [doc] = ws.documents("b")
    assert doc.meta["chapters"] == 2 and doc.title == "A Test Book"  # titled by its package, read with its text


def test_a_job_in_extraction_is_cancelled_at_once(ws, tmp_path):
    slow = slow_pdf(tmp_path / "slow.pdf")  # ~30 s of pypdf work
    job = ws.ingest("b", [slow], create=True)
    deadline = time.monotonic() + 60
    while not extraction_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    [child] = extraction_children()
    t0 = time.perf_counter()
    ws.jobs.cancel(job)
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "cancelled" and time.perf_counter() - t0 < 3
    assert not child.is_running() or child.status() == "zombie"
    assert ws.documents("b") == [] and not ws.jobs.busy("b")


@pytest.mark.heavy
def test_a_classifier_finds_its_demonstrations_in_its_bank(ws, tmp_path):
    from longmem.ingest.readers import DemoFormat

    reviews = tmp_path / "reviews.csv"
    rows = [("1", f"a fine warm film {i}") if i % 2 else ("0", f"a dull cold film {i}") for i in range(40)]
    reviews.write_text("label,text\n" + "".join(f"{label},{text}\n" for label, text in rows))
    fmt = DemoFormat(template="Review: {text} Sentiment: {label}", label_words={"0": "negative", "1": "positive"})
    job = ws.classifiers.build("r", "mood", reviews, fmt, 2, 30, 6, finder="lexical", balance=True, calibrate=True,
                               method="in-context")
    assert ws.jobs.wait(job, timeout=JOB_TIMEOUT).status == "done"
    [row] = ws.classifiers.classify("r", "mood", ["a fine warm film 99"])
    read = row["read"].split("\n")
    assert len(read) == 2 and {d.rsplit(" ", 1)[1] for d in read} == {"positive", "negative"}  # balanced
    assert all(d in {f"Review: {t} Sentiment: {'positive' if lab == '1' else 'negative'}" for lab, t in rows}
               for d in read)
    [fixed] = ws.classifiers.classify("r", "mood", ["a fine warm film 99"], settings={"finder": "none"})
    assert fixed["read"] == ""  # the saved fixed demonstrations, changed for this call only
    out = ws.classifiers.evaluate("r", "mood")
    assert [p.n_memory for p in out["curve"]] == [0, 30] and all(p.n_test == 6 for p in out["curve"])
    assert out["anchor_examples"] == 30 and out["anchor"].accuracy == 1.0  # the shipped embedder, words it can tell
    assert [p.n_memory for p in out["anchor_curve"]] == [30] and out["anchor_interval"][1] == pytest.approx(1.0)
    flat = ws.classifiers.evaluate("r", "mood", curve=False)  # the anchor at all 30 examples, no curve
    assert flat["anchor"].accuracy == 1.0 and flat["anchor_curve"] == [] and flat["curve_png"] is None
    assert open(out["curve_png"], "rb").read(4) == b"\x89PNG"
    with pytest.raises(ValueError, match="unknown classifier settings: colour"):
        ws.classifiers.classify("r", "mood", ["x"], settings={"colour": "red"})
    with pytest.raises(ValueError, match="finder must be one of"):
        ws.classifiers.build("r", "m2", reviews, fmt, 2, 30, 6, finder="magic")
    ws.close()


def test_a_classifier_head_is_fitted_with_its_bank_and_shows_how_good_it_is(ws, tmp_path):
    """The default method: the job that ingests the examples fits the head on them (cross-validated), stores it with
    the bank; classifying gives a confidence and an unsure mark; the evaluation shows the head's figures, its
    curve and the anchor on the same examples, and the examples whose label it doubts."""
    from longmem.ingest.readers import DemoFormat
    from longmem.tasks.head import Head

    reviews = tmp_path / "reviews.csv"
    rows = [("1", f"a fine warm film {i}") if i % 2 else ("0", f"a dull cold film {i}") for i in range(48)]
    rows[5] = ("0", rows[5][1])  # a warm film labelled negative: a label error to find
    reviews.write_text("label,text\n" + "".join(f"{label},{text}\n" for label, text in rows))
    fmt = DemoFormat(template="Review: {text} Sentiment: {label}", label_words={"0": "negative", "1": "positive"})
    job = ws.classifiers.build("r", "mood", reviews, fmt, 0, 40, 8)
    state = ws.jobs.wait(job, timeout=JOB_TIMEOUT)
    assert state.status == "done" and "head fitted on 40 examples: cross-validated accuracy" in state.message
    with ws.directory.open("r") as bank:
        stored = Head.from_bytes(bank.classifier_head("mood"))
    assert len(stored.keys) == 40 and stored.signature["features"] == ["embeddings", "state"]
    rows_out = ws.classifiers.classify("r", "mood", ["a fine warm film 99", "a dull cold film 98"])
    assert [r["prediction"] for r in rows_out] == ["positive", "negative"]  # the embedder tells these apart
    assert all(0.5 <= r["confidence"] <= 1 and isinstance(r["unsure"], bool) and r["error"] == "" and
               abs(r["prob_positive"] + r["prob_negative"] - 1) < 1e-9 for r in rows_out)
    out = ws.classifiers.evaluate("r", "mood")
    assert out["method"] == "head" and out["head"]["examples"] == 40 and out["head"]["cv_accuracy"] >= 0.9
    assert out["held_out"] == 8
    assert out["result"].accuracy == 1.0 and out["anchor"].accuracy == 1.0
    assert [p.n_memory for p in out["curve"]] == [40] and [p.n_memory for p in out["anchor_curve"]] == [40]
    warm = [d for d in out["suspects"] if d["text"] == rows[5][1]]
    assert warm and warm[0]["label"] == "negative" and warm[0]["predicted"] == "positive"
    assert open(out["curve_png"], "rb").read(4) == b"\x89PNG"
    job = ws.classifiers.build("r", "all-in", reviews, fmt, 0, 48, 0)  # nothing held out
    assert ws.jobs.wait(job, timeout=JOB_TIMEOUT).status == "done"
    cv = ws.classifiers.evaluate("r", "all-in")  # the head's cross-validated figures in the held-out part's place
    assert cv["held_out"] == 0 and len(cv["result"].truths) == 48 and cv["anchor"] is None and cv["curve"] == []
    assert cv["result"].accuracy == pytest.approx(cv["head"]["cv_accuracy"]) and cv["curve_png"] is None
    [paper] = ws.classifiers.classify("r", "mood", ["a fine warm film 99"], settings={"method": "in-context"})
    assert "score_positive" in paper and "prob_positive" not in paper  # the paper's way, for this call only
    with pytest.raises(ValueError, match="method must be one of"):
        ws.classifiers.classify("r", "mood", ["x"], settings={"method": "magic"})
    one = tmp_path / "one.csv"
    one.write_text("label,text\n" + "".join(f"1,text {i}\n" for i in range(20)))
    with pytest.raises(InputError, match="a classifier needs at least two labels"):
        ws.classifiers.build("r", "one", one, fmt, 0, 10, 5)
    many = tmp_path / "many.csv"
    many.write_text("label,text\n" + "".join(f"l{i},text {i}\n" for i in range(500)))
    with pytest.raises(InputError, match="500 distinct labels"):
        ws.classifiers.build("r", "many", many, DemoFormat(template=fmt.template), 0, 400, 50)
    with pytest.raises(InputError, match="kept for the bank's own demonstrations"):
        ws.classifiers.build("r", "bank demonstrations", reviews, fmt, 0, 40, 8)
    assert ws.classifiers.names("r") == ["all-in", "mood"]  # nothing refused was saved
    with ws.directory.open("r") as bank:  # classifiers saved before heads existed (no "method")
        saved = bank.classifiers()["mood"]
        del saved["spec"]["method"]
        bank.save_classifier("old", saved)
        bank.save_classifier("old-fixed", {**saved, "memory_examples": []})  # in-context only: no examples
    assert "prob_positive" in ws.classifiers.classify("r", "old", ["a fine warm film 99"])[0]  # gets a head
    assert "score_positive" in ws.classifiers.classify("r", "old-fixed", ["a fine warm film 99"])[0]  # stays
    ws.close()
