"""Property-based fuzzing of every reader (txt, md, html, epub, pdf, srt, csv, tsv, jsonl) with Hypothesis: mutated
bytes of small valid files, truncated files, wrong extensions, deep nesting, huge single lines, zero-width and
control characters, mixed encodings.

The property: reading a file returns its text or raises ``InputError``, never another exception, within its time
budget and without growing memory past its budget. Most examples run the readers in this process (what the
extraction child runs: ``check_source``, then ``formats.extract`` or the plain-text stream), where time and peak
memory are measured per example; a share runs through the child itself (``open_source``), where the caps hold by
construction and the property is the same. The default run takes about a minute; ``pytest -m slow`` runs 25 times
as many examples.
"""

from __future__ import annotations

import functools
import io
import tempfile
import time
import warnings
import zipfile
from pathlib import Path

import psutil
import pytest
from docfiles import chapter, package, pdf_bytes, text_stream, write_epub
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longmem.ingest.formats import extract
from longmem.ingest.limits import MIB, ExtractLimits
from longmem.ingest.readers import check_source, open_source
from longmem.text.io import InputError

LIMITS = ExtractLimits(max_extract_seconds=30, max_extract_memory_mb=512)
EXAMPLE_S = 20  # a reader's time budget per example (inputs are at most a few MiB; they take milliseconds)
EXAMPLE_MB = 256  # a reader's memory budget per example, over what the process held before it
SLOW = 25  # the slow run's multiple of the examples
ZERO_WIDTH_AND_CONTROL = ("\u200b\u200c\u200d\u2060\ufeff\u00ad\u202e\u2028\u2029\ue000\ue001\x85\x0b\x0c\x1c\x1f"
                          "\x7f\x00\x01\x1b\t\r\n ")
ENCODINGS = ("utf-8", "latin-1", "cp1252", "utf-16-le", "utf-16", "shift_jis", "koi8-r", "utf-32")
EXTS = ("txt", "md", "html", "epub", "pdf", "srt", "csv", "tsv", "jsonl")


@functools.cache
def valid() -> dict[str, bytes]:
    """Small valid files of every kind (two PDFs: ours and fpdf2's, with fonts, compression and metadata)."""
    from fpdf import FPDF

    epub = io.BytesIO()
    with tempfile.TemporaryDirectory() as d:
        p = write_epub(Path(d) / "b.epub", [chapter("<h1>One</h1><p>It was the best of times.</p>"),
                                            chapter("<p>It was the <b>worst</b> of times.<br/>Yes.</p>")])
        epub.write(p.read_bytes())
    pdf = FPDF()
    pdf.set_title("Report")
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 10, "Revenue went up.\nCosts went down.")
    return {
        "txt": "Line one.\nLine two, with ünïcödé and 日本語.\n".encode(),
        "md": b"# Title\n\nSome *text* and a [link](http://example.com).\n",
        "html": b"<!DOCTYPE html><html><head><title>T</title><script>x()</script></head><body><h1>Hi</h1>"
                b"<p>First <b>bold</b> para.</p><pre>a\n b</pre><ul><li>one</li></ul></body></html>",
        "epub": epub.getvalue(),
        "pdf": pdf_bytes([text_stream("Page one says hello."), text_stream("Page two (second).")], title="Two"),
        "fpdf": bytes(pdf.output()),
        "srt": b"1\n00:00:01,000 --> 00:00:02,500\n<i>Hello</i> there.\n\n2\n00:00:02,600 --> 00:00:04,000\nGeneral\n"
               b"Kenobi.\n",
        "csv": b'text,label\n"A gripping, moving film.",1\nDull and slow.,0\n',
        "tsv": b"text\tlabel\nhide new secretions\t0\nthe greatest musicians\t1\n",
        "jsonl": b'{"text": "great", "label": 1}\n{"text": "awful", "label": 0, "id": 7}\n',
    }


@functools.cache
def epub_members() -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(valid()["epub"])) as z:
        return {name: z.read(name) for name in z.namelist()}


def ext_of(kind: str) -> str:
    return "pdf" if kind == "fpdf" else kind


# -----------------------------------------------------------------------------
# the property

def _hwm_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return psutil.Process().memory_info().rss / MIB


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def read_inline(path: Path) -> str:
    """A file's text as the readers give it, in this process."""
    kind = check_source(path, limits=LIMITS)
    if kind == "text":
        with open_source(path, limits=LIMITS) as src:
            return "".join(b.text for b in src.blocks())
    out = path.with_suffix(".out")
    extract(path, kind, out, LIMITS)
    return out.read_text(encoding="utf-8")


def read_in_child(path: Path) -> str:
    with open_source(path, limits=LIMITS) as src:
        return "".join(b.text for b in src.blocks())


def holds(data: bytes, ext: str, child: bool = False) -> str | None:
    """Write ``data`` as a .``ext`` file and read it: returns the text, or None when refused with InputError; any
    other exception, or a budget overrun, fails the test."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fuzz.{ext}"
        path.write_bytes(data)
        _reset_peak()
        before = psutil.Process().memory_info().rss / MIB
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # parsers warn about every flaw of a damaged file
                text = read_in_child(path) if child else read_inline(path)
        except InputError:
            text = None
        seconds = time.perf_counter() - t0
        grew = _hwm_mb() - before
    assert seconds < (LIMITS.max_extract_seconds + 10 if child else EXAMPLE_S), f"took {seconds:.1f} s"
    assert grew < EXAMPLE_MB, f"memory grew by {grew:.0f} MiB"
    if text is not None and ext in ("html", "epub"):
        assert "\ue000" not in text and "\ue001" not in text
        # no "]>" left of a DOCTYPE's internal subset, unless the bytes hold one of their own (a mutated "<p>" to "<]>")
        assert "]>" not in text or b"]>" in data
    return text


# -----------------------------------------------------------------------------
# strategies

@st.composite
def mutated(draw, data: bytes) -> bytes:
    """``data`` after a few random edits: flipped, inserted, deleted or repeated bytes, or a truncation."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "repeat", "truncate"]))
        i = draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[i:i + draw(st.integers(1, 64))]
        elif op == "repeat":
            buf[i:i] = buf[i:i + draw(st.integers(1, 64))] * draw(st.integers(1, 50))
        else:
            del buf[i:]
    return bytes(buf)


def wrap(ext: str, text: bytes) -> bytes:
    """A file of kind ``ext`` whose content is ``text`` (bytes, possibly not even UTF-8) in its natural place."""
    if ext in ("txt", "md"):
        return text
    if ext == "html":
        return b"<html><body><p>" + text + b"</p></body></html>"
    if ext == "epub":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
            z.writestr("META-INF/container.xml", epub_members()["META-INF/container.xml"])
            z.writestr("OEBPS/content.opf", package(1))
            z.writestr("OEBPS/ch0.xhtml", b"<html><body><p>" + text + b"</p></body></html>")
        return buf.getvalue()
    if ext == "pdf":
        return pdf_bytes([b"BT /F1 12 Tf 72 720 Td (" + text.replace(b"\\", b"\\\\").replace(b"(", b"\\(")
                          .replace(b")", b"\\)") + b") Tj ET"])
    if ext == "srt":
        return b"1\n00:00:01,000 --> 00:00:02,000\n" + text + b"\n"
    if ext == "jsonl":
        return b'{"text": "' + text.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'", "label": 1}\n'
    sep = b"\t" if ext == "tsv" else b","
    return b"text" + sep + b"label\n\"" + text.replace(b'"', b'""') + b'"' + sep + b"1\n"


def nested(ext: str, depth: int) -> bytes:
    """A file of kind ``ext`` nested ``depth`` deep (elements, arrays, quotes, brackets)."""
    if ext == "html":
        return wrap(ext, b"<div>" * depth + b"deep" + b"</div>" * depth)
    if ext == "epub":
        return _epub_with("OEBPS/ch0.xhtml", b"<html><body>" + b"<div>" * depth + b"deep" + b"</div>" * depth
                          + b"</body></html>")
    if ext == "jsonl":
        return b'{"text": ' + b"[" * depth + b'"x"' + b"]" * depth + b', "label": 1}\n'
    if ext == "pdf":
        return pdf_bytes([b"BT /F1 12 Tf " + b"[" * depth + b"(x)" + b"]" * depth + b" TJ ET"])
    if ext in ("csv", "tsv"):
        return wrap(ext, b'"' * depth + b"x")
    return b"(" * depth + b"x" + b")" * depth


def _epub_with(member: str, data: bytes) -> bytes:
    """The valid EPUB with one member's bytes replaced by ``data``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in epub_members().items():
            z.writestr(name, data if name == member else content,
                       compress_type=zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED)
    return buf.getvalue()


# -----------------------------------------------------------------------------
# the runs: each property is one function, given examples by ``fuzz`` (CI) or ``fuzz(... * SLOW)`` (slow run)

def fuzz(strategy, prop, examples: int, derandomize: bool = True):
    """``prop`` run on ``examples`` examples of ``strategy`` (the same ones every run unless not ``derandomize``)."""
    return settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example])(given(strategy)(prop))


def prop_mutated(case) -> None:
    ext, data = case
    holds(data, ext)


def prop_wrong_extension(case) -> None:
    kind, ext = case
    holds(valid()[kind], ext)


def prop_epub_member(case) -> None:
    member, data = case
    holds(_epub_with(member, data), "epub")


def prop_nested(case) -> None:
    ext, depth = case
    holds(nested(ext, depth), ext)


def prop_odd_text(case) -> None:
    ext, text = case
    holds(wrap(ext, text.encode("utf-8", errors="surrogatepass")), ext)


def prop_mixed_encodings(case) -> None:
    ext, data = case
    holds(wrap(ext, data), ext)


def prop_child(case) -> None:
    ext, data = case
    holds(data, ext, child=True)


MIXED_ENCODINGS = st.lists(st.tuples(st.text(max_size=40), st.sampled_from(ENCODINGS)), min_size=1, max_size=8).map(
    lambda parts: b"".join(t.encode(enc, errors="replace") for t, enc in parts))
ODD_TEXT = st.text(alphabet=st.sampled_from(ZERO_WIDTH_AND_CONTROL) | st.characters(), min_size=1, max_size=300)
NAMES = ("mutated", "wrong_extension", "epub_member", "nested", "odd_text", "mixed_encodings", "child")


@functools.cache
def cases() -> dict[str, tuple]:
    """Each property with its strategy and its number of examples in the default run."""
    kinds = st.sampled_from(sorted(valid()))
    mutations = kinds.flatmap(lambda k: st.tuples(st.just(ext_of(k)), mutated(valid()[k])))
    members = st.sampled_from(sorted(n for n in epub_members() if n != "mimetype")).flatmap(
        lambda n: st.tuples(st.just(n), mutated(epub_members()[n])))
    return {
        "mutated": (mutations, prop_mutated, 2000),
        "wrong_extension": (st.tuples(kinds, st.sampled_from(EXTS + ("xyz",))), prop_wrong_extension, 120),
        "epub_member": (members, prop_epub_member, 300),
        "nested": (st.tuples(st.sampled_from(EXTS), st.integers(1, 200_000)), prop_nested, 150),
        "odd_text": (st.tuples(st.sampled_from(EXTS), ODD_TEXT), prop_odd_text, 400),
        "mixed_encodings": (st.tuples(st.sampled_from(EXTS), MIXED_ENCODINGS), prop_mixed_encodings, 300),
        "child": (mutations, prop_child, 60),
    }


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.heavy
def test_fuzz(case):
    strategy, prop, examples = cases()[case]
    fuzz(strategy, prop, examples)()


@pytest.mark.parametrize("ext", ["txt", "html", "csv", "tsv", "jsonl", "pdf", "epub", "srt"])
@pytest.mark.heavy
def test_huge_single_line(ext):
    """One line of 8 MiB without a newline (or a space, for the text kinds) in each kind."""
    line = b"x" * (8 * MIB)
    text = holds(wrap(ext, line), ext)
    assert text is None or "x" * 1000 in text


@pytest.mark.slow
@pytest.mark.parametrize("case", NAMES)
def test_fuzz_long(case):
    strategy, prop, examples = cases()[case]
    fuzz(strategy, prop, examples * SLOW, derandomize=False)()


def test_the_valid_files_read():
    """The files the mutations start from are valid: every kind gives its text."""
    texts = {kind: holds(data, ext_of(kind)) for kind, data in valid().items()}
    assert texts["epub"] == "One\n\nIt was the best of times.\n\nIt was the worst of times.\nYes."
    assert texts["pdf"] == "Page one says hello.\n\nPage two (second)." and "Revenue went up." in texts["fpdf"]
    assert texts["jsonl"] == "Review: great Sentiment: 1\n\nReview: awful Sentiment: 0"
    assert texts["srt"] == "Hello there. General Kenobi."
    assert all(texts.values())
