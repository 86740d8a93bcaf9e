"""The file-format registry (``longmem.ingest.formats``): one entry per format, and everything that lists or
dispatches on formats (the readers, the extraction child, the titles, the command line, the app, the README) follows
it; a file without its format's signature is refused by the format's name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from longmem.ingest import formats, titles
from longmem.ingest.formats import FORMATS, TEXT
from longmem.ingest.readers import check_source, open_source
from longmem.text.io import InputError

ROOT = Path(__file__).resolve().parents[1]


def test_every_suffix_chooses_one_format():
    suffixes = [s for fmt in FORMATS for s in fmt.suffixes]
    assert len(suffixes) == len(set(suffixes)) == len(formats.BY_SUFFIX)
    assert all(s.startswith(".") and s == s.lower() and len(s) > 1 for s in suffixes)
    assert len({fmt.name for fmt in FORMATS}) == len(FORMATS)
    for fmt in FORMATS:
        for s in fmt.suffixes:
            assert formats.for_path(f"Some Book{s.upper()}") is fmt
    assert formats.for_path("notes.unknown") is None and formats.for_path("README") is None


def test_how_each_format_is_read_is_consistent():
    """Plain text and only plain text has no reader; the formats of one kind share their reader and title reader
    (the child is told the kind); a reader that holds the file whole has a size limit."""
    for fmt in FORMATS:
        assert (fmt.kind == TEXT) == (fmt.read is None), fmt.name
        assert fmt.kind != TEXT or (fmt.signature, fmt.title, fmt.max_bytes, fmt.labelled) == (None, None, None, False)
        first = formats.of_kind(fmt.kind) if fmt.kind != TEXT else fmt
        assert (fmt.read, fmt.title, fmt.labelled) == (first.read, first.title, first.labelled), fmt.name
    assert set(formats.KINDS) == {fmt.kind for fmt in FORMATS} - {TEXT}
    assert set(formats.TITLED_KINDS) == {"html", "epub", "pdf"}
    assert formats.PLAIN.kind == TEXT
    for name in ("html", "epub", "pdf", "csv", "tsv", "jsonl"):
        assert formats.BY_SUFFIX["." + name].max_bytes == formats.MAX_EXTRACT_BYTES
    with pytest.raises(ValueError, match="unknown kind of document 'text'"):
        formats.of_kind(TEXT)


def test_the_lists_derive_from_the_registry():
    book = tuple(s for fmt in FORMATS if not fmt.labelled for s in fmt.suffixes)
    demo = tuple(s for fmt in FORMATS if fmt.labelled for s in fmt.suffixes)
    assert (formats.BOOK_SUFFIXES, formats.DEMO_SUFFIXES, formats.SUPPORTED) == (book, demo, book + demo)
    assert formats.listed().startswith("txt, md, rst, html, epub, pdf")
    assert formats.listed() == ", ".join(fmt.name for fmt in FORMATS if not fmt.labelled)
    assert formats.listed(labelled=True) == "csv, tsv, jsonl"
    assert [titles.titled_kind(Path("b" + s)) for s in (".md", ".htm", ".epub", ".pdf", ".csv", ".log")] == [
        "text", "html", "epub", "pdf", None, None]


def test_the_command_line_lists_the_registrys_formats():
    from longmem.cli.main import build_parser

    parser = build_parser()
    helps = []
    for action in parser._actions:  # the subcommands and their subcommands: every help text
        for choice in getattr(action, "_choices_actions", []):
            helps.append(choice.help or "")
        for sub in (getattr(action, "choices", None) or {}).values():
            if hasattr(sub, "format_help"):
                helps.append(sub.format_help())
                for inner in sub._actions:
                    helps += [c.help or "" for c in getattr(inner, "_choices_actions", [])]
    text = " ".join(" ".join(h.split()) for h in helps)
    assert f"a book to read for this run ({formats.listed()})" in text
    assert f"read files into a bank ({formats.listed()}; {formats.listed(labelled=True)} demonstrations)" in text


# a format's name or suffix as a word of its own ("epub", ".pdf"), not inside a file name ("reviews.csv")
NAMED = re.compile(r"(?<![\w.])\.?(" + "|".join(fmt.name for fmt in FORMATS) + r")\b")


def hand_typed(text: str) -> bool:
    """Whether a string of code is a hand-typed list of formats: it names two or more, or it is a suffix itself
    (".txt" aside: the classifier also reads one text per line of a .txt file, which is not a reader's format)."""
    return len(set(NAMED.findall(text))) >= 2 or (text in formats.SUPPORTED and text != ".txt")


@pytest.mark.parametrize("path", ["longmem/cli/main.py", "longmem/cli/bank.py", *sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "app").glob("*.py"))])
def test_no_list_of_formats_is_typed_by_hand(path):
    """The command line and the app take their lists of formats from the registry (the app through the service
    layer): no string in their code, docstrings aside, lists formats."""
    tree = ast.parse((ROOT / path).read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    typed = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and id(node) not in docstrings and hand_typed(node.value)]
    assert typed == []


def test_the_hand_typed_check_sees_a_list():
    assert hand_typed("Drop a book (.txt .md .html)") and hand_typed("csv/tsv/jsonl") and hand_typed(".epub")
    assert not hand_typed("reviews.csv") and not hand_typed(", or .txt with one text per line)")


def test_the_readme_and_the_guide_list_the_registrys_book_formats():
    names = [fmt.name for fmt in FORMATS if not fmt.labelled]
    readme = (ROOT / "README.md").read_text()
    assert f"drop a book ({' '.join('.' + n for n in names)})" in readme
    assert f"(resumable; {' '.join(names)})" in readme
    assert f"# {formats.listed()};" in (ROOT / "docs" / "guide.md").read_text()


@pytest.mark.parametrize("name, data, message", [
    ("book.epub", b"<html>not a zip</html>", r"book\.epub: cannot read this EPUB: it is not a zip archive"),
    ("paper.pdf", b"just text, no header", r"paper\.pdf: cannot read this PDF: there is no %PDF- header"),
])
def test_a_file_without_its_formats_signature_is_refused_by_name(tmp_path, name, data, message):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(InputError, match=message):
        check_source(p)
    with pytest.raises(InputError, match=message):
        open_source(p)  # refused before any child starts


def test_an_unknown_suffix_is_plain_text_when_it_looks_like_text(tmp_path):
    p = tmp_path / "notes.log"
    p.write_text("plain words\n")
    assert check_source(p) == TEXT
    with open_source(p) as src:
        assert (src.kind, "".join(b.text for b in src.blocks())) == ("text", "plain words\n")
    p = tmp_path / "blob.bin"
    p.write_bytes(b"\x00\x01\x02binary")
    with pytest.raises(InputError, match=r"unsupported file type '\.bin' \(supported: \.txt, .*\.pdf, .*\.csv"):
        check_source(p)


def test_extract_runs_the_readers_of_each_kind_in_process(tmp_path):
    p = tmp_path / "page.html"
    p.write_text("<html><head><title>T</title></head><body><p>One.</p><p>Two.</p></body></html>")
    out = tmp_path / "out.txt"
    facts = formats.extract(p, "html", out, formats.ExtractLimits())
    assert (facts["title"], out.read_text(), facts["chars"]) == ("T", "One.\n\nTwo.", 10)
    assert formats.read_title(p, "html", formats.ExtractLimits()) == "T"
    with pytest.raises(ValueError, match="unknown kind of document 'doc'"):
        formats.extract(p, "doc", out, formats.ExtractLimits())
    with pytest.raises(ValueError, match="no title is read from a document of kind 'demos'"):
        formats.read_title(p, "demos", formats.ExtractLimits())
