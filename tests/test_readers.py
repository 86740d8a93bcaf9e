"""Readers: every supported file becomes a deterministic, resumable stream of UTF-8 text blocks."""

import hashlib
import itertools
import json
import logging
import os
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longmem.ingest import formats, readers
from longmem.ingest.readers import Block, DemoFormat, InputError, open_source

SENTIMENT = {"0": "negative", "1": "positive"}


def all_text(src, start=0) -> str:
    return "".join(b.text for b in src.blocks(start))


# -----------------------------------------------------------------------------
# plain text

def test_plain_text_streams_whole_file(tmp_path):
    text = "Line one.\nLine two — with a dash.\n\nCafé 日本語 🙂\n"
    p = tmp_path / "notes.txt"
    p.write_text(text, encoding="utf-8")
    src = open_source(p)
    assert (src.kind, src.name, src.title) == ("text", "notes.txt", "notes")
    assert src.size == len(text.encode()) == p.stat().st_size
    assert src.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert all_text(src) == text
    blocks = list(src.blocks())
    assert blocks[0].start == 0 and blocks[-1].end == src.size


def test_markdown_and_rst_are_plain_text(tmp_path):
    for name in ("README.md", "guide.MARKDOWN", "doc.rst"):
        p = tmp_path / name
        p.write_text("# Title\n\nSome *text*.\n")
        src = open_source(p)
        assert src.kind == "text" and all_text(src) == "# Title\n\nSome *text*.\n"


def test_latin1_file_warns_once_and_replaces(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(readers, "BLOCK_BYTES", 8)
    p = tmp_path / "old.txt"
    p.write_bytes("café au lait\nnaïve résumé\n".encode("latin-1"))
    src = open_source(p)
    with caplog.at_level(logging.WARNING, logger="longmem.ingest.readers"):
        text = all_text(src)
        text_again = all_text(src)
    assert text == text_again == "caf\ufffd au lait\nna\ufffdve r\ufffdsum\ufffd\n"
    warnings = [r for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert len(warnings) == 1 and "old.txt" in warnings[0].getMessage()


def test_bom_is_skipped_and_offsets_follow_it(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "BLOCK_BYTES", 8)
    p = tmp_path / "bom.txt"
    p.write_bytes(b"\xef\xbb\xbf" + "héllo\nworld\n".encode())
    src = open_source(p)
    assert src.size == p.stat().st_size - 3
    assert all_text(src) == "héllo\nworld\n"
    second = list(src.blocks())[1]
    assert second.start == len("héllo\n".encode()) and second.text == "world\n"


def test_bad_files_are_refused_with_clear_messages(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "bom-only.txt").write_bytes(b"\xef\xbb\xbf")
    (tmp_path / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + os.urandom(100))
    (tmp_path / "folder.txt").mkdir()
    cases = {"empty.txt": "the file is empty", "bom-only.txt": "the file is empty",
             "image.txt": "looks like a binary file", "folder.txt": "is a directory", "missing.txt": "no such file"}
    for name, message in cases.items():
        with pytest.raises(InputError, match=message) as e:
            open_source(tmp_path / name)
        assert name in str(e.value)


def test_unknown_extension_text_or_refused(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("2024-01-01 started\n2024-01-02 stopped\n")
    assert all_text(open_source(log)) == "2024-01-01 started\n2024-01-02 stopped\n"
    blob = tmp_path / "model.bin"
    blob.write_bytes(b"\x00\x01\x02" + os.urandom(1000))
    with pytest.raises(InputError, match=r"model\.bin.*unsupported file type '\.bin' \(supported: .*\.pdf"):
        open_source(blob)
    latin = tmp_path / "legacy.dat"
    latin.write_bytes("ÿ not utf-8 \xff".encode("latin-1"))
    with pytest.raises(InputError, match="unsupported file type '.dat'"):
        open_source(latin)


def test_demos_only_for_demo_files(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("hello\n")
    with pytest.raises(InputError, match="a.txt"):
        open_source(p, demos=DemoFormat())


# -----------------------------------------------------------------------------
# documents

HTML = """<!DOCTYPE html>
<html><head><title>  The   Page </title><style>body { color: red }</style>
<script>var secret = "do not index";</script></head>
<body><h1>Welcome</h1><p>First   paragraph,
spread over lines.</p><!-- hidden comment -->
<p>Second<br>with a break.</p><script>alert("nope")</script><div>Caf\u00e9 <b>bold</b> end</div></body></html>"""


def test_html_extracts_text_and_title(tmp_path):
    p = tmp_path / "page.html"
    p.write_bytes(HTML.encode("utf-8"))
    src = open_source(p)
    assert src.title == "The Page" and src.kind == "text"
    text = all_text(src)
    assert text == "Welcome\n\nFirst paragraph, spread over lines.\n\nSecond\nwith a break.\n\nCafé bold end"
    assert src.size == len(text.encode())


def test_html_encoding_detected_from_bytes(tmp_path):
    p = tmp_path / "old.htm"
    p.write_bytes('<html><head><meta charset="iso-8859-1"><title>Vieux</title></head><body><p>déjà vu</p>'
                  "</body></html>".encode("latin-1"))
    src = open_source(p)
    assert (src.title, all_text(src)) == ("Vieux", "déjà vu")


def test_html_without_text_is_refused(tmp_path):
    p = tmp_path / "blank.html"
    p.write_text("<html><head><title>T</title><script>x()</script></head><body>  <p> </p></body></html>")
    with pytest.raises(InputError, match=r"blank\.html.*no text"):
        open_source(p)


def test_extracted_files_over_the_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(formats.BY_SUFFIX, ".html", replace(formats.BY_SUFFIX[".html"], max_bytes=100))
    p = tmp_path / "big.html"
    p.write_text("<p>" + "word " * 100 + "</p>")
    with pytest.raises(InputError, match=r"big\.html.*larger than"):
        open_source(p)


def test_html_doctype_internal_subset_leaves_no_text(tmp_path):
    p = tmp_path / "dtd.html"
    p.write_text('<!DOCTYPE html [\n<!ENTITY xxe SYSTEM "file:///etc/passwd">\n]>\n<html><head><title>T</title>'
                 "</head><body><p>Kept &xxe; literal.</p></body></html>")
    src = open_source(p)
    assert (src.title, all_text(src)) == ("T", "Kept &xxe; literal.")


@pytest.mark.heavy
def test_a_long_html_document_reads_in_time_linear_in_its_size():
    """16 MiB of paragraphs in one document: the former tree-based extraction was quadratic here (minutes)."""
    from longmem.ingest.htmltext import html_paragraphs

    para = b"<p>" + b"All work and no play makes Jack a dull boy. " * 20 + b"</p>\n"
    n = 16 * 2**20 // len(para)
    out: list[str] = []
    t0 = time.perf_counter()
    html_paragraphs((para * 1000 for _ in range(n // 1000)), out.append)
    assert len(out) == n // 1000 * 1000 and time.perf_counter() - t0 < 60


HTML_PIECES = ["<p>", "</p>", "<div>", "</div>", "<br>", "<pre>", "</pre>", "<script>", "</script>", "<head>",
               "<title>", "</title>", "<!DOCTYPE html [<!ENTITY a 'x'>]>", "<!-- c -->", "&amp;", "&xxe;", " ", "\n",
               "\t", "word", "ünï", "日本", "\ue000", "\u200b", "<b>", "</b>", "<li>", "<"]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(HTML_PIECES), max_size=60), st.lists(st.integers(1, 40), min_size=1, max_size=20))
def test_html_text_does_not_depend_on_how_the_markup_is_chunked(pieces, cuts):
    from longmem.ingest.htmltext import html_paragraphs

    markup = "".join(pieces).encode()
    chunks, i = [], 0
    for n in cuts * (len(markup) // max(sum(cuts), 1) + 1):
        chunks.append(markup[i:i + n])
        i += n
    whole: list[str] = []
    parts: list[str] = []
    assert html_paragraphs([markup], whole.append, encoding="utf-8") == \
        html_paragraphs(chunks, parts.append, encoding="utf-8")
    assert whole == parts and not any("\ue000" in t or "]>" in t for t in whole)


def make_epub(path):
    from ebooklib import epub
    book = epub.EpubBook()
    book.set_identifier("test-book")
    book.set_title("A Tale of Two Chapters")
    book.set_language("en")
    one = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    one.content = "<h1>Chapter One</h1><p>It was the best of times.</p><script>var x;</script>"
    two = epub.EpubHtml(title="Two", file_name="two.xhtml", lang="en")
    two.content = "<h1>Chapter Two</h1><p>It was the worst of times.</p>"
    book.add_item(two)  # added out of order: the spine, not the manifest, gives the reading order
    book.add_item(one)
    book.toc = [one, two]
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", one, two]
    epub.write_epub(str(path), book)


def test_epub_chapters_in_reading_order(tmp_path):
    p = tmp_path / "book.epub"
    make_epub(p)
    src = open_source(p)
    assert src.title == "A Tale of Two Chapters" and src.meta == {"chapters": 2}
    assert all_text(src) == ("Chapter One\n\nIt was the best of times.\n\n"
                             "Chapter Two\n\nIt was the worst of times.")


def test_corrupt_epub_is_refused(tmp_path):
    p = tmp_path / "broken.epub"
    p.write_bytes(b"PK\x03\x04" + os.urandom(500))
    with pytest.raises(InputError, match=r"broken\.epub.*cannot read"):
        open_source(p)


def test_pdf_text_and_title(tmp_path):
    from fpdf import FPDF
    pdf = FPDF()
    pdf.set_title("Quarterly Report")
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 10, "Revenue went up.\nCosts went down.")
    pdf.add_page()
    pdf.cell(0, 10, "Page two says hello.")
    p = tmp_path / "report.pdf"
    pdf.output(str(p))
    src = open_source(p)
    assert src.title == "Quarterly Report" and src.meta == {"pages": 2}
    assert all_text(src) == "Revenue went up.\nCosts went down.\n\nPage two says hello."


def test_pdf_without_text_layer_is_refused(tmp_path):
    from fpdf import FPDF
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 100, 50, style="F")  # a "scan": drawing only, no text
    p = tmp_path / "scan.pdf"
    pdf.output(str(p))
    with pytest.raises(InputError, match=r"scan\.pdf.*has no text layer"):
        open_source(p)


def test_corrupt_pdf_is_refused(tmp_path):
    p = tmp_path / "garbage.pdf"
    p.write_bytes(os.urandom(4096))
    with pytest.raises(InputError, match=r"garbage\.pdf.*cannot read"):
        open_source(p)


# -----------------------------------------------------------------------------
# demonstrations

def test_csv_with_header(tmp_path):
    p = tmp_path / "reviews.csv"
    p.write_text('text,label\n"A gripping, moving film.",1\n  Dull and slow.  ,0\n\nLoved it,1\n')
    src = open_source(p, DemoFormat(label_words=SENTIMENT))
    assert src.kind == "demos" and src.title == "reviews"
    assert all_text(src) == ("Review: A gripping, moving film. Sentiment: positive\n\n"
                             "Review: Dull and slow. Sentiment: negative\n\n"
                             "Review: Loved it Sentiment: positive")
    assert src.meta == {"template": "Review: {text} Sentiment: {label}", "label_words": SENTIMENT,
                        "labels": ["0", "1"], "n_examples": 3, "label_counts": {"positive": 2, "negative": 1}}
    json.dumps(src.meta)  # must be JSON-serialisable


def test_csv_defaults_when_no_format_given(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("label,text\npos,good\nneg,bad\n")
    src = open_source(p)
    assert all_text(src) == "Review: good Sentiment: pos\n\nReview: bad Sentiment: neg"
    assert src.meta["labels"] == ["neg", "pos"] and src.meta["label_counts"] == {"pos": 1, "neg": 1}


def test_headerless_csv_movie_review_format(tmp_path):
    p = tmp_path / "mr.csv"
    p.write_text('0,"simplistic , silly and tedious ."\n1,"it\'s a ""charming"" and often affecting journey ."\n')
    fmt = DemoFormat(columns=["label", "text"], label_words=SENTIMENT, separator="\n")
    src = open_source(p, fmt)
    assert all_text(src) == ("Review: simplistic , silly and tedious . Sentiment: negative\n"
                             "Review: it's a \"charming\" and often affecting journey . Sentiment: positive")
    assert src.meta["n_examples"] == 2


def test_tsv_with_sentence_column(tmp_path):
    p = tmp_path / "sst2.tsv"
    p.write_text("sentence\tlabel\nhide new secretions from the parental units \t0\nthe greatest musicians \t1\n")
    fmt = DemoFormat(template="{text} => {label}", text_column="sentence", label_words=SENTIMENT)
    src = open_source(p, fmt)
    assert all_text(src) == ("hide new secretions from the parental units => negative\n\n"
                             "the greatest musicians => positive")


def test_jsonl_numbers_and_blank_lines(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "great", "label": 1}\n\n{"text": "awful", "label": 0, "id": 7}\n')
    src = open_source(p, DemoFormat(label_words=SENTIMENT))
    assert all_text(src) == "Review: great Sentiment: positive\n\nReview: awful Sentiment: negative"
    assert src.meta["label_counts"] == {"positive": 1, "negative": 1}


@pytest.mark.parametrize("name, content, fmt, message", [
    ("nolabel.csv", "text,stars\ngood,5\n", DemoFormat(), r"has no 'label' column \(columns: text, stars\)"),
    ("nolabel2.csv", "1,good\n", DemoFormat(columns=["stars", "text"]), r"has no 'label' column"),
    ("labels.csv", "text,label\nok,positive\nhm,maybe\nmeh,unsure\n", DemoFormat(labels=["negative", "positive"]),
     r"line 3: label 'maybe' is not one of: negative, positive \(2 of 3 rows"),
    ("words.csv", "text,label\nok,1\nhm,2\n", DemoFormat(label_words=SENTIMENT),
     r"line 3: label '2' is not one of: 0, 1"),
    ("ragged.csv", "text,label\ngood,1\nbad,0,extra\n", DemoFormat(), r"line 3: expected 2 fields, got 3"),
    ("emptytext.csv", "text,label\ngood,1\n  ,0\n", DemoFormat(), r"line 3: the text is empty"),
    ("headeronly.csv", "text,label\n", DemoFormat(), r"has no examples"),
    ("badjson.jsonl", '{"text": "a", "label": 1}\n{"text": "b", label: 0}\n', DemoFormat(), r"line 2: invalid JSON"),
    ("nokey.jsonl", '{"text": "a", "label": 1}\n{"review": "b", "label": 0}\n', DemoFormat(),
     r"line 2: has no 'text' key \(keys: review, label\)"),
    ("template.csv", "text,label\ngood,1\n", DemoFormat(template="Review: {text}"), r"\{text\} and \{label\}"),
    ("blank.jsonl", "\n  \n", DemoFormat(), r"has no examples"),
])
def test_bad_demonstration_files(tmp_path, name, content, fmt, message):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(InputError, match=message) as e:
        open_source(p, fmt)
    assert name in str(e.value)


# -----------------------------------------------------------------------------
# blocks: deterministic cuts and resume

def check_blocks(src, data: bytes, block: int) -> list[Block]:
    """Check the cutting rule block by block, and that resuming at any block reproduces the rest."""
    blocks = list(src.blocks())
    assert b"".join(b.text.encode() for b in blocks) == data
    for b, nxt in itertools.pairwise(blocks):
        assert nxt.start == b.end > b.start
        window = data[b.start:b.start + block]
        if b"\n" in window:
            assert data[b.end - 1:b.end] == b"\n" and b"\n" not in data[b.end:b.start + block]
        elif b" " in window:
            assert data[b.end - 1:b.end] == b" " and b" " not in data[b.end:b.start + block]
        data[b.start:b.end].decode("utf-8")  # no block splits a character
    assert blocks[-1].end == src.size == len(data)
    for i, b in enumerate(blocks):
        assert list(src.blocks(b.start)) == blocks[i:]
    return blocks


@pytest.mark.parametrize("block", [2, 5, 16, 64])
def test_blocks_cut_rules_and_resume(tmp_path, monkeypatch, block):
    monkeypatch.setattr(readers, "BLOCK_BYTES", block)
    text = ("short\nA longer line of words — with ünïcödé and 日本語 in it.\n\n"
            + "word " * 30 + "\n" + "x" * 50 + "\nend")
    p = tmp_path / "t.txt"
    p.write_text(text, encoding="utf-8")
    blocks = check_blocks(open_source(p), text.encode(), block)
    if block == 16:
        assert [b.text for b in blocks[:3]] == ["short\n", "A longer line ", "of words — "]


def test_blocks_without_newlines_or_spaces_keep_characters_whole(tmp_path, monkeypatch):
    text = "日本語のテキスト" * 20 + "ü🙂" * 15  # 3-, 2- and 4-byte characters, no separators
    p = tmp_path / "cjk.txt"
    p.write_text(text, encoding="utf-8")
    for block in (1, 2, 3, 7, 10, 64):
        monkeypatch.setattr(readers, "BLOCK_BYTES", block)
        blocks = check_blocks(open_source(p), text.encode(), block)
        assert all(b.text and "\ufffd" not in b.text for b in blocks)
        if block >= 4:
            assert all(b.end - b.start <= block for b in blocks)


def test_blocks_of_in_memory_sources_resume_too(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "BLOCK_BYTES", 24)
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"text": f"review number {i} — très bien", "label": i % 2}) + "\n"
                         for i in range(20)))
    src = open_source(p, DemoFormat(label_words=SENTIMENT))
    data = "\n\n".join(f"Review: review number {i} — très bien Sentiment: {SENTIMENT[str(i % 2)]}"
                       for i in range(20)).encode()
    check_blocks(src, data, 24)


def test_blocks_start_bounds(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("hello world\n")
    src = open_source(p)
    assert list(src.blocks(src.size)) == []
    for bad in (-1, src.size + 1):
        with pytest.raises(ValueError):
            src.blocks(bad)  # refused at the call, before iterating


def test_default_block_size_and_limits():
    assert readers.BLOCK_BYTES == 256 * 1024 and formats.MAX_EXTRACT_BYTES == 256 * 1024 * 1024


# -----------------------------------------------------------------------------
# a huge file streams with bounded memory

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc to measure memory")
@pytest.mark.heavy
def test_200mb_file_streams_with_bounded_memory(tmp_path):
    lines = [f"{i} the quick brown fox — jumps over the lazy dog; ünïcödé 日本語 {'x' * (i % 97)}\n"
             for i in range(6000)]
    chunk = "".join(lines).encode()[: 1 << 20]
    p = tmp_path / "huge.txt"
    with open(p, "wb") as f:
        f.writelines(chunk for _ in range(200))  # 1 MiB at a time
    size = p.stat().st_size
    try:  # reset the peak-RSS mark so that VmHWM measures only what follows
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        can_reset = True
    except OSError:
        can_reset = False
    base = _status_kb("VmRSS")
    peak = base
    t0 = time.perf_counter()
    src = open_source(p)
    seen = n = 0
    for b in src.blocks():
        assert b.start == seen
        seen = b.end
        n += 1
        if not can_reset and n % 16 == 0:
            peak = max(peak, _status_kb("VmRSS"))
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM") if can_reset else max(peak, _status_kb("VmRSS"))
    assert seen == src.size == size and n >= size // readers.BLOCK_BYTES
    assert (peak - base) / 1024 < 64, f"RSS grew by {(peak - base) / 1024:.0f} MB while streaming"
    assert seconds < 30
