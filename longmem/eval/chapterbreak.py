"""Suite 2, suffix identification, ChapterBreak-style (paper table 4).

An item is a held-out book read up to a chapter break (``longmem.text.chapters``): the model sees the last P tokens
before the break (P = 4k, 6k, 8k) and must tell the true opening of the next chapter from ``negatives`` openings of
later chapters of the same book (headings removed, so chapter numbers give nothing away). Each candidate's first
``suffix_tokens`` tokens are scored by mean log-probability (lowest perplexity wins, the paper's rule); accuracy is
the share of items where the true opening wins (chance: 1 / (negatives + 1)). A second table ranks candidates by what
the prefix adds: the mean log-probability after the prefix minus after a context of only the prefix's last
``NEUTRAL`` tokens (a line break), so an opening that is likely anywhere (dialogue, short common words) does not win
for that alone.

Every model keeps the prefix's end in its window (the last window - ``suffix_tokens`` tokens: 1k models lose the
rest, the 8k backbone keeps nearly all of it) and LongMem holds the rest of the prefix in memory.

Candidates
----------
A candidate suffix is the first ``suffix_words`` words of a chapter's text, without its heading or title (so neither
the chapter number nor its title gives the answer away), never running into the next chapter. ``[Illustration...]``
markers are removed and the words are joined with single spaces (line breaks and indentation of the book dropped),
the same for the true suffix and the negatives, so formatting says nothing about which is which. A chapter whose
text has fewer than `MIN_SUFFIX_WORDS` words is used neither as a true suffix nor as a negative. The prefix
``text[:prefix_end]`` is the book verbatim from its first character (front matter included) and ends with the
blank lines before the heading. Negatives follow the true suffix in the order drawn.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import numpy as np

from longmem.eval.core import Entrant, EvalContext, SuiteResult, Timer, figure, table, versus
from longmem.eval.datasets.books import book_split
from longmem.eval.scoring import Prefix
from longmem.text.chapters import ILLUSTRATION, find_chapters, text_end
from longmem.text.io import read_text


@dataclass
class Size:
    prefixes: list[int] = field(default_factory=lambda: [4096, 6144, 8192])  # P: prefix tokens before the break
    items: int = 30  # chapter breaks, drawn at random from the held-out books' (0 = all)
    negatives: int = 5  # later chapters' openings per item
    suffix_tokens: int = 128  # tokens of each candidate scored


NEUTRAL = 2  # tokens of the prefix's end kept for the no-prefix score (the blank line before the heading)
MIN_SUFFIX_WORDS = 20  # a chapter with fewer words of text is never a candidate (true suffix or negative)
QUICK = Size(prefixes=[2048], items=1, negatives=2, suffix_tokens=48)
FULL = Size()


@dataclass(frozen=True)
class SuffixItem:
    """One suffix-identification question: which candidate continues ``text[:prefix_end]``? (The first does.)"""

    book: str  # a name given by the caller (e.g. file name)
    chapter: int  # index of the chapter whose opening is the true suffix (>= 1)
    prefix_end: int  # char offset: the prefix is text[:prefix_end] (ends where that chapter's heading starts)
    candidates: list[str]  # suffix texts, the true one first: the first words of a chapter's text, heading excluded
    candidate_chapters: list[int]  # chapter index of each candidate ([0] == chapter; the rest are > chapter, distinct)


def suffix_items(name: str, text: str, n_negatives: int = 5, suffix_words: int = 150,
                 min_prefix_chars: int = 0, rng: random.Random | None = None) -> list[SuffixItem]:
    """One item per chapter break that has >= n_negatives later chapters (negatives drawn at random without
    replacement among later chapters, by rng; deterministic for a seeded rng) and at least min_prefix_chars of text
    before it.

    Chapters whose text has fewer than `MIN_SUFFIX_WORDS` words are neither true suffixes nor negatives; a shorter
    chapter than ``suffix_words`` words gives all it has. ``rng`` defaults to ``random.Random(0)``, so the set is
    the same from run to run. A book without chapters, or with too few, gives [].
    """
    if n_negatives < 0 or suffix_words < 1:
        raise ValueError(f"need n_negatives >= 0 and suffix_words >= 1, got {n_negatives} and {suffix_words}")
    rng = rng if rng is not None else random.Random(0)
    chapters = find_chapters(text)
    ends = [c.start for c in chapters[1:]] + [text_end(text)]
    words = [ILLUSTRATION.sub(" ", text[c.body_start:end]).split() for c, end in zip(chapters, ends)]
    openings = [" ".join(w[:suffix_words]) for w in words]
    usable = [len(w) >= MIN_SUFFIX_WORDS for w in words]
    items = []
    for i in range(1, len(chapters)):
        if not usable[i] or chapters[i].start < min_prefix_chars:
            continue
        later = [j for j in range(i + 1, len(chapters)) if usable[j]]
        if len(later) < n_negatives:
            continue
        order = [i] + rng.sample(later, n_negatives)
        items.append(SuffixItem(name, i, chapters[i].start, [openings[j] for j in order], order))
    return items


@dataclass
class Item:
    source: SuffixItem
    prefix: np.ndarray  # (T,) token ids of the book before the break
    candidates: list[list[int]]  # token ids, the true opening first


def build_items(ctx: EvalContext, size: Size) -> list[Item]:
    """Items of every held-out book with a prefix of at least the longest P tokens, ``size.items`` of them drawn
    at random (by the run's seed)."""
    tok = ctx.tokenizer
    _, test = book_split(ctx.data_dir)
    out = []
    for path in test:
        text = read_text(path)
        found = suffix_items(path.name, text, n_negatives=size.negatives, rng=random.Random(ctx.seed))
        if not found:
            continue
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, ends = np.asarray(enc["input_ids"], dtype=np.int64), np.asarray([e for _, e in enc["offset_mapping"]])
        for it in found:
            n = int(np.searchsorted(ends, it.prefix_end, side="right"))  # tokens that end before the break
            if n < max(size.prefixes):
                continue
            cands = [tok(c, add_special_tokens=False).input_ids[: size.suffix_tokens] for c in it.candidates]
            out.append(Item(it, ids[:n], cands))
    if not out:
        raise ValueError(f"no chapter break in the held-out books has {max(size.prefixes):,} tokens before it and "
                         f"{size.negatives} later chapters")
    if size.items and size.items < len(out):
        out = random.Random(ctx.seed).sample(out, size.items)
    return out


def neutral_scores(entrant: Entrant, item: Item) -> list[float]:
    """Each candidate's mean log-probability after only the prefix's last ``NEUTRAL`` tokens, without memory."""
    state = Prefix.read(entrant.lm, item.prefix[-NEUTRAL:], None)
    return [float(state.logprobs(c).mean()) for c in item.candidates]


def choose(entrant: Entrant, item: Item, prefix_tokens: int, suffix_tokens: int) -> tuple[int, list[float]]:
    """(index of the candidate with the highest mean log-probability, each candidate's mean log-probability)."""
    lm = entrant.lm
    prefix = item.prefix[-prefix_tokens:]
    keep = lm.segment_len - suffix_tokens
    memory = None
    if lm.uses_memory:
        memory = lm.new_memory(capacity=None)
        if len(prefix) > keep:
            lm.memorize(prefix[:-keep], memory)
    state = Prefix.read(lm, prefix[-keep:], memory)
    scores = [float(state.logprobs(c).mean()) for c in item.candidates]
    return int(np.argmax(scores)), scores


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("chapterbreak", QUICK, FULL)
    timer = Timer()
    items = build_items(ctx, size)
    results: dict = {e.key: {} for e in ctx.entrants}
    gains: dict = {e.key: {} for e in ctx.entrants}
    for e in ctx.entrants:
        neutral = [neutral_scores(e, it) for it in items]
        for p in size.prefixes:
            picks = [choose(e, it, p, size.suffix_tokens) for it in items]
            right = [i == 0 for i, _ in picks]
            results[e.key][str(p)] = {"accuracy": sum(right) / len(right), "right": right,
                                      "scores": [s for _, s in picks], "neutral": neutral}
            gain = [int(np.argmax(np.subtract(s, n))) == 0 for (_, s), n in zip(picks, neutral)]
            gains[e.key][str(p)] = {"accuracy": sum(gain) / len(gain), "right": gain}
            ctx.log(f"chapterbreak P={p}, {e.key}: {sum(right)}/{len(right)} by perplexity, {sum(gain)}/{len(gain)} "
                    "by gain over no prefix")
    header = ["model"] + [f"prefix {p // 1024}k" if p % 1024 == 0 else f"prefix {p:,}" for p in size.prefixes]
    rows = [[e.label] + [f"{100 * results[e.key][str(p)]['accuracy']:.1f}" for p in size.prefixes]
            for e in ctx.entrants]
    gain_rows = [[e.label] + [f"{100 * gains[e.key][str(p)]['accuracy']:.1f}" for p in size.prefixes]
                 for e in ctx.entrants]
    chance = 100 / (size.negatives + 1)
    books = sorted({it.source.book for it in items})
    notes = [f"By perplexity: {_verdict(results, size.prefixes)} By gain: {_verdict(gains, size.prefixes)}",
             f"{len(items)} chapter breaks from {len(books)} held-out books ({', '.join(books)}); chance is "
             f"{chance:.1f}%."]
    plot = _plot(ctx, size.prefixes, results, gains, chance)
    return SuiteResult("chapterbreak", "Suffix identification, ChapterBreak-style (paper table 4): accuracy %",
                       [f"**By perplexity (the paper's rule)**\n\n{table(header, rows)}",
                        f"**By gain over no prefix**\n\n{table(header, gain_rows)}"],
                       {"results": results, "gain": gains, "items": [
                           {"book": it.source.book, "chapter": it.source.chapter,
                            "candidate_chapters": it.source.candidate_chapters} for it in items],
                        "models": {e.key: e.label for e in ctx.entrants}}, asdict(size), [plot], notes,
                       timer.seconds)


def _verdict(results: dict, prefixes: list[int]) -> str:
    by_prefix = {k: {f"prefix {p:,}": r[str(p)] for p in prefixes} for k, r in results.items()}
    return versus(by_prefix, lambda r: r["accuracy"], False)


def _plot(ctx: EvalContext, prefixes: list[int], results: dict, gains: dict, chance: float) -> str:
    fig = figure(6.0, 3.6)
    ax = fig.add_subplot()
    for e in ctx.entrants:
        line, = ax.plot(prefixes, [100 * results[e.key][str(p)]["accuracy"] for p in prefixes], marker="o",
                        label=f"{e.label}, by perplexity")
        ax.plot(prefixes, [100 * gains[e.key][str(p)]["accuracy"] for p in prefixes], marker="s", ls="--",
                color=line.get_color(), label=f"{e.label}, by gain")
    ax.axhline(chance, color="gray", lw=0.8, ls="--", label="chance")
    ax.set_xlabel("prefix tokens before the chapter break")
    ax.set_ylabel("accuracy %")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "chapterbreak.png")
    return "chapterbreak.png"
