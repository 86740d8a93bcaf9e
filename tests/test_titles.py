"""A book's own title (``longmem.ingest.titles``): from a Gutenberg header, an HTML <title>, EPUB and PDF metadata;
junk refused; a bad or hostile file gives None, never an error."""

from __future__ import annotations

import os
import zipfile

import pytest
from docfiles import CONTAINER, chapter, package, pdf_bytes, text_stream, write_epub, write_pdf

from longmem.ingest.readers import open_source
from longmem.ingest.titles import MAX_TITLE_CHARS, book_title, clean_title, gutenberg_title, title_page

GUTENBERG = ("\ufeffThe Project Gutenberg eBook of A Lost Lady, by Willa Cather\n\n"
             "This ebook is for the use of anyone anywhere in the United States and\n"
             "most other parts of the world at no cost and with almost no restrictions\nwhatsoever.\n\n"
             "Title: A Lost Lady\n\nAuthor: Willa Cather\n\nRelease date: September 1, 2021 [eBook #65636]\n\n"
             "*** START OF THE PROJECT GUTENBERG EBOOK A LOST LADY ***\n\nThirty or forty years ago, in one of "
             "those grey towns along the Burlington railroad...\n")


def test_a_gutenberg_title_line_names_the_book(tmp_path):
    p = tmp_path / "pg65636.txt"
    p.write_text(GUTENBERG, encoding="utf-8")
    assert book_title(p) == "A Lost Lady"
    with open_source(p) as src:  # the readers title the document the same way (the command line's ingest)
        assert (src.title, src.own_title) == ("A Lost Lady", "A Lost Lady")


@pytest.mark.parametrize("head, title", [
    ("The Project Gutenberg EBook of Pride and Prejudice, by Jane Austen\n\nThis eBook is for the use of anyone.\n",
     "Pride and Prejudice"),
    ("Project Gutenberg's The Adventures of Tom Sawyer, Complete, by Mark Twain\n\n",
     "The Adventures of Tom Sawyer, Complete"),
    ("**The Project Gutenberg Etext of The Time Machine**\n", "The Time Machine"),
    ("The Project Gutenberg eBook of Moby Dick\n\nTitle: Moby Dick; Or,\n    The Whale\n\nAuthor: Herman Melville\n",
     "Moby Dick; Or, The Whale"),  # a Title: line wins over the first line, with its indented continuation
    ("The Project Gutenberg eBook of X\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nTitle: Not The Header\n",
     "X"),  # after the start marker is the book, not its header
    ("The Keeper of Gull Point\n\nTitle: a line in a story\n", None),  # no Gutenberg header: no first line is a title
    ("", None),
])
def test_gutenberg_headers(head, title):
    assert gutenberg_title(head) == title


START = "*** START OF THE PROJECT GUTENBERG EBOOK 65636 ***\n\n"


@pytest.mark.parametrize("head, title", [
    (START + "A LOST LADY\n\n\nby\n\n\nWILLA CATHER\n\n\n\nThirty or forty years ago...", "A Lost Lady"),
    (START + "\n\n                 The Great Gatsby\n                        by\n             F. Scott Fitzgerald\n",
     "The Great Gatsby"),  # the "by" in the title's own paragraph
    (START + "SOME DO NOT. . .\n\nA Novel\n\nBY\n\nFORD MADOX HUEFFER\n", "Some Do Not. . ."),  # not its subtitle
    (START + "[Illustration: the cover]\n\nTHE SENSE OF THE PAST\n\nBY HENRY JAMES\n", "The Sense of the Past"),
    (START + "Transcriber's Note\n\nA BOOK OF VERSE\n\nby\n\nSOMEONE\n", "A Book of Verse"),
    (START + "CHAPTER I\n\nIt was a dark night, and the wind blew.\n", None),  # no title page: no title
    (START + "UKRIDGE\n\nWHAT THIS STORY IS ABOUT\n\n\u201cDo not count your chickens.\u201d\n", None),
    ("A LOST LADY\n\nby\n\nWILLA CATHER\n", None),  # without the marker it is any text's first lines
])
def test_a_title_page_after_the_start_marker(head, title):
    assert title_page(head) == title


def test_a_book_whose_header_was_stripped_is_named_by_its_title_page(tmp_path):
    p = tmp_path / "pg65636.txt"
    p.write_text(START + "A LOST LADY\n\n\nby\n\n\nWILLA CATHER\n\n\nThirty or forty years ago, in one of "
                 "those grey towns along the Burlington railroad...\n", encoding="utf-8")
    assert book_title(p) == "A Lost Lady"


def test_an_html_title(tmp_path):
    p = tmp_path / "page.html"
    p.write_text("<html><head><title>  The\n  Great   Gatsby </title></head><body><p>In my younger years</p></body>"
                 "</html>")
    assert book_title(p) == "The Great Gatsby"


def test_an_epub_title_from_its_package(tmp_path):
    p = write_epub(tmp_path / "pg64317.epub", [chapter("<p>In my younger and more vulnerable years.</p>")],
                   title="The Great Gatsby")
    assert book_title(p) == "The Great Gatsby"


def test_a_pdf_title_from_its_metadata(tmp_path):
    p = write_pdf(tmp_path / "q3.pdf", [["Revenue went up."]], title="Quarterly Report")
    assert book_title(p) == "Quarterly Report"


@pytest.mark.heavy
def test_files_without_a_title_give_none(tmp_path):
    plain, html = tmp_path / "notes.txt", tmp_path / "page.html"
    plain.write_text("The Keeper of Gull Point\n\nThe lamp was lit at six.\n")
    html.write_text("<html><body><p>No head here.</p></body></html>")
    pdf = write_pdf(tmp_path / "report.pdf", [["hello"]])  # an empty /Info
    untitled = write_pdf(tmp_path / "untitled.pdf", [["hello"]], title="Microsoft Word - report.docx")
    csv = tmp_path / "reviews.csv"
    csv.write_text("text,label\ngood,1\n")
    for p in (plain, html, pdf, untitled, csv, tmp_path / "missing.epub"):
        assert book_title(p) is None, p


@pytest.mark.heavy
def test_bad_and_hostile_files_give_none_without_raising(tmp_path):
    junk_epub, junk_pdf = tmp_path / "junk.epub", tmp_path / "junk.pdf"
    junk_epub.write_bytes(b"PK\x03\x04" + os.urandom(2000))
    junk_pdf.write_bytes(b"%PDF-1.4\n" + os.urandom(2000))
    truncated = tmp_path / "truncated.pdf"
    truncated.write_bytes(pdf_bytes([text_stream("hello")], title="Cut Short")[:150])
    no_container = tmp_path / "no-container.epub"
    with zipfile.ZipFile(no_container, "w") as z:
        z.writestr("OEBPS/content.opf", package(0, "Lost"))
    bomb = tmp_path / "bomb.epub"  # a container.xml that inflates ~1000 times: refused before it is inflated
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("META-INF/container.xml", CONTAINER + " " * (16 * 2**20))
        z.writestr("OEBPS/content.opf", package(0, "Bomb"))
    not_xml = write_epub(tmp_path / "not-xml.epub", [chapter("<p>x</p>")], opf="\x00\x01 not xml")
    binary_html = tmp_path / "binary.html"
    binary_html.write_bytes(os.urandom(4000))
    for p in (junk_epub, junk_pdf, truncated, no_container, bomb, not_xml, binary_html):
        assert book_title(p) is None, p


@pytest.mark.parametrize("raw, title", [
    ("  The\tGreat \n Gatsby  ", "The Great Gatsby"), ("\x00Bad\x07 Title", "Bad Title"), ('"Quoted"', "Quoted"),
    ("a_lost_lady", "a_lost_lady"), ("Les Misérables", "Les Misérables"), ("A.I.", "A.I."),
    ("", None), ("   ", None), ("-- ... --", None), ("Untitled", None), ("untitled document", None),
    ("Microsoft Word - Chapter 1.doc", None), ("draft.docx", None), ("Layout 1", None), (None, None)])
def test_clean_title(raw, title):
    assert clean_title(raw) == title


def test_a_long_title_is_cut_at_a_word():
    long = "The Life and Strange Surprizing Adventures of Robinson Crusoe, of York, Mariner: Who lived Eight and " \
           "Twenty Years, all alone in an un-inhabited Island on the Coast of America"
    title = clean_title(long)
    assert len(title) <= MAX_TITLE_CHARS and long.startswith(title) and long[len(title)] == " "
    assert clean_title("x" * 500) == "x" * MAX_TITLE_CHARS  # one word: cut where it must be
