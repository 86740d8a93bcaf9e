"""longmem.text.chapters: chapter detection in plain-text books; ChapterBreak-style suffix items (no model)."""

from __future__ import annotations

import random

import pytest

from longmem.eval.chapterbreak import MIN_SUFFIX_WORDS, suffix_items
from longmem.text.chapters import chapter_label, find_chapters

ROMAN = ["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII"]


def body(i: int, n: int = 60) -> str:
    """A chapter's text: n distinct words ("c3w0 c3w1 ..."), wrapped at 8 words a line, in two paragraphs."""
    words = [f"c{i}w{k}" for k in range(n)]
    lines = [" ".join(words[k:k + 8]) for k in range(0, n, 8)]
    half = len(lines) // 2
    return "\n".join(lines[:half]) + ".\n\n" + "\n".join(lines[half:]) + "."


def opening(text: str, start: int, n: int = 150) -> str:
    return " ".join(text[start:].split()[:n])


def make_book(headings: list[str], toc: bool = True, bodies: dict[int, str] | None = None) -> str:
    """A fake book: title page, a table of contents (blank-line separated, then a preface), then the chapters."""
    parts = ["*** START OF THE PROJECT GUTENBERG EBOOK 12345 ***", "THE FAKE BOOK", "BY A. WRITER"]
    if toc:
        parts += ["CONTENTS", *headings]
        parts += ["PREFACE", "This preface is long enough to look like text, so the last entry of the contents is "
                  "followed by more than twenty words and only the numbering check can tell it is not a chapter."]
    for i, h in enumerate(headings):
        parts += [h, (bodies or {}).get(i, body(i))]
    parts += ["THE END", "*** END OF THE PROJECT GUTENBERG EBOOK 12345 ***", "CHAPTER IX", body(99)]
    return "\n\n\n".join(parts) + "\n"


def test_chapter_headings_with_a_table_of_contents():
    headings = [f"CHAPTER {r}" for r in ROMAN[:8]]
    text = make_book(headings)
    chapters = find_chapters(text)
    assert [c.heading for c in chapters] == headings  # neither the contents nor the chapter after the END line
    first_real = text.index("CHAPTER I\n", text.index("PREFACE"))
    assert chapters[0].start == first_real
    for i, c in enumerate(chapters):
        assert c.index == i
        assert text[c.start:].startswith(headings[i])
        assert text[c.body_start:].startswith(f"c{i}w0 ")
    crlf = text.replace("\n", "\r\n")
    assert [crlf[c.body_start:].split()[0] for c in find_chapters(crlf)] == [f"c{i}w0" for i in range(8)]


def test_roman_numeral_headings_with_titles():
    chunks = ["GREAT NOVEL", "Table of Contents\nI\nII\nIII\nIV\nV\nVI"]  # one entry a line: no heading
    for i in range(6):
        chunks += [f"{ROMAN[i]}." if i % 2 else ROMAN[i], f"The Adventure of Number {i}", body(i)]
    text = "\n\n\n".join(chunks)
    chapters = find_chapters(text)
    assert len(chapters) == 6
    assert chapters[1].heading == "II.\nThe Adventure of Number 1"  # the title belongs to the heading
    assert all(text[c.body_start:].startswith(f"c{i}w0") for i, c in enumerate(chapters))


def test_arabic_and_word_numbers():
    for headings in ([f"Chapter {i}" for i in range(1, 8)],
                     ["CHAPTER ONE", "CHAPTER TWO", "CHAPTER THREE", "CHAPTER FOUR"],
                     [f"CHAPTER THE {w}" for w in ("FIRST", "SECOND", "THIRD", "FOURTH", "FIFTH")]):
        assert [c.heading for c in find_chapters(make_book(headings, toc=False))] == headings
    many = ["CHAPTER " + w for w in ("NINETEEN", "TWENTY", "TWENTY-ONE")]
    text = make_book(["CHAPTER ONE"] + [f"CHAPTER {i}" for i in range(2, 19)] + many, toc=False)
    assert [c.heading for c in find_chapters(text)][-3:] == many


def test_numbering_must_continue():
    bodies = {1: body(1) + "\n\n\nCHAPTER VII\n\n\n" + body(50)}  # a stray heading inside chapter II
    text = make_book(["CHAPTER I", "CHAPTER II", "CHAPTER III"], toc=False, bodies=bodies)
    assert [c.heading for c in find_chapters(text)] == ["CHAPTER I", "CHAPTER II", "CHAPTER III"]


def test_parts_restart_the_numbering():
    chunks = ["A NOVEL", "PART ONE"]
    for i in range(3):
        chunks += [ROMAN[i], body(i)]
    chunks += ["PART TWO"]
    for i in range(3):
        chunks += [ROMAN[i], body(3 + i)]
    text = "\n\n\n".join(chunks)
    chapters = find_chapters(text)
    assert [c.heading for c in chapters] == ["PART ONE\nI", "II", "III", "PART TWO\nI", "II", "III"]
    assert chapters[3].start == text.index("PART TWO")  # the prefix does not end with the part heading
    assert text[chapters[3].body_start:].startswith("c3w0")
    assert [c.part for c in chapters] == ["PART ONE"] * 3 + ["PART TWO"] * 3  # every chapter of a part, not the first
    assert [c.label for c in chapters] == [f"Part {p}, chapter {r}" for p in ("One", "Two") for r in ROMAN[:3]]


def test_parts_listed_in_the_contents_are_not_a_part():
    chunks = ["A NOVEL", "CONTENTS", "PART I", "PART II", "A PREFACE", body(90)]  # no part heading in the book
    for i in range(3):
        chunks += [f"CHAPTER {ROMAN[i]}", f"THE TITLE OF {ROMAN[i]}", body(i)]
    chapters = find_chapters("\n\n\n".join(chunks))
    assert [c.part for c in chapters] == [None] * 3
    assert chapters[1].label == "Chapter II: The Title of II"


def test_chapter_labels_read_as_the_book_prints_them():
    cases = {("VII", "PART TWO"): "Part Two, chapter VII", ("PART TWO\nI", None): "Part Two, chapter I",
             ("II.\nThe Adventure", None): "chapter II: The Adventure",
             ("CHAPTER III\nTHE FLIGHT OF “THE BARSOOM”", "PART II"):
                 "Part II, Chapter III: The Flight of “The Barsoom”",
             ("PART I\nTHE PART'S TITLE\nCHAPTER I\nFLOTSAM", "PART I"): "Part I, Chapter I: Flotsam",
             ("CHAPTER\nXII", "_BOOK THE FIRST_"): "Book the First, Chapter XII", ("Chapter 3.", None): "Chapter 3",
             ("CHAPTER ONE\nI", None): "Chapter One", ("THE RICH BOY", None): "The Rich Boy",
             ("BOOK FIRST", None): "Book First"}
    for (heading, part), label in cases.items():
        assert chapter_label(heading, part) == label
        assert chapter_label(label) == label  # a stored label reads the same again
    # banks made before labels stored a heading's lines joined by spaces
    assert [chapter_label(h) for h in ("VII", "IV.", "PART TWO I", "CHAPTER XII")] == [
        "chapter VII", "chapter IV", "Part Two, chapter I", "Chapter XII"]


def test_story_titles_from_the_contents():
    titles = ["THE FIRST STORY", "ANOTHER TALE", "THE LAST ONE"]
    chunks = ["STORIES", "CONTENTS", *titles]
    for i, t in enumerate(titles):  # sections numbered from II (I is implicit) are not chapters
        chunks += [t, body(3 * i), "II", body(3 * i + 1), "III", body(3 * i + 2)]
    text = "\n\n\n".join(chunks)
    chapters = find_chapters(text)
    assert [c.heading for c in chapters] == titles
    assert chapters[0].start > text.index("THE LAST ONE")  # found after the contents, not in it


def test_no_chapters():
    assert find_chapters("") == []
    prose = "\n\n".join(body(i) for i in range(10))
    assert find_chapters(prose) == []
    assert suffix_items("prose", prose) == []
    assert find_chapters(make_book(["CHAPTER I"], toc=False)) == []  # one chapter is not enough


def test_suffix_items():
    headings = [f"CHAPTER {r}" for r in ROMAN[:8]]
    text = make_book(headings)
    chapters = find_chapters(text)
    items = suffix_items("fake", text, n_negatives=3, suffix_words=25, rng=random.Random(1))
    assert [it.chapter for it in items] == [1, 2, 3, 4]  # chapters with >= 3 later chapters
    for it in items:
        ch = chapters[it.chapter]
        assert it.book == "fake" and it.prefix_end == ch.start
        assert text[:it.prefix_end].rstrip().endswith(f"c{it.chapter - 1}w59.")  # the prefix ends at the break
        assert it.candidate_chapters[0] == it.chapter
        negatives = it.candidate_chapters[1:]
        assert len(negatives) == len(set(negatives)) == 3 and all(j > it.chapter for j in negatives)
        for j, cand in zip(it.candidate_chapters, it.candidates):
            assert cand == opening(text, chapters[j].body_start, 25)  # same formatting for every candidate
            assert len(cand.split()) == 25 and "CHAPTER" not in cand and "\n" not in cand
        assert it.candidates[0].startswith(f"c{it.chapter}w0 ")


def test_suffix_items_deterministic():
    text = make_book([f"CHAPTER {r}" for r in ROMAN[:12]])
    a = suffix_items("b", text, n_negatives=4, rng=random.Random(7))
    b = suffix_items("b", text, n_negatives=4, rng=random.Random(7))
    c = suffix_items("b", text, n_negatives=4, rng=random.Random(8))
    assert a == b and len(a) == 7
    assert [it.candidate_chapters for it in a] != [it.candidate_chapters for it in c]
    assert suffix_items("b", text, n_negatives=4) == suffix_items("b", text, n_negatives=4)  # default rng is seeded


def test_too_few_later_chapters():
    text = make_book([f"CHAPTER {r}" for r in ROMAN[:4]])
    assert len(suffix_items("b", text, n_negatives=2)) == 1
    assert suffix_items("b", text, n_negatives=3) == []
    assert suffix_items("b", text, n_negatives=50) == []
    assert len(suffix_items("b", text, n_negatives=0)) == 3
    with pytest.raises(ValueError):
        suffix_items("b", text, n_negatives=-1)


def test_short_chapters_and_long_prefixes():
    tiny = "TITLE OF THE TINY ONE\n\n" + " ".join(f"t{k}" for k in range(MIN_SUFFIX_WORDS - 3)) + "."
    text = make_book([f"CHAPTER {r}" for r in ROMAN[:6]], toc=False, bodies={2: tiny, 5: body(5, n=30)})
    chapters = find_chapters(text)
    assert len(chapters) == 6  # the tiny chapter is found ...
    items = suffix_items("b", text, n_negatives=1, suffix_words=150)
    assert all(2 not in it.candidate_chapters for it in items)  # ... but is never a candidate
    last = next(it for it in items if it.candidate_chapters[1] == 5)
    assert last.candidates[1] == opening(text, chapters[5].body_start, 30)  # a short chapter gives what it has
    assert "THE END" not in " ".join(it.candidates[0] for it in items)
    cut = chapters[3].start
    assert [it.chapter for it in suffix_items("b", text, n_negatives=1, min_prefix_chars=cut)] == [3, 4]


EXPECTED = {  # chapters counted by reading the held-out books (the 8 "test" books of the manifest)
    "pg61262": (11, "I\nThe Adventure of “The Western Star”", "XI\nThe Case of the Missing Will"),  # Poirot
    "pg64317": (9, "I", "IX"),  # The Great Gatsby
    "pg65636": (18, "PART ONE\nI", "IX"),  # A Lost Lady: two parts of nine chapters
    "pg66829": (6, "CHAPTER ONE\nGENTLEMEN PREFER BLONDES", "CHAPTER SIX\nBRAINS ARE REALLY EVERYTHING"),
    "pg67098": (10, "CHAPTER I\nIN WHICH WE ARE INTRODUCED TO\nWINNIE-THE-POOH AND SOME BEES,\nAND THE STORIES BEGIN",
                "CHAPTER X\nIN WHICH CHRISTOPHER ROBIN GIVES\nPOOH A PARTY, AND WE SAY GOOD-BYE"),  # Winnie-the-Pooh
    "pg67979": (45, "CHAPTER I", "CHAPTER XLV"),  # The Blue Castle
    "pg68229": (9, "THE RICH BOY", "GRETCHEN'S FORTY WINKS"),  # All the Sad Young Men: nine stories
    "pg69087": (27, "CHAPTER I\nDR. SHEPPARD AT THE BREAKFAST TABLE", "CHAPTER XXVII\nAPOLOGIA"),  # Roger Ackroyd
}


def test_held_out_books(shared_data_dir):
    books = shared_data_dir / "books"
    for name, (count, first, last) in EXPECTED.items():
        text = (books / f"{name}.txt").read_text(encoding="utf-8")
        chapters = find_chapters(text)
        assert (len(chapters), chapters[0].heading, chapters[-1].heading) == (count, first, last), name
        for it in suffix_items(name, text, n_negatives=3):
            assert it.candidate_chapters[0] == it.chapter and min(it.candidate_chapters[1:]) > it.chapter
            assert all(len(c.split()) == 150 for c in it.candidates), name
    gatsby = (books / "pg64317.txt").read_text(encoding="utf-8")
    assert gatsby[find_chapters(gatsby)[0].body_start:].startswith("In my younger and more vulnerable years")
    assert [c.label for c in find_chapters(gatsby)][2] == "chapter III"
    lady = find_chapters((books / "pg65636.txt").read_text(encoding="utf-8"))  # A Lost Lady: two parts of I-IX
    assert [c.label for c in lady][8:11] == ["Part One, chapter IX", "Part Two, chapter I", "Part Two, chapter II"]
    assert lady[15].label == "Part Two, chapter VII" and lady[15].heading == "VII"
