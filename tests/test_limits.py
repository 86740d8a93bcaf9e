"""What one file may expand to: zip bombs, PDF stream bombs and over-long texts are refused while they are read,
with the limit named, in bounded time and memory, leaving the bank as it was; the extraction child's time and
memory caps; cancelling an extraction; the limits as command-line flags."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest
from docfiles import bomb_epub, bomb_pdf, chapter, extraction_children, slow_pdf, write_epub, write_pdf
from tiny import chat_model

from longmem.ingest.limits import MIB, ExtractLimits, LimitError
from longmem.ingest.pipeline import ingest
from longmem.ingest.readers import DemoFormat, check_source, open_source
from longmem.text.io import InputError

# a guard against a hung extraction, not a speed target: refusals take well under a second on an idle machine
REFUSAL_S = 15
CAP = ExtractLimits(max_extract_memory_mb=512)  # the child's memory cap in these tests


class Watch:
    """Runs ``fn`` while sampling this process's and its extraction children's resident memory every 10 ms."""

    def __init__(self, fn):
        me = psutil.Process()
        self.base_mb = me.memory_info().rss / MIB
        self.parent_mb = self.child_mb = 0.0
        done = threading.Event()

        def sample():
            while not done.is_set():
                self.parent_mb = max(self.parent_mb, me.memory_info().rss / MIB - self.base_mb)
                for c in extraction_children():
                    try:
                        self.child_mb = max(self.child_mb, c.memory_info().rss / MIB)
                    except psutil.Error:
                        pass
                time.sleep(0.01)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.perf_counter()
        try:
            self.result, self.error = fn(), None
        except Exception as e:  # kept for the test to look at
            self.result, self.error = None, e
        self.seconds = time.perf_counter() - t0
        done.set()
        t.join()


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """Extracted text goes to a directory of the test's own, so that what is left there can be seen."""
    d = tmp_path / "spool"
    d.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(d))
    return d


@pytest.fixture
def bank(bank_of):
    """A bank holding one small book, with a model to ingest through."""
    model = chat_model()
    text = "".join(f"Line {i}: the keeper of the lighthouse counted gulls.\n" for i in range(20))
    return bank_of(model, text, filename="book.txt"), model


def snapshot(bank) -> tuple:
    return [(d.id, d.title, d.status, d.n_tokens) for d in bank.documents()], bank.stats()["tokens"]


def refused(bank, model, path: Path, limits: ExtractLimits, limit: str) -> Watch:
    """Ingest ``path`` and check that it is refused by ``limit`` quickly, and that the bank did not change."""
    before = snapshot(bank)
    w = Watch(lambda: ingest(bank, model, path, limits=limits))
    assert isinstance(w.error, LimitError), w.error
    assert w.error.limit == limit and path.name in str(w.error) and limit in str(w.error)
    assert w.seconds < REFUSAL_S
    assert snapshot(bank) == before and bank.verify().ok
    assert w.child_mb < limits.max_extract_memory_mb and w.parent_mb < 64
    return w


# -----------------------------------------------------------------------------
# the evidence the issue asks for

@pytest.mark.heavy
def test_zip_bomb_epub_is_refused_from_its_directory(bank, tmp_path, temp_dir):
    model = bank[1]
    bomb = bomb_epub(tmp_path / "bomb.epub", 192 * MIB)  # deflates ~270 times
    assert bomb.stat().st_size < MIB
    check_source(bomb)  # the upload check reads no member: the job finds the bomb
    w = refused(bank[0], model, bomb, CAP, "max_zip_ratio")
    assert "ch0.xhtml inflates" in str(w.error) and "--max-zip-ratio" in str(w.error)
    w = refused(bank[0], model, bomb, ExtractLimits(max_zip_ratio=2000, max_unzipped_bytes=64 * MIB,
                                                     max_extract_memory_mb=512), "max_unzipped_bytes")
    assert "inflate to 192 MiB" in str(w.error)
    assert list(temp_dir.iterdir()) == []


@pytest.mark.heavy
def test_zip_bomb_past_every_directory_check_is_stopped_by_its_text(bank, tmp_path, temp_dir):
    """With the directory checks set out of the way, the inflated text itself is counted as it is read."""
    bomb = bomb_epub(tmp_path / "bomb.epub", 192 * MIB)
    loose = ExtractLimits(max_zip_ratio=1e6, max_unzipped_bytes=2**40, max_chars=4_000_000, max_extract_memory_mb=512)
    w = refused(*bank, bomb, loose, "max_chars")
    assert w.child_mb < 256  # streamed: the child holds a paragraph, not the chapter
    assert list(temp_dir.iterdir()) == []


@pytest.mark.heavy
def test_pdf_stream_bomb_is_refused_by_pypdf_limit(bank, tmp_path, temp_dir):
    bomb = bomb_pdf(tmp_path / "bomb.pdf", 32 * MIB)
    assert bomb.stat().st_size < 100_000
    check_source(bomb)
    limits = ExtractLimits(max_pdf_stream_bytes=4 * MIB, max_extract_memory_mb=512)
    w = refused(*bank, bomb, limits, "max_pdf_stream_bytes")
    assert "--max-pdf-stream-mb" in str(w.error) and "page 1" in str(w.error)
    with open_source(bomb, limits=ExtractLimits(max_pdf_stream_bytes=64 * MIB)) as src:  # under the limit: read
        assert "hello" in "".join(b.text for b in src.blocks())
    assert list(temp_dir.iterdir()) == []


# -----------------------------------------------------------------------------
# each limit

def test_zip_member_count(tmp_path):
    many = write_epub(tmp_path / "many.epub", [chapter("<p>one</p>")],
                      extra={f"OEBPS/img/{i}.png": b"x" for i in range(60)})
    with pytest.raises(LimitError, match=r"many\.epub: it holds 66 files, past the limit of 50 members") as e:
        open_source(many, limits=ExtractLimits(max_zip_members=50))
    assert e.value.limit == "max_zip_members"
    with open_source(many, limits=ExtractLimits(max_zip_members=66)) as src:
        assert "".join(b.text for b in src.blocks()) == "one"


def test_a_zip_directory_that_lies_about_sizes_is_refused(tmp_path):
    """The directory says 1 KiB, the member inflates to 64 MiB: reading stops at the declared size and fails."""
    p = tmp_path / "liar.epub"
    bomb_epub(p, 64 * MIB)
    data = bytearray(p.read_bytes())
    pos = data.find(b"PK\x01\x02")  # the central directory: one 46-byte header and a name per member
    while pos >= 0:
        name_len = int.from_bytes(data[pos + 28:pos + 30], "little")
        if data[pos + 46:pos + 46 + name_len] == b"OEBPS/ch0.xhtml":
            data[pos + 24:pos + 28] = (1024).to_bytes(4, "little")  # its uncompressed size
        pos = data.find(b"PK\x01\x02", pos + 46)
    p.write_bytes(bytes(data))
    with zipfile.ZipFile(p) as z:
        assert z.getinfo("OEBPS/ch0.xhtml").file_size == 1024
    w = Watch(lambda: open_source(p, limits=CAP))
    assert isinstance(w.error, InputError) and "liar.epub: cannot read this EPUB" in str(w.error)
    assert w.seconds < REFUSAL_S and w.child_mb < 256


@pytest.mark.parametrize("kind", ["txt", "html", "epub", "pdf", "csv"])
def test_text_limit_for_every_kind(tmp_path, kind):
    words = [f"word{i}" for i in range(200)]
    p = tmp_path / f"long.{kind}"
    if kind == "txt":
        p.write_text(" ".join(words))
    elif kind == "html":
        p.write_text("<p>" + " ".join(words) + "</p>")
    elif kind == "epub":
        write_epub(p, [chapter("<p>" + " ".join(half) + "</p>") for half in (words[:100], words[100:])])
    elif kind == "pdf":
        write_pdf(p, [words[:100], words[100:]])
    else:
        p.write_text("text,label\n" + "".join(f"{w},1\n" for w in words))
    with pytest.raises(LimitError, match=rf"long\.{kind}: its text runs on, past the limit of 500 characters "
                                         r"\(max_chars, --max-chars\)"):
        open_source(p, limits=ExtractLimits(max_chars=500))
    with open_source(p, limits=ExtractLimits(max_chars=20_000)) as src:
        assert "word199" in "".join(b.text for b in src.blocks())


def test_plain_text_limit_counts_characters_not_bytes(tmp_path):
    p = tmp_path / "cjk.txt"
    p.write_text("日本語" * 100)  # 300 characters in 900 bytes
    with open_source(p, limits=ExtractLimits(max_chars=300)) as src:
        assert src.size == 900
    with pytest.raises(LimitError, match="299 characters"):
        check_source(p, limits=ExtractLimits(max_chars=299))


@pytest.mark.heavy
def test_time_cap_stops_the_child(tmp_path, temp_dir):
    slow = slow_pdf(tmp_path / "slow.pdf")
    w = Watch(lambda: open_source(slow, limits=ExtractLimits(max_extract_seconds=1)))
    assert isinstance(w.error, LimitError) and w.error.limit == "max_extract_seconds"
    assert "slow.pdf: reading its text took too long, past the limit of 1 s" in str(w.error)
    assert 1 <= w.seconds < 1 + REFUSAL_S
    assert psutil.Process().children() == [] and list(temp_dir.iterdir()) == []


@pytest.mark.heavy
def test_memory_cap_stops_the_child(tmp_path, temp_dir):
    slow = slow_pdf(tmp_path / "slow.pdf", per_page=3_000_000)  # one page's operations at once: hundreds of MiB
    w = Watch(lambda: open_source(slow, limits=ExtractLimits(max_extract_memory_mb=256)))
    assert isinstance(w.error, LimitError) and w.error.limit == "max_extract_memory_mb", w.error
    assert "past the limit of 256 MiB (max_extract_memory_mb, --max-extract-memory-mb)" in str(w.error)
    assert w.child_mb < 256 and w.parent_mb < 64
    assert psutil.Process().children() == [] and list(temp_dir.iterdir()) == []


@pytest.mark.heavy
def test_a_content_stream_past_pypdf_parsing_budget_is_refused_by_name(tmp_path, temp_dir):
    from pypdf import Configuration

    if "stream_parsing_work_maximum_count" not in {f.name for f in dataclasses.fields(Configuration)}:
        pytest.skip("this pypdf has no parsing budget per content stream (it came in pypdf 7)")
    slow = slow_pdf(tmp_path / "slow.pdf", shows=1_100_000, per_page=1_100_000)  # 2.2 M tokens on one page
    w = Watch(lambda: open_source(slow))
    assert type(w.error) is InputError, w.error
    assert "slow.pdf: page 1: a content stream too long to parse" in str(w.error) and "pypdf" in str(w.error)
    assert psutil.Process().children() == [] and list(temp_dir.iterdir()) == []


def test_a_child_that_cannot_even_start_is_an_input_error(tmp_path):
    p = tmp_path / "page.html"
    p.write_text("<p>hello</p>")
    with pytest.raises(InputError, match=r"page\.html: "):
        open_source(p, limits=ExtractLimits(max_extract_memory_mb=8))  # too little for the interpreter


@pytest.mark.heavy
def test_cancelling_ends_the_extraction_at_once(tmp_path, temp_dir):
    class Stop(Exception):
        pass

    t0 = time.monotonic()

    def check():
        if time.monotonic() - t0 > 0.5:
            raise Stop()

    slow = slow_pdf(tmp_path / "slow.pdf")
    w = Watch(lambda: open_source(slow, check=check))
    assert isinstance(w.error, Stop) and w.seconds < 3
    assert psutil.Process().children() == [] and list(temp_dir.iterdir()) == []


def test_extracted_text_lives_as_long_as_its_source(tmp_path, temp_dir):
    p = tmp_path / "d.csv"
    p.write_text("text,label\ngood,1\nbad,0\n")
    src = open_source(p, DemoFormat())
    [spool] = list(temp_dir.iterdir())
    assert src.text_path == spool and "".join(b.text for b in src.blocks()).startswith("Review: good")
    src.close()
    assert list(temp_dir.iterdir()) == []
    open_source(p, DemoFormat())  # dropped at once: removed when collected
    assert list(temp_dir.iterdir()) == []


# -----------------------------------------------------------------------------
# settings

def test_defaults_and_bad_values():
    d = ExtractLimits()
    assert (d.max_chars, d.max_unzipped_bytes, d.max_zip_members, d.max_zip_ratio, d.max_pdf_stream_bytes,
            d.max_extract_seconds, d.max_extract_memory_mb) == (256 * MIB, 1024 * MIB, 10_000, 100.0, 64 * MIB,
                                                                300.0, 2048)
    assert d.describe("max_unzipped_bytes") == "1,024 MiB (max_unzipped_bytes, --max-unzipped-mb)"
    for bad in ({"max_chars": 0}, {"max_zip_ratio": -1.0}):
        with pytest.raises(InputError, match="must be positive"):
            ExtractLimits(**bad)


FLAGS = ["--max-chars", "1000", "--max-unzipped-mb", "1.5", "--max-zip-members", "7", "--max-zip-ratio", "20",
         "--max-pdf-stream-mb", "2", "--max-extract-seconds", "9", "--max-extract-memory-mb", "300"]
GIVEN = ExtractLimits(max_chars=1000, max_unzipped_bytes=int(1.5 * MIB), max_zip_members=7, max_zip_ratio=20.0,
                      max_pdf_stream_bytes=2 * MIB, max_extract_seconds=9.0, max_extract_memory_mb=300)


def test_limits_are_flags_of_the_cli_and_the_app():
    from app.main import build_parser
    from longmem.cli.main import build_parser as cli_parser

    args = cli_parser().parse_args(["bank", "ingest", "b", "book.epub", *FLAGS])
    assert ExtractLimits.from_args(args) == GIVEN
    assert ExtractLimits.from_args(cli_parser().parse_args(["bank", "ingest", "b", "x.txt"])) == ExtractLimits()
    app_args = build_parser().parse_args(["--max-upload-mb", "64", *FLAGS])
    assert ExtractLimits.from_args(app_args) == GIVEN and app_args.max_upload_mb == 64
    assert ExtractLimits.from_args(build_parser().parse_args([])) == ExtractLimits()


def test_cli_refuses_a_file_past_a_flag(tmp_path, capsys):
    from longmem.cli.main import main

    p = tmp_path / "long.txt"
    p.write_text("word " * 100)
    code = main(["bank", "ingest", "b", str(p), "--create", "--max-chars", "100", "--banks-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "long.txt: its text runs on, past the limit of 100 characters" in err and "--max-chars" in err
    assert not (tmp_path / "b").exists()  # refused before the model loads or the bank is made
    assert os.listdir(tmp_path) == ["long.txt"]
