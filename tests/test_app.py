"""The web app driven over HTTP through ``gradio_client``, as a second program would: the server runs in this process
on a tiny llama (real banks directory, SQLite, faiss, jobs), and every call goes through Gradio's queue and API."""

from __future__ import annotations

import time

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")

from docfiles import bomb_epub, extraction_children, slow_pdf  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402
from tiny import chat_model  # noqa: E402

from app.chat_tab import RETRIEVED_TITLE  # noqa: E402
from app.main import build_parser, launch  # noqa: E402
from longmem.service import Settings, Workspace  # noqa: E402
from longmem.storage import BankDirectory  # noqa: E402

pytestmark = pytest.mark.heavy  # a running app, end to end

BOOK = "".join(f"Chapter {i}. The keeper of the lighthouse counted {i * 7} gulls at dawn.\n" for i in range(30))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("app")
    # bfloat16 on any CPU (native or emulated): the app's paths run in the dtype a BF16 machine picks by itself
    ws = Workspace(chat_model(segment_len=384, dtype=torch.bfloat16), BankDirectory(root / "banks"),
                   work_dir=root / "work", max_upload_bytes=2**20, dtype="bfloat16")
    port = _free_port()
    demo = launch(ws, build_parser().parse_args(["--no-browser", "--port", str(port)]), block=False)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    yield ws, client, root
    demo.close()
    ws.close()


def text_of(message: dict) -> str:
    """A chat message's text (Gradio sends content as a list of typed parts)."""
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def wait_for_document(client: Client, bank: str, timeout: float = 120) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = client.predict(bank, api_name="/documents")["data"]
        if rows and all(r[3] == "complete" for r in rows):
            return rows
        time.sleep(0.2)
    raise TimeoutError(f"bank {bank} did not finish ingesting")


@pytest.fixture(scope="module")
def book_bank(server):
    ws, client, root = server
    book = root / "lighthouse.txt"
    book.write_text(BOOK)
    started = client.predict("lighthouse", [handle_file(str(book))], "Review: {text} Sentiment: {label}", "text",
                             "label", "", "", api_name="/ingest")
    assert "Started" in started[0]
    [row] = wait_for_document(client, "lighthouse")
    assert row[1] == "lighthouse" and row[4] == len(BOOK)
    return "lighthouse"


def test_create_rename_delete_a_bank(server):
    ws, client, _ = server
    table = client.predict("scratch", api_name="/create_bank")[0]
    assert "scratch" in [r[0] for r in table["data"]]
    client.predict("scratch", "scratch2", api_name="/rename_bank")
    assert "scratch2" in ws.directory.names() and "scratch" not in ws.directory.names()
    with pytest.raises(AppError, match="tick the box"):
        client.predict("scratch2", False, api_name="/delete_bank")
    assert "scratch2" in ws.directory.names()
    client.predict("scratch2", True, api_name="/delete_bank")
    assert "scratch2" not in ws.directory.names()


def test_ingestion_shows_progress_and_bank_is_listed(server, book_bank):
    ws, client, _ = server
    [job] = [j for j in ws.jobs.list() if j.bank == book_bank]
    assert job.status == "done" and job.tokens_done == len(BOOK)
    html = client.predict(api_name="/jobs")[0]
    assert "lighthouse" in html and "done" in html


def test_chat_streams_and_shows_what_it_read_and_what_memory_retrieved(server, book_bank):
    ws, client, _ = server
    job = client.submit(book_bank, "How many gulls did the keeper count?", [], 0.0, 16, 8, 2, "lexical", 3, True,
                        False, api_name="/chat")  # every answer shown (a random model's would say the book does not)
    final = job.result()
    outputs = job.outputs()
    assert len(outputs) >= 3  # the question, then the answer piece by piece
    chat = final[0]
    assert chat[0]["role"] == "user" and chat[1]["role"] == "assistant" and text_of(chat[1])
    retrieved = [m for m in chat if (m.get("metadata") or {}).get("title") == RETRIEVED_TITLE]
    assert retrieved and "lighthouse" in text_of(retrieved[0]) and "part " in text_of(retrieved[0])
    read = [m for m in chat if (m.get("metadata") or {}).get("title", "").startswith("Read from the book: ")]
    assert read and "<summary><b>[1]</b> lighthouse, " in text_of(read[0]) and "gulls" in text_of(read[0])
    assert "<mark>" in text_of(read[0])  # opening a citation shows the passage marked in its surrounding text
    history = client.predict(book_bank, api_name="/chat_history")  # what a reloaded page shows
    assert text_of(history[0]) == "How many gulls did the keeper count?"
    assert [text_of(m) for m in history] == [text_of(m) for m in chat]  # the retrieved chunks too, as shown
    client.predict(book_bank, api_name="/clear_chat")
    assert ws.chat_history(book_bank) == []


def test_a_dropped_book_loads_in_the_chat_tab_and_answers(server):
    ws, client, root = server
    book = root / "Gull Point.txt"
    book.write_text(BOOK)
    picker, panel, _ = client.predict(handle_file(str(book)), api_name="/add_book")
    bank = picker  # the Chat tab's bank picker now shows it (API callers get the value, not the page's update)
    assert bank == "gull-point" and bank in ws.directory.names()  # a bank of its own, named after the book
    assert "gull-point" in panel and ("Reading the book" in panel or "is ready" in panel)
    deadline = time.monotonic() + 120
    while "is ready" not in panel and time.monotonic() < deadline:  # the page polls while the book loads
        panel, _ = client.predict(bank, api_name="/loading")
        time.sleep(0.2)
    assert f"{len(BOOK):,} tokens in memory" in panel
    chat = client.predict(bank, "How many gulls did the keeper count?", [], 0.0, 8, 8, 2, "lexical", 2,
                          api_name="/chat")[0]  # checked: a random model's answer says the book does not say
    assert text_of(chat[1]).startswith("The book does not say.")
    closest = [m for m in chat if (m.get("metadata") or {}).get("title", "").startswith("The closest passages")]
    assert closest and "Gull Point" in text_of(closest[0])
    csv = root / "reviews.csv"
    csv.write_text("text,label\nfine,1\n")
    with pytest.raises(AppError, match="file type"):  # the drop box takes books only
        client.predict(handle_file(str(csv)), api_name="/add_book")


def test_continue_streams_from_the_end(server, book_bank):
    _, client, _ = server
    job = client.submit(book_bank, "", 0.0, 16, 8, 2, api_name="/continue")
    text, passages = job.result()
    assert text and len(job.outputs()) >= 2 and "part" in passages


def test_classifier_from_a_csv(server):
    ws, client, root = server
    csv = root / "reviews.csv"
    rows = [("good", "a fine warm film"), ("bad", "a dull cold film")] * 20
    csv.write_text("label,text\n" + "".join(f"{label},{text} {i}\n" for i, (label, text) in enumerate(rows)))
    preview, text_col, label_col = client.predict(handle_file(str(csv)), True, api_name="/preview")
    assert preview["headers"] == ["label", "text"] and len(preview["data"]) == 5
    assert text_col == "text" and label_col == "label"  # guessed from the header
    status = client.predict("reviews", "mood", handle_file(str(csv)), True, "text", "label",
                            "Review: {text} Sentiment: {label}", "", 2, 20, 10, 0, 2, "fused", True, True,
                            "in-context", api_name="/build_classifier")
    assert "job" in status[0]
    for _ in range(600):  # the demonstrations are ingested by a job; the classifier is saved when it is done
        if client.predict("reviews", api_name="/classifiers") == "mood":
            break
        time.sleep(0.2)
    assert ws.classifiers.names("reviews") == ["mood"]
    summary, per_label, confusion, curve, doubts = client.predict("reviews", "mood", True, api_name="/evaluate")
    assert "Accuracy" in summary and "10 held-out" in summary
    assert {r[0] for r in per_label["data"]} == {"good", "bad"}
    assert open(confusion, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and open(curve, "rb").read(4) == b"\x89PNG"
    pred, read = client.predict("reviews", "mood", "a fine warm film", api_name="/classify")
    assert pred["label"] in ("good", "bad") and len(pred["confidences"]) == 2
    assert "Read 2 examples found in the bank" in read and read.count("Sentiment:") == 2  # one of each label
    todo = root / "todo.txt"
    todo.write_text("a fine warm film\na dull cold film\n")
    out = client.predict("reviews", "mood", handle_file(str(todo)), "text", api_name="/classify_file")
    import csv as csvlib

    with open(out, newline="") as f:
        table = list(csvlib.DictReader(f))
    assert [r["text"] for r in table] == ["a fine warm film", "a dull cold film"]
    assert all(r["prediction"] in ("good", "bad") and r["read"].count("Sentiment:") == 2 for r in table)
    # the default method: a head fitted on the same examples, with its cross-validated figures and a confidence
    status = client.predict("reviews", "tone", handle_file(str(csv)), True, "text", "label",
                            "Review: {text} Sentiment: {label}", "", 2, 20, 10, 0, 2, "fused", False, False,
                            "head", api_name="/build_classifier")
    assert "head fitted" in status[0]
    for _ in range(600):
        if "tone" in ws.classifiers.names("reviews"):
            break
        time.sleep(0.2)
    wait_for_job(ws, "reviews")
    summary, per_label, confusion, curve, doubts = client.predict("reviews", "tone", True, api_name="/evaluate")
    assert "Cross-validated on its 20 examples" in summary and "sentence embeddings + logistic regression" in summary
    pred, said = client.predict("reviews", "tone", "a fine warm film", api_name="/classify")
    assert pred["label"] == "good" and said.startswith("Confidence")


def test_bad_inputs_are_rejected_with_a_message(server, book_bank):
    ws, client, root = server
    with pytest.raises(AppError, match="invalid bank name"):
        client.predict("../evil", api_name="/create_bank")
    binary = root / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(AppError, match="blob.txt"):
        client.predict("lighthouse", [handle_file(str(binary))], "", "text", "label", "", "", api_name="/ingest")
    with pytest.raises(AppError, match="no bank named"):
        client.predict("nowhere", "hello?", [], 0.0, 8, 8, 2, "fused", 4, api_name="/chat")
    with pytest.raises(AppError, match="empty"):
        client.predict(book_bank, "   ", [], 0.0, 8, 8, 2, "fused", 4, api_name="/chat")
    bad_csv = root / "bad.csv"
    bad_csv.write_text("label,text\npositive,fine\n\"unclosed,quote\n")
    with pytest.raises(AppError, match="bad.csv"):
        client.predict("reviews2", "x", handle_file(str(bad_csv)), True, "text", "label",
                       "Review: {text} Sentiment: {label}", "", 1, 1, 1, 0, 2, "none", False, False,
                       api_name="/build_classifier")
    big = root / "big.txt"
    big.write_text("word " * 300_000)  # over the fixture's 1 MiB upload limit
    with pytest.raises(AppError, match="limit"):
        client.predict("lighthouse", [handle_file(str(big))], "", "text", "label", "", "", api_name="/ingest")
    assert [d.title for d in ws.documents("lighthouse")] == ["lighthouse"]  # nothing stored was touched


def wait_for_job(ws, bank: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = ws.jobs.list(bank)
        if jobs and not jobs[0].active:
            return jobs[0]
        time.sleep(0.1)
    raise TimeoutError(f"the job of bank {bank} did not end")


def test_a_zip_bomb_fails_its_own_job_while_another_visitor_chats(server, book_bank):
    ws, client, root = server
    bomb = bomb_epub(root / "bomb.epub", 200 * 2**20)  # 200 MiB of XHTML in under the 1 MiB upload limit
    assert bomb.stat().st_size < 2**20
    chatter = Client(client.src, verbose=False)  # a second visitor
    chat = chatter.submit(book_bank, "How many gulls did the keeper count?", [], 0.0, 16, 8, 2, api_name="/chat")
    started = client.predict("bombs", [handle_file(str(bomb))], "", "text", "label", "", "", api_name="/ingest")
    assert "Started" in started[0]
    final = chat.result(timeout=300)  # the chat completes
    assert final[0][0]["role"] == "user" and final[0][1]["role"] == "assistant" and text_of(final[0][1])
    job = wait_for_job(ws, "bombs")
    assert job.status == "failed" and "bomb.epub" in job.message and "max_zip_ratio" in job.message
    html = client.predict(api_name="/jobs")[0]  # the page shows the error
    assert "failed" in html and "--max-zip-ratio" in html
    assert client.predict("bombs", api_name="/documents")["data"] == []  # nothing stored
    with ws.directory.open("bombs") as bank:
        assert bank.verify().ok
    assert "lighthouse" in [r[0] for r in client.predict("after-bomb", api_name="/create_bank")[0]["data"]]


def test_a_job_in_extraction_is_cancelled_from_the_page(server):
    ws, client, root = server
    slow = slow_pdf(root / "slow.pdf")  # ~30 s of pypdf work
    started = client.predict("slow", [handle_file(str(slow))], "", "text", "label", "", "", api_name="/ingest")
    job_id = started[2]
    deadline = time.monotonic() + 60
    while not extraction_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert extraction_children()
    t0 = time.perf_counter()
    client.predict(job_id, api_name="/cancel_job")
    job = wait_for_job(ws, "slow", timeout=30)
    assert job.status == "cancelled" and time.perf_counter() - t0 < 5
    assert extraction_children() == [] and ws.documents("slow") == []


def test_model_panel_and_a_mismatched_checkpoint(server, tmp_path):
    ws, client, _ = server
    info = client.predict(api_name="/model_info")
    assert "tiny-llama" in info and "untrained" in info
    assert "**Dtype**: bfloat16, as asked" in info
    other = chat_model(seed=1)
    other.save(tmp_path / "ckpt")
    backbone_dir = tmp_path / "backbone"
    ws.model.backbone.model.save_pretrained(backbone_dir)
    ws.model.backbone.tokenizer.save_pretrained(backbone_dir)
    with pytest.raises(AppError, match="was trained for backbone"):
        client.predict(str(backbone_dir), str(tmp_path / "ckpt"), "float32", api_name="/load_model")
    with pytest.raises(AppError, match="nor a Hugging Face model directory"):
        client.predict(str(tmp_path / "nothing"), "", "auto", api_name="/load_model")
    assert "tiny-llama" in client.predict(api_name="/model_info")  # the loaded model is unchanged


def test_launch_flags():
    from app.main import parse_auth

    args = build_parser().parse_args(["--host", "0.0.0.0", "--port", "9000", "--no-browser", "--auth", "me:s3:cret",
                                      "--max-upload-mb", "64"])
    assert (args.host, args.port, args.no_browser, args.max_upload_mb) == ("0.0.0.0", 9000, True, 64)
    assert parse_auth(args.auth) == ("me", "s3:cret") and parse_auth(None) is None
    for bad in ("nobody", ":pw", "me:"):
        with pytest.raises(SystemExit, match="user:password"):
            parse_auth(bad)
    defaults = build_parser().parse_args([])
    assert defaults.host == "127.0.0.1" and not defaults.no_browser  # local only, browser opened
    assert defaults.dtype == "auto" and build_parser().parse_args(["--dtype", "float32"]).dtype == "float32"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dtype", "int8"])


def test_settings_slider_starts_automatic_and_reaches_the_model_own_k(tmp_path):
    """The chunks slider starts at 0, automatic (the reading's K while passages are read, else the model's own, named
    however large: the shipped default reads 256 chunks), and reaches past the model's K; 0 becomes None."""
    import gradio as gr
    from tiny import tiny_model

    from app.chat_tab import make_settings, settings_panel

    ws = Workspace(tiny_model("llama", chunk_size=2, topk=1024), BankDirectory(tmp_path / "banks"),
                   work_dir=tmp_path / "work")
    try:
        with gr.Blocks():
            temperature, _, chunks, chunk_size = settings_panel(ws, Settings())
        assert temperature.value == 0  # greedy by default in the chat
        assert chunks.value == 0 and chunks.maximum >= 512 and chunk_size.value == 2
        assert "128 while passages are read, else the model's 512" in chunks.info
        assert make_settings(0.0, 16, 0, 2).chunks is None and make_settings(0.0, 16, 7, 2).chunks == 7
        with gr.Blocks():
            *_, finder, passages, stops, abstain = settings_panel(ws, Settings(), answers=True)
        assert abstain.value is True and make_settings(0.0, 16, 0, 2, abstain=False).reading_config().abstain == 0
        assert stops.value is True and "backbone" in stops.label  # answers end where the backbone would, or unticked
        assert make_settings(0.0, 16, 0, 2, finder.value, passages.value, stops.value).sampling().backbone_stops
        assert not make_settings(0.0, 16, 0, 2, "lexical", 4, False).sampling().backbone_stops
    finally:
        ws.close()
