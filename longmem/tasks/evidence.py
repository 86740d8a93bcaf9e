"""Evidence: whether the passages an answer read hold what the answer says, and which sentence of a passage supports
it. Both work on words, so they are cheap, need no model and read the same for every backbone.

Words are compared by a light stem (lower case, a possessive 's and a plural or verb ending dropped: "married" and
"marries" meet, "kept" and "keep" do not). An answer's *added words* are its content words (no stopwords, none of
the words an answer uses about itself or the book, no lone digit) that the question does not hold: "Mrs. Forrester
married Henry Collins." asked "Whom did Mrs. Forrester marry?" adds "married", "Henry" and "Collins". Its
*grounding* in the passages read is the share of its added words found in them. A small model that invents an
answer invents words the book does not have ("Colorado Springs" for a town the book calls Sweet Water), or adds
nothing at all (restating the question); both ground poorly, which is what lets the answer say that the book does
not say (``tasks.answer``).

An answer is checked as it is made (``Checker``), sentence by sentence: a sentence is shown once one *stretch* in the
passages holds a bound's share of its added words, a sentence that adds nothing waits for the next one, and the
first sentence below the bound ends the answer, as does one that opens a new "Question:" or "Answer:" (the reading
prompt's own format, which a small model goes on writing). A preamble ("The answer to this question is:") is not
shown. A small model's first sentence usually says what the
passage says, and what it writes after it is where it invents.

A stretch (``stretches``) is a sentence of a passage read with the sentence on either side, one that holds a word
of the question: the words an answer adds must be found together, where a passage speaks of what was asked, not
scattered over the passages read. A small model that does not find the answer copies words from sentences about
something else ("...is a creature that turns out to be a cat", its "cat" from a sentence far from the question's
words), and those are seldom together near the question's words. When no sentence read holds a word of the question
(as a story's last passages, read for how it ends, may not), every sentence's neighbourhood is a stretch.

The *support* of an answer in a passage is the sentence holding most of the answer's added words (ties: the one
holding most of the question's words, then the first); the app marks it and the CLI prints it. A passage that
supports nothing (all of them, when the reply is that the book does not say) is quoted by its sentence *nearest* the
question: the one holding most of the question's words (``nearest``), where a reader looks for what was asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from longmem.storage.passages import STOPWORDS
from longmem.text.passages import sentence_spans

REACH = 1  # sentences on either side of a passage's sentence that make one stretch with it (``stretches``)
ASKED = 1  # the question's words a stretch must hold, at least (or all it has, when fewer; ``stretches``)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)  # "_Araminta_" (italics in a Gutenberg text) is the word "araminta"
_POSSESSIVE = re.compile(r"['\u2019]s\b", re.IGNORECASE)
_SUFFIXES = ("ing", "ed", "es", "s", "ly")
_PREAMBLE = re.compile(r"\s*(the )?answer( to (this|the|your) question)? is\s*:\s*", re.IGNORECASE)  # said, not shown
_NEW_TURN = re.compile(r"\W*(question|answer)\s*:", re.IGNORECASE)  # the excerpts' format: the answer is over
# words an answer uses about itself, the book or the conversation ("Sure. The answer is...", "the passage does not
# mention...", "the hotel in the scene described is..."): they add nothing
SELF_WORDS = frozenset("answer question passage passages excerpt excerpts text book story scene scenes describe "
                       "described describes mention mentioned say says said name named called sure yes okay ok well "
                       "certainly indeed course according".split())


def stem(word: str) -> str:
    """A light stem: one plural or verb ending dropped from a word long enough to keep four letters."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> list[str]:
    """The stems of the words of ``text`` that carry content, in order: lower case, without stopwords or a
    possessive 's."""
    words = (w.lower() for w in _WORD.findall(_POSSESSIVE.sub("", text)))
    return [stem(w) for w in words if w not in STOPWORDS]


def added_words(answer: str, question: str) -> list[str]:
    """The answer's content words that the question does not hold (each once, in order), without the words an answer
    uses about itself (``SELF_WORDS``) or a lone digit (a list's numbering)."""
    asked = set(content_words(question)) | {stem(w) for w in SELF_WORDS}
    return [w for w in dict.fromkeys(content_words(answer)) if w not in asked and not (w.isdigit() and len(w) == 1)]


def grounding(answer: str, question: str, passages: list[str]) -> float:
    """The share of the answer's added words (``added_words``) found in ``passages``, pooled; 0.0 when it adds none."""
    return held(added_words(answer, question), [{w for p in passages for w in content_words(p)}])


def stretches(question: str, passages: list[str], reach: int = REACH, asked_words: int = ASKED) -> list[set[str]]:
    """The stretches of ``passages`` where an answer to ``question`` may find its words (see the module doc): for each
    sentence of a passage, the content words of it and of the ``reach`` sentences on either side within that
    passage; only those holding ``asked_words`` of the question's words (all of them when it has fewer), else those
    holding one, unless none does (then all of them). A reader that reads long spans reads many sentences that hold
    one word of the question (a name): asking for two keeps the stretches where the question's matter is."""
    asked = set(content_words(question))
    need = max(1, min(asked_words, len(asked)))
    out = []
    for text in passages:
        sentences = [set(content_words(text[a:b])) for a, b in sentence_spans(text)]
        out += [set().union(*sentences[max(0, i - reach): i + reach + 1]) for i in range(len(sentences))]
    for least in dict.fromkeys((need, 1)):
        near = [stretch for stretch in out if len(stretch & asked) >= least]
        if near:
            return near
    return out


def held(added: list[str], among: list[set[str]]) -> float:
    """The largest share of the words ``added`` that one of the word sets ``among`` (``stretches``) holds (0.0 with no
    words or no sets)."""
    if not added:
        return 0.0
    return max((sum(w in words for w in added) / len(added) for words in among), default=0.0)


class Checker:
    """Checks an answer to ``question`` against ``passages`` as it is made (see the module doc): ``feed`` each piece
    of text, then ``finish``; each returns the text newly shown (possibly ""). ``stopped``: a sentence was below
    ``least`` (the answer ends before it); ``shown``: all the text shown so far."""

    def __init__(self, question: str, passages: list[str], least: float, reach: int = REACH,
                 asked_words: int = ASKED):
        self.question, self.least = question, least
        self.stretches = stretches(question, passages, reach, asked_words)
        self.text = ""  # everything fed
        self.judged = 0  # characters of ``text`` judged
        self.start = 0  # where the text shown begins (after a preamble such as "The answer is:")
        self.end = 0  # characters of ``text`` shown
        self.stopped = False

    @property
    def shown(self) -> str:
        return self.text[self.start: self.end].strip()

    def feed(self, piece: str) -> str:
        self.text += piece
        return self._judge(final=False)

    def finish(self) -> str:
        """The answer is complete: judge its last sentence too."""
        return self._judge(final=True)

    def _judge(self, final: bool) -> str:
        if not self.end and (m := _PREAMBLE.match(self.text)) is not None and m.end() < len(self.text):
            self.start = self.judged = max(self.judged, m.end())
        before, base = max(self.end, self.start), self.judged
        spans = sentence_spans(self.text[base:])
        for start, end in spans if final else spans[:-1]:  # the last one may still grow
            if self.stopped:
                break
            sentence = self.text[base + start: base + end]
            added = added_words(sentence, self.question)
            if _NEW_TURN.match(sentence) or added and held(added, self.stretches) < self.least:
                self.stopped = True
                break
            if added:
                self.end = base + end  # shown, with the sentences before it that added nothing
            self.judged = base + end
        return self.text[before: self.end]


@dataclass(frozen=True)
class Support:
    """The sentence of a passage that supports an answer: ``text[start:end]`` of the passage's text."""

    start: int
    end: int
    words: int  # how many of the answer's added words it holds (>= 1)


def support(answer: str, question: str, text: str) -> Support | None:
    """The sentence of ``text`` that holds most of the answer's added words (see the module doc); None when no
    sentence holds any."""
    added = set(added_words(answer, question))
    asked = set(content_words(question))
    best, key = None, (0, 0)
    for start, end in sentence_spans(text):
        words = set(content_words(text[start:end]))
        k = (len(words & added), len(words & asked))
        if k[0] and k > key:
            best, key = Support(start, end, k[0]), k
    return best


def nearest(question: str, text: str) -> tuple[int, int] | None:
    """(start, end) in ``text`` of its sentence that holds most of ``question``'s content words (each once; the first
    of equals); None when none holds any."""
    asked = set(content_words(question))
    best, most = None, 0
    for start, end in sentence_spans(text):
        n = len(asked.intersection(content_words(text[start:end])))
        if n > most:
            best, most = (start, end), n
    return best
