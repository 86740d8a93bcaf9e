"""The section a question names by title, and whether it asks how that section ends (``longmem.tasks.sections``)."""

from __future__ import annotations

import pytest

from longmem.tasks.sections import asks_ending, named_sections, titles

LABELS = ["chapter I: The Adventure of “The Western Star”", "chapter II: The Tragedy at Marsdon Manor",
          "Absolution", "Rags Martin-Jones and the Pr-Nce of W-Les", '"The Sensible Thing"', "Battling Billson",
          "The Return of Battling Billson", "Part Two, chapter VII", "The End"]


@pytest.mark.parametrize("label, want", [
    ("Part I: The Sea Like Bronze. . ., chapter II", ["The Sea Like Bronze"]),
    ("chapter IV: The Mystery of Hunter’s Lodge", ["The Mystery of Hunter’s Lodge"]),
    ("Chapter Twenty-One: The Long Walk", ["The Long Walk"]),
    ("Part One: Arrival, Chapter 3: The Quay", ["Arrival", "The Quay"]),
    ("Winter Dreams", ["Winter Dreams"]),
    ("The Book of Tea", ["The Book of Tea"]),  # "Book of" is no book's number
    ("Part Two, chapter VII", []),
    ("Book I, Chapter 1", []),
    ("The End", ["The End"]),
    ("The", []),  # stopwords only
])
def test_a_label_carries_its_part_and_chapter_titles(label, want):
    assert titles(label) == want


@pytest.mark.parametrize("question, want", [
    ("In 'The Adventure of the Western Star', who is Mary Marvell married to?", [LABELS[0]]),  # quotes differ
    ("In 'the tragedy at marsdon manor' who sent Poirot?", [LABELS[1]]),  # case ignored
    ("In 'Rags Martin-Jones and the Pr-nce of W-les', how did Rags's parents die?", [LABELS[3]]),
    ("In '\"The Sensible Thing\"', where does George make his success?", [LABELS[4]]),
    ("In 'Absolution', what untruth does Rudolph tell?", [LABELS[2]]),  # one word, quoted
    ("What absolution did the priest give?", []),  # one word, not quoted: just a word
    ("In 'The Return of Battling Billson', who fights?", [LABELS[6]]),  # the longest title named wins
    ("Who is Battling Billson's manager?", [LABELS[5]]),
    ("What happens at the end of chapter VII?", []),  # "The End" is one word but for stopwords: quoted only
    ("In 'The End', who dies?", [LABELS[8]]),
    ("Where do the Forresters live?", []),
])
def test_a_question_names_a_section_by_its_title(question, want):
    assert named_sections(question, LABELS) == want


def test_sections_of_the_same_title_are_all_named():
    labels = ["Book One: The Voyage, chapter I", "Book One: The Voyage, chapter II", "Book Two: Home, chapter III"]
    assert named_sections("In 'The Voyage', who sails?", labels) == labels[:2]


@pytest.mark.parametrize("question, want", [
    ("In 'The Mystery of Hunter's Lodge', what finally happened to Roger Havering?", True),
    ("Which bank manager turned out to be the thief?", True),
    ("Who actually took the pearls?", True),
    ("Where was he really being held?", True),
    ("What happens to George Tompkins at the end?", True),
    ("Whom does Judy end up marrying? Who ends up rich?", True),
    ("Who ran the sale at Ponder's End?", False),  # a name, not the end
    ("Who was the president of the railroad?", False),
])
def test_a_question_about_how_it_turns_out_is_told_by_its_words(question, want):
    assert asks_ending(question) is want
