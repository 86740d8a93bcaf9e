"""SQuAD v1.1 for open-ended in-context learning: reading the data, building prompts, splitting, scoring.

The LongMem paper (table 6) evaluates open-ended in-context learning on SQuAD: the model sees a few solved
demonstrations in its prompt, many more sit in its long-term memory bank, and it must generate the answer to a new
question. Each demonstration is written with the paper's template

    Passage: {passage}
     Question: {question} Answer: {answer}

(a newline, then a space, before "Question"), and a test item is the same text cut just before the answer, so the
model continues with " answer" (the leading space belongs to the answer's first BPE token).

This module is the data and scoring half of that experiment, with no model in it:

* `read_squad` reads an official SQuAD v1.1 file (e.g. ``dev-v1.1.json``: 48 articles, 10,570 questions) into flat
  `QA` records, refusing malformed files with a message that names the file and the place.
* `format_demo` / `format_prompt` render the template.
* `split_squad` draws the in-prompt demonstrations, the memory demonstrations and the test questions. Test questions
  never share a passage with any demonstration: otherwise the memory could hold the test passage verbatim and the
  task would turn into retrieval of the answer span, which is not what the paper measures.
* `normalize_answer`, `exact_match` and `f1` follow the official SQuAD v1.1 evaluation script exactly, so numbers are
  comparable with the paper; `answer_from_generation` cuts a free-running greedy generation down to the answer.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

TEMPLATE = "Passage: {passage}\n Question: {question} Answer: {answer}"


# --------------------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class QA:
    """One SQuAD question with its passage, as in the file (text is kept verbatim)."""

    id: str
    title: str  # the Wikipedia article's title, e.g. "Super_Bowl_50"
    passage: str  # the paragraph the question is about ("context" in the file)
    question: str
    answers: tuple[str, ...]  # all gold answer texts, deduplicated, in file order; never empty


def read_squad(path: str | os.PathLike[str]) -> list[QA]:
    """Read a SQuAD v1.1 JSON file into one `QA` per question, in file order.

    Raises FileNotFoundError when there is no such file, and ValueError naming the file (and, for a shape error, the
    place in it, e.g. ``data[3].paragraphs[0].qas[2]``) when it is not UTF-8 JSON, is not SQuAD v1.1-shaped (a
    ``data`` list of articles with ``title`` and ``paragraphs``, each paragraph with ``context`` and ``qas``, each
    question with ``id``, ``question`` and at least one ``answers[].text``), repeats a question id, or holds no
    questions at all. SQuAD v2.0 files fail on their first unanswerable question (it has no answers).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a UTF-8 text file ({e.reason} at byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e

    qas: list[QA] = []
    seen: set[str] = set()
    articles = _field(raw, "data", list, p, "the top level")
    for i, article in enumerate(articles):
        where = f"data[{i}]"
        title = _field(article, "title", str, p, where)
        for j, paragraph in enumerate(_field(article, "paragraphs", list, p, where)):
            pwhere = f"{where}.paragraphs[{j}]"
            passage = _field(paragraph, "context", str, p, pwhere)
            for k, q in enumerate(_field(paragraph, "qas", list, p, pwhere)):
                qwhere = f"{pwhere}.qas[{k}]"
                qid = _field(q, "id", str, p, qwhere)
                question = _field(q, "question", str, p, qwhere)
                answers = _field(q, "answers", list, p, qwhere)
                texts = [_field(a, "text", str, p, f"{qwhere}.answers[{n}]") for n, a in enumerate(answers)]
                if not texts:
                    raise ValueError(f"{p}: {qwhere} (id {qid!r}) has no answers; SQuAD v1.1 questions all have one "
                                     "(unanswerable SQuAD v2.0 questions are not supported)")
                if qid in seen:
                    raise ValueError(f"{p}: {qwhere}: question id {qid!r} appears more than once")
                seen.add(qid)
                qas.append(QA(qid, title, passage, question, tuple(dict.fromkeys(texts))))
    if not qas:
        raise ValueError(f"{p}: the file holds no questions")
    return qas


def _field(obj: Any, key: str, kind: type, path: Path, where: str) -> Any:
    """`obj[key]`, checked to be a JSON object holding `key` of type `kind`, else a ValueError saying where."""
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not a SQuAD v1.1 file: {where} should be a JSON object, "
                         f"found {type(obj).__name__}")
    if key not in obj:
        raise ValueError(f"{path}: not a SQuAD v1.1 file: {where} has no {key!r} field")
    value = obj[key]
    if not isinstance(value, kind):
        raise ValueError(f"{path}: not a SQuAD v1.1 file: {where}.{key} should be a {_JSON_NAMES[kind]}, "
                         f"found {type(value).__name__}")
    return value


_JSON_NAMES = {list: "list", str: "string", dict: "object"}


# ------------------------------------------------------------------------------------------------------ prompts


def format_demo(qa: QA, template: str = TEMPLATE) -> str:
    """A solved demonstration: the template filled in with the passage, the question and the first gold answer.

    Whitespace runs in the fields (a few SQuAD passages hold newlines, some questions end in spaces) become single
    spaces, so the template alone decides the line structure and a demonstration never contains a stray newline.
    """
    return template.format(passage=_clean(qa.passage), question=_clean(qa.question), answer=_clean(qa.answers[0]))


def format_prompt(qa: QA, template: str = TEMPLATE) -> str:
    """A test item: the template filled in up to ``{answer}``, trailing whitespace stripped.

    With the default template this ends in "Answer:"; the model is expected to continue with " answer", the space
    belonging to the answer's first token as in BPE vocabularies. So ``format_demo(qa)`` is
    ``format_prompt(qa) + " " + answer`` for the default template.
    """
    marker = "\x00answer\x00"  # formatted in and cut at, so escaped braces and braces in the fields are harmless
    full = template.format(passage=_clean(qa.passage), question=_clean(qa.question), answer=marker)
    if full.count(marker) != 1:
        raise ValueError(f"the template must contain {{answer}} exactly once: {template!r}")
    return full[: full.index(marker)].rstrip()


def _clean(text: str) -> str:
    """Collapse every whitespace run (newlines included) to one space and strip the ends."""
    return " ".join(text.split())


# -------------------------------------------------------------------------------------------------------- split


@dataclass
class SquadSplit:
    """Questions for one in-context learning run; the three lists are disjoint."""

    context: list[QA]  # demonstrations in the prompt
    memory: list[QA]  # demonstrations for the memory bank
    test: list[QA]  # questions to answer; none shares a passage with a demonstration


def split_squad(qas: list[QA], n_context: int, n_memory: int, n_test: int, seed: int) -> SquadSplit:
    """Draw `n_context` prompt demonstrations, `n_memory` memory demonstrations and `n_test` test questions.

    Passages (identified by their text) are shuffled with `seed`. The first ``n_context + n_memory`` passages each
    give one demonstration, a question drawn at random from that passage, so the demonstrations cover as many
    passages as possible and the memory does not hold many copies of one paragraph. The test questions are drawn at
    random from all questions of the remaining passages, so no test question shares its passage with any
    demonstration (otherwise the memory could hold the answer's passage verbatim, which is a different task).

    The same `qas` (in the same order) and `seed` always give the same split. Raises ValueError, with the numbers,
    when a count is negative, when there are fewer passages than demonstrations, or when the passages left over hold
    fewer than `n_test` questions.
    """
    for name, n in (("n_context", n_context), ("n_memory", n_memory), ("n_test", n_test)):
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    by_passage: dict[str, list[QA]] = {}
    for qa in qas:
        by_passage.setdefault(qa.passage, []).append(qa)
    passages = list(by_passage.values())  # first-appearance order, so only `qas` and `seed` decide the split
    rng = random.Random(seed)
    rng.shuffle(passages)

    n_demos = n_context + n_memory
    if len(passages) < n_demos:
        raise ValueError(f"not enough SQuAD passages: {n_context} context + {n_memory} memory demonstrations need "
                         f"{n_demos} distinct passages (one demonstration each), but the {len(qas)} questions have "
                         f"only {len(passages)}")
    demos = [rng.choice(group) for group in passages[:n_demos]]
    pool = [qa for group in passages[n_demos:] for qa in group]
    if len(pool) < n_test:
        raise ValueError(f"not enough SQuAD questions: {n_test} test questions wanted, but after taking {n_demos} "
                         f"demonstration passages the other {len(passages) - n_demos} passages hold only "
                         f"{len(pool)} questions ({len(qas)} questions in {len(passages)} passages in all)")
    return SquadSplit(context=demos[:n_context], memory=demos[n_context:], test=rng.sample(pool, n_test))


# ------------------------------------------------------------------------------------------------------ scoring


def normalize_answer(s: str) -> str:
    """The official SQuAD v1.1 normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the (as
    whole words), and collapse whitespace to single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer, else 0.0 (official v1.1)."""
    _check_golds(golds)
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in golds))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-level F1 between the normalised prediction and the best-matching gold answer (official v1.1).

    Tokens are the whitespace-separated words after normalisation; overlap counts repeated words as often as both
    sides have them. No overlap scores 0.0, which includes an empty prediction (and, as in the official v1.1 script,
    an empty prediction against a gold answer that normalises to nothing).
    """
    _check_golds(golds)
    return max(_f1_one(prediction, gold) for gold in golds)


def _f1_one(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _check_golds(golds: Sequence[str]) -> None:
    if isinstance(golds, str):
        raise TypeError("golds must be a sequence of answer strings, not one string")
    if len(golds) == 0:
        raise ValueError("no gold answers to score against")


def answer_from_generation(text: str) -> str:
    """Cut a greedy continuation of `format_prompt` down to the answer.

    The answer ends at the first newline, or where the model starts a new demonstration ("Passage:" or "Question:"),
    whichever comes first; surrounding whitespace is stripped.
    """
    end = len(text)
    for stop in ("\n", "Passage:", "Question:"):
        i = text.find(stop)
        if i != -1:
            end = min(end, i)
    return text[:end].strip()
