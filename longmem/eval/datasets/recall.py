"""Synthetic long-range recall documents: a fact stated once inside book text, asked about much later.

An item reads like a book with one extra sentence ("The code to the old safe is 4817.") spliced in early, at least
``distance`` tokens of the book after it, then a question whose answer restates the fact up to its value, as in the
passkey-retrieval tests ("\\n\\nQuestion: What is the code to the old safe? Answer: The code to the old safe is"),
and the value (" 4817"). The restated prefix makes the item a test of recall, not of question answering: with the
fact inside its window, the 135M backbone completes most such items (``training.evaluate`` reports it), but next to
none when the value must follow "Answer:" directly. With ``distance`` beyond the local context window, only a model
that reads its memory can answer: used in moderation as training documents, and as an evaluation of long-range
recall.

Quote documents (``make_quote_document``) are the dense form of the same lesson: book text whose own passages are
quoted again a segment or more later, so that most tokens of a quote can only be predicted well from memory.

The book text is never re-tokenized: the sentence, question and answer are tokenized on their own
(add_special_tokens=False) and their ids spliced into the filler ids, so ``answer_start`` is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from longmem.eval.datasets.books import Document

# (fact sentence with {} for the value, question) -- the sentence starts with a space: it follows a sentence's end
NUMBER_FACTS = [
    (" The code to the old safe is {}.", "What is the code to the old safe?"),
    (" The number painted on the lighthouse door was {}.", "What was the number painted on the lighthouse door?"),
    (" The combination of the captain's sea chest is {}.", "What is the combination of the captain's sea chest?"),
    (" The ticket for the night train was numbered {}.", "What number was on the ticket for the night train?"),
    (" The room they took at the harbour inn was number {}.", "What was the number of the room at the harbour inn?"),
    (" The year carved above the chapel gate was {}.", "What year was carved above the chapel gate?"),
    (" The account at the county bank was number {}.", "What was the number of the account at the county bank?"),
    (" The password for the cellar door was {}.", "What was the password for the cellar door?"),
    (" The parcel from London was marked with the number {}.", "What number was the parcel from London marked with?"),
    (" The telephone number of the old mill was {}.", "What was the telephone number of the old mill?"),
]
NAME_FACTS = [
    (" The lighthouse keeper was called {}.", "What was the lighthouse keeper called?"),
    (" The new doctor in the village was named {}.", "What was the name of the new doctor in the village?"),
    (" The captain of the ship was a sailor named {}.", "What was the name of the captain of the ship?"),
    (" The man who sold the farm was called {}.", "What was the man who sold the farm called?"),
    (" The anonymous letter was written by {}.", "Who wrote the anonymous letter?"),
    (" The girl who found the brass key was called {}.", "What was the girl who found the brass key called?"),
    (" The owner of the blue carriage was {}.", "Who was the owner of the blue carriage?"),
    (" The schoolmaster's name was {}.", "What was the schoolmaster's name?"),
    (" The stranger at the station gave his name as {}.", "What name did the stranger at the station give?"),
    (" The painter of the portrait in the hall was {}.", "Who painted the portrait in the hall?"),
]
# Names come from two disjoint pools: training documents draw from "train", evaluation items from "eval", so a
# recalled name was copied from memory, never learnt as a likely answer. Evaluation pairs a random first name with a
# random last name from the lists below. Training names come from no list a model could learn: a SideNet trained on
# a 16 x 16 list answered chat questions with its names, and one trained on a 48 x 48 list (half its names; the
# other half made up) answered unseen-name questions with ' Cornelius', a name of that list, while its memory
# attention sat on the right name (``python -m training.studies.probe --answers``). So a training name is two words,
# each made up from syllables (``_made_up``) or, half the time when the tokenizer has them, one of its thousands of
# capitalized whole-word tokens (``name_words``): copying from memory is the only way to predict it.
POOLS = ("train", "eval")
EVAL_NAMES = (  # the evaluation pool: (first names, last names); "train" names are generated, see ``_value``
    ["Agatha", "Benedict", "Cordelia", "Dominic", "Evangeline", "Frederick", "Georgiana", "Hugo", "Imogen",
     "Julian", "Lavinia", "Mortimer", "Neville", "Ophelia", "Peregrine", "Rupert", "Seraphina", "Thaddeus",
     "Ursula", "Vivian", "Wendell", "Araminta", "Bertram", "Celestine", "Drusilla", "Edmund", "Felicity", "Gideon",
     "Honoria", "Ignatius", "Juliana", "Lysander"],
    ["Aldridge", "Brightwater", "Calloway", "Dervish", "Everhart", "Fontaine", "Goldsworthy", "Halloran",
     "Ishikawa", "Jarrow", "Kincaid", "Loxley", "Marchetti", "Nightingale", "Ostrowski", "Pemberton", "Radcliffe",
     "Silvermane", "Tanaka", "Umberfield", "Vanderberg", "Winterbourne", "Abberley", "Blakemore", "Crawshaw",
     "Dellacourt", "Elphinstone", "Featherstone", "Gwynedd", "Hawthorne", "Ingleby", "Jessop"])
SENTENCE_ENDS = (".", "!", "?")  # not closing quotes: speech often goes on ('..." he said')
QUESTION = "\n\nQuestion: {} Answer: {}"  # the question, then the fact sentence up to its value


@dataclass
class RecallItem:
    ids: np.ndarray  # (T,) int32: filler ... fact sentence ... filler (>= distance tokens) ... question + answer
    answer_start: int  # index in ids where the answer tokens begin (the answer ends the document)
    answer: str  # e.g. "4817" or "Marguerite Okafor"
    fact_pos: int  # token index where the fact sentence starts
    answer_pos: int  # token index of the answer's first token inside the fact sentence (fact_pos if not found)
    kind: str  # "number" or "name"


def _encode(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)


def _sentence_end(tokenizer, window: np.ndarray, p: int) -> bool:
    """Whether a sentence ends just before window[p] (0 < p < len(window)): window[p-1] ends in . ! or ? and
    window[p] starts with a space, so not inside "3.14" (but "Mr. Smith" passes: sentence-ish)."""
    before, after = tokenizer.decode([int(window[p - 1])]), tokenizer.decode([int(window[p])])
    return before.endswith(SENTENCE_ENDS) and after[:1].isspace()


def _boundary(tokenizer, window: np.ndarray, target: int, lo: int, hi: int) -> int:
    """A position p in [lo, hi] close to target (first forward, then backward) where a sentence ends before
    window[p]; target itself if there is none."""
    for p in [*range(target, hi + 1), *range(target - 1, lo - 1, -1)]:
        if 0 < p < len(window) and _sentence_end(tokenizer, window, p):
            return p
    return target


def make_recall_item(tokenizer, filler: np.ndarray, rng: np.random.Generator, distance: int, total: int | None = None,
                     kind: str | None = None, names: str = "eval", words: list[str] = ()) -> RecallItem:
    """One recall item of exactly ``total`` tokens from a random window of ``filler`` (book token ids).

    The fact sentence goes at a sentence end (a filler token ending in . ! or ?, followed by a space) near a random
    point 5-20% into the item, with at least ``distance`` filler tokens after it; the question and answer
    close the item. Facts are 4-digit numbers or names (first and last name drawn at random from the ``names``
    pool, "eval" or "train"), ``kind`` "number" or "name" (None: either, at random). With total=None the item is
    just long enough for ``distance`` plus about a fifth of itself before the fact."""
    kind = kind if kind is not None else str(rng.choice(["number", "name"]))
    if kind not in ("number", "name"):
        raise ValueError(f"kind must be 'number', 'name' or None, got {kind!r}")
    facts = NUMBER_FACTS if kind == "number" else NAME_FACTS
    sentence, question = facts[rng.integers(len(facts))]
    answer = _value(rng, kind, names, words)
    fact = _encode(tokenizer, sentence.format(answer))  # (F,)
    ask = _encode(tokenizer, _question(sentence, question))  # (Q,)
    ans = _encode(tokenizer, " " + answer)  # (A,)
    extra = len(fact) + len(ask) + len(ans)
    if total is None:
        total = int((distance + extra) / 0.8) + 1
    n_filler = total - extra
    if distance < 0 or n_filler < distance:
        raise ValueError(f"total={total} tokens cannot hold distance={distance} filler tokens plus the fact, question "
                         f"and answer ({extra} tokens)")
    if len(filler) < n_filler:
        raise ValueError(f"the filler has {len(filler)} tokens, the item needs {n_filler}")

    start = int(rng.integers(0, len(filler) - n_filler + 1))
    window = np.asarray(filler[start:start + n_filler], dtype=np.int32)  # (n_filler,)
    most = n_filler - distance  # the fact may start at most here and still have `distance` tokens after it
    lo, hi = min(int(0.05 * total), most), min(int(0.2 * total), most)
    pre = _boundary(tokenizer, window, int(rng.integers(lo, hi + 1)), 0, most)

    ids = np.concatenate([window[:pre], fact, window[pre:], ask, ans])  # (total,)
    return RecallItem(ids=ids, answer_start=len(ids) - len(ans), answer=answer, fact_pos=pre,
                      answer_pos=pre + _find(fact, ans), kind=kind)


_TEMPLATE_TURN = re.compile(r"(^|\n|[.!?\"”]\s)\s*(Question|Answer)\s*:", re.IGNORECASE)


def template_wording(answer: str) -> str | None:
    """The training template an answer writes, if any: a "Question:" or "Answer:" turn of the recall items'
    format, or a fact sentence's or question's wording of ``NUMBER_FACTS`` / ``NAME_FACTS`` (the part before the
    value). None when it writes none. (A model trained on these items may write them instead of answering.)"""
    if (m := _TEMPLATE_TURN.search(answer)) is not None:
        return m.group(2) + ":"
    text = " ".join(answer.lower().split())
    for wording in _WORDINGS:
        if wording in text:
            return wording
    return None


def _wordings() -> list[str]:
    """The fact sentences (up to the value) and questions of the recall items, lower case, each also with "is" and
    "was" swapped (an answer may change the tense)."""
    out = []
    for sentence, question in NUMBER_FACTS + NAME_FACTS:
        for w in (sentence.split("{}")[0].strip().rstrip(" ,").lower(), question.lower().rstrip("?")):
            out += [w, re.sub(r"\bwas\b", "is", w), re.sub(r"\bis\b", "was", w)]
    return list(dict.fromkeys(out))


_WORDINGS = _wordings()


def _question(sentence: str, question: str) -> str:
    """The question and the start of its answer: the fact sentence up to the value, without its leading space."""
    return QUESTION.format(question, sentence.split("{}")[0].strip())


ONSETS = ["b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "pr", "r", "s", "sh",
          "st", "t", "th", "tr", "v", "w", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
CODAS = ["", "", "", "n", "r", "l", "s", "m", "nd", "rt", "ck", "th"]


def _made_up(rng: np.random.Generator) -> str:
    """A pronounceable made-up name of 2-3 syllables, e.g. "Dravemon"."""
    pick = lambda options: options[rng.integers(len(options))]  # noqa: E731
    return "".join(pick(ONSETS) + pick(VOWELS) + pick(CODAS) for _ in range(int(rng.integers(2, 4)))).capitalize()


def name_word(piece: str) -> str:
    """The word a vocabulary piece spells if it is a capitalized whole word with a leading space (" Wolf",
    " National": at least 4 letters, the rest lower-case), the stuff names are made of; else ""."""
    word = piece[1:] if piece[:1] in ("\u0120", "\u2581") else ""  # byte-level BPE / SentencePiece space marks
    ok = len(word) >= 4 and word[0].isupper() and word[1:].isalpha() and word[1:].islower()
    return word if ok else ""


def name_words(tokenizer, taboo: tuple[list[str], ...] = EVAL_NAMES) -> list[str]:
    """The ``name_word`` tokens of ``tokenizer``, none a name of the ``taboo`` lists nor the first token of one:
    training name parts that no model can learn as a prior (thousands of them for a BPE vocabulary; none for a
    character tokenizer)."""
    banned = {w for names in taboo for w in names}
    banned |= {tokenizer.decode(_encode(tokenizer, " " + w)[:1]).strip() for w in banned}
    words = {name_word(p) for p in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))}
    return sorted(words - banned - {""})


def _value(rng: np.random.Generator, kind: str, names: str, words: list[str] = ()) -> str:
    """A fact's value: a 4-digit number, or a name from the ``names`` pool ("eval": the evaluation lists; "train":
    two words, each made up or, half the time when there are ``words``, one of them)."""
    if names not in POOLS:
        raise ValueError(f"names must be one of {POOLS}, got {names!r}")
    if kind == "number":
        return str(rng.integers(1000, 10000))
    if names == "train":
        return f"{_train_word(rng, words)} {_train_word(rng, words)}"
    first, last = EVAL_NAMES
    return f"{first[rng.integers(len(first))]} {last[rng.integers(len(last))]}"


def _train_word(rng: np.random.Generator, words: list[str]) -> str:
    """Half of a training name: one of ``words`` half the time (when there are any), else made up."""
    return words[rng.integers(len(words))] if len(words) and rng.random() < 0.5 else _made_up(rng)


def make_multi_recall_document(tokenizer, filler: np.ndarray, rng: np.random.Generator, n_facts: int, distance: int,
                               total: int, names: str = "train",
                               words: list[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """A training document of exactly ``total`` tokens, as (ids int32, answers bool marking the answer tokens),
    that teaches ``n_facts`` recalls at once: that many facts (distinct templates, so every question has one
    answer) spliced in at sentence ends of a random filler window, and for each, later in the text, its question
    and answer ("\n\nQuestion: ... Answer: The code ... is 4817\n\n") at a sentence end at least ``distance``
    tokens after the fact. A single-fact item spends a whole long document on one answer; this one gives the loss
    ``n_facts`` answers that only memory can supply, spread over its segments. ``words``: see ``_value``."""
    templates = [(s, q, "number") for s, q in NUMBER_FACTS] + [(s, q, "name") for s, q in NAME_FACTS]
    if not 1 <= n_facts <= len(templates):
        raise ValueError(f"n_facts must be in [1, {len(templates)}], got {n_facts}")
    chosen = [templates[i] for i in rng.choice(len(templates), size=n_facts, replace=False)]
    values = [_value(rng, kind, names, words) for _, _, kind in chosen]
    facts = [_encode(tokenizer, s.format(v)) for (s, _, _), v in zip(chosen, values)]
    parts = [(_encode(tokenizer, _question(s, q)), _encode(tokenizer, " " + v), _encode(tokenizer, "\n\n"))
             for (s, q, _), v in zip(chosen, values)]
    qa = [np.concatenate(p) for p in parts]
    qa_answers = [np.concatenate([np.zeros(len(a), bool), np.ones(len(v), bool), np.zeros(len(e), bool)])
                  for a, v, e in parts]
    n_filler = total - sum(len(x) for x in facts + qa)
    most = n_filler - distance  # a fact may start at most here and still have `distance` filler tokens after it
    if most < n_facts:
        raise ValueError(f"total={total} tokens cannot hold {n_facts} facts each {distance} tokens before its "
                         f"question ({sum(len(x) for x in facts + qa)} tokens of facts and questions)")
    window = _window(filler, rng, n_filler)
    events = []  # (position in the filler, kind, tokens, answers): facts (0) sort before questions (1) at one place
    for fact, ask, ask_answers in zip(facts, qa, qa_answers):
        at = _boundary(tokenizer, window, int(rng.integers(0, most + 1)), 0, most)
        events.append((at, 0, fact, np.zeros(len(fact), bool)))
        later = at + distance
        at_q = _boundary(tokenizer, window, int(rng.integers(later, n_filler + 1)), later, n_filler)
        events.append((at_q, 1, ask, ask_answers))
    return _splice(window, events)


def _window(filler: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """A random window of ``n`` tokens of ``filler`` (int32)."""
    if len(filler) < n:
        raise ValueError(f"the filler has {len(filler)} tokens, the document needs {n}")
    start = int(rng.integers(0, len(filler) - n + 1))
    return np.asarray(filler[start:start + n], dtype=np.int32)


def _splice(window: np.ndarray, events: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """``window`` with each event's tokens inserted before window[at], as (ids int32, answers bool). Events are
    (at, order, tokens, answers), inserted in (at, order) order; positions are the window's, before any insertion."""
    pieces, marks, prev = [], [], 0
    for at, _, tokens, answers in sorted(events, key=lambda e: (e[0], e[1])):
        pieces += [window[prev:at], tokens]
        marks += [np.zeros(at - prev, bool), answers]
        prev = at
    ids = np.concatenate(pieces + [window[prev:]]).astype(np.int32)
    return ids, np.concatenate(marks + [np.zeros(len(window) - prev, bool)])


def make_quote_document(tokenizer, filler: np.ndarray, rng: np.random.Generator, n_quotes: int, quote_len: int,
                        distance: int, total: int) -> np.ndarray:
    """A training document of exactly ``total`` tokens (int32 ids) of book text in which ``n_quotes`` passages of
    the text itself, ``quote_len`` tokens each, are quoted again at a sentence end at least ``distance`` tokens after
    they end. With ``distance`` >= the segment length a quote's first occurrence is in memory when it is quoted, so
    all but its first few tokens can be copied from there: tokens of every kind the books have, where a recall fact
    has a name's few tokens. ``python -m training.studies.probe --values`` found a read-out from memory names the
    token types it was fit on far better than others (``docs/runs/probe/README.md``); these documents fit it on the
    books' vocabulary."""
    n_filler = total - n_quotes * quote_len
    most = n_filler - distance - quote_len  # a quoted passage starts at most here and still ends `distance` early
    if n_quotes < 1 or quote_len < 1 or most < 0:
        raise ValueError(f"total={total} tokens cannot hold {n_quotes} quotes of {quote_len} tokens each quoted "
                         f"{distance} tokens after its passage")
    window = _window(filler, rng, n_filler)
    events = []
    for _ in range(n_quotes):
        s = int(rng.integers(0, most + 1))
        later = s + quote_len + distance
        at = _boundary(tokenizer, window, int(rng.integers(later, n_filler + 1)), later, n_filler)
        events.append((at, 0, window[s:s + quote_len].copy(), np.zeros(quote_len, bool)))
    return _splice(window, events)[0]


def _long_enough(filler_docs: list[np.ndarray], need: int, what: str) -> list[np.ndarray]:
    """The filler documents with at least ``need`` tokens; ValueError naming ``what`` needs them if there is none."""
    usable = [d for d in filler_docs if len(d) >= need]
    if not usable:
        raise ValueError(f"no filler document has the {need} tokens {what} needs "
                         f"(longest: {max((len(d) for d in filler_docs), default=0)})")
    return usable


def quote_documents(tokenizer, filler_docs: list[np.ndarray], n: int, n_quotes: int, quote_len: int, distance: int,
                    total: int, seed: int, prefix: str = "quote") -> list[Document]:
    """``n`` quote documents (``make_quote_document``) named "<prefix>-<i>", reproducible from ``seed``, from random
    filler documents long enough. Their quotes are not marked as answers: they are plain text to the loss."""
    rng = np.random.default_rng(seed)
    usable = _long_enough(filler_docs, total - n_quotes * quote_len, "a quote document")
    return [Document(f"{prefix}-{i}", make_quote_document(tokenizer, usable[rng.integers(len(usable))], rng, n_quotes,
                                                          quote_len, distance, total)) for i in range(n)]


def multi_recall_documents(tokenizer, filler_docs: list[np.ndarray], n: int, n_facts: int, distance: int,
                           total: int, seed: int, prefix: str = "recall", names: str = "train") -> list[Document]:
    """``n`` multi-fact training documents (``make_multi_recall_document``) named "<prefix>-<i>", reproducible from
    ``seed``, from random filler documents of at least ``total`` tokens."""
    rng = np.random.default_rng(seed)
    usable = _long_enough(filler_docs, total, "a recall document")
    words = name_words(tokenizer) if names == "train" else []
    return [Document(f"{prefix}-{i}", *make_multi_recall_document(tokenizer, usable[rng.integers(len(usable))], rng,
                                                                  n_facts, distance, total, names, words))
            for i in range(n)]


def _find(haystack: np.ndarray, needle: np.ndarray) -> int:
    """Index of ``needle`` (or, when the tokenizer merged its leading space differently, of ``needle`` without its
    first token) inside ``haystack``; 0 when neither occurs."""
    for pattern in (needle, needle[1:]):
        n = len(pattern)
        for i in range(len(haystack) - n + 1 if n else 0):
            if (haystack[i:i + n] == pattern).all():
                return i
    return 0


def recall_documents(tokenizer, filler_docs: list[np.ndarray], n: int, distance: int, total: int,
                     seed: int, names: str = "eval") -> list[RecallItem]:
    """``n`` recall items of ``total`` tokens, each from a random window of a random filler document (one with at
    least ``total`` tokens), reproducible from ``seed``. For training, make ``total`` a multiple of the segment
    length: the batchfier drops a document's last partial segment, which would hold the question and answer."""
    rng = np.random.default_rng(seed)
    usable = _long_enough(filler_docs, total, "a recall item")
    words = name_words(tokenizer) if names == "train" else []
    return [make_recall_item(tokenizer, usable[rng.integers(len(usable))], rng, distance, total, names=names,
                             words=words) for _ in range(n)]


def recall_as_documents(items: list[RecallItem], prefix: str = "recall") -> list[Document]:
    """Recall items as training documents named "<prefix>-<i>", their answer tokens marked."""
    return [Document(f"{prefix}-{i}", item.ids, np.arange(len(item.ids)) >= item.answer_start)
            for i, item in enumerate(items)]


@dataclass(frozen=True)
class FactPassage:
    """A fact stated inside a short excerpt of book text, and the question a reader would ask about it."""

    text: str  # the excerpt, cut at sentence ends, with the fact sentence at a sentence end inside it
    question: str  # e.g. "What is the code to the old safe?"
    answer: str  # the fact's value, e.g. "4817"
    kind: str  # "number" or "name"


def make_fact_passage(tokenizer, filler: np.ndarray, rng: np.random.Generator, n_tokens: int = 160,
                      kind: str | None = None) -> FactPassage:
    """One fact (a value from the evaluation pools, as in ``make_recall_item``) stated inside about ``n_tokens``
    tokens of ``filler`` (book token ids) taken at random, the excerpt starting and ending at sentence ends where
    its first and last thirds have one."""
    kind = kind if kind is not None else str(rng.choice(["number", "name"]))
    if kind not in ("number", "name"):
        raise ValueError(f"kind must be 'number', 'name' or None, got {kind!r}")
    if len(filler) < n_tokens or n_tokens < 6:
        raise ValueError(f"an excerpt of {n_tokens} tokens needs a filler at least that long (and >= 6 tokens)")
    facts = NUMBER_FACTS if kind == "number" else NAME_FACTS
    sentence, question = facts[rng.integers(len(facts))]
    answer = _value(rng, kind, "eval")
    start = int(rng.integers(0, len(filler) - n_tokens + 1))
    window = np.asarray(filler[start:start + n_tokens], dtype=np.int32)
    third = n_tokens // 3
    a = _boundary(tokenizer, window, 1, 1, third)  # after a sentence end (1: none found)
    b = _boundary(tokenizer, window, n_tokens - 1, n_tokens - third, n_tokens - 1)
    mid = _boundary(tokenizer, window, (a + b) // 2, a + 1, b - 1)
    text = tokenizer.decode(window[a:mid].tolist()) + sentence.format(answer) + tokenizer.decode(window[mid:b].tolist())
    return FactPassage(" ".join(text.split()), question, answer, kind)
