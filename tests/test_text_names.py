"""A book's proper names without a model (``text.names``): capitalised words it never writes in lower case, and per
passage the names of the one before it (the index-only field a word-matching finder would read)."""

from __future__ import annotations

from longmem.text.names import names_before, names_in, proper_names

BOOK = ("Crispin came down to dinner. The tower was dark. Hesther waited by the fire.\n"
        "When Crispin spoke, nobody answered. Then Hesther rose. The dog barked; when it stopped, Treliss slept.\n"
        "My father was a surgeon, he said. Treliss was his town.")


def test_proper_names_are_capitalised_words_never_written_in_lower_case():
    names = proper_names(BOOK)
    assert names == {"Crispin", "Hesther", "Treliss"}  # not "The", "When" (written lower case), nor "Then", "My"
    assert proper_names(BOOK, mentions=1) >= {"Crispin", "Hesther", "Treliss", "Then"}  # "then" is never written


def test_each_passage_gets_the_names_of_the_one_before_it():
    names = {"Crispin", "Hesther", "Treliss"}
    passages = ["Crispin came down. Hesther waited.", "My father was a surgeon, he said.",
                "Treliss slept. Crispin too."]
    assert names_in(passages[2], names) == ["Treliss", "Crispin"]
    assert names_before(passages, names) == [[], ["Crispin", "Hesther"], []]
    assert names_before(passages, names, before=2)[2] == ["Crispin", "Hesther"]
    assert names_before([], names) == []
