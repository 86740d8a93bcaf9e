"""A many-shot classifier (the paper's in-context learning with demonstrations in memory, section 4.3), how it is
saved, and how it labels a whole file.

``Classifier`` scores label words after a prompt of optional in-context demonstrations and the text, while many
more demonstrations sit in memory. The demonstrations in the prompt are fixed, or chosen for each text
(``longmem.tasks.demos``); scores may be calibrated against a content-free input (``calibrate``, Zhao et al. 2021).
``ClassifierSpec`` is what the app saves (as JSON) to rebuild a classifier over its bank; ``classify_rows`` labels a
whole file and ``write_predictions_csv`` writes the result.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from longmem.memory.memory import Memory
from longmem.model.lm import SegmentLM
from longmem.tasks.examples import Example, prompt_parts

Progress = Callable[[int, int], None]  # (done, total)


def calibrate(scores: dict[str, float], prior: dict[str, float]) -> dict[str, float]:
    """Contextual calibration (Zhao et al. 2021, "Calibrate before use"): each label's log-probability among the
    labels for the text, minus the same for a content-free input read after the same demonstrations (the model's
    prior for that label). The likeliest label then is argmax p(label | text) / p(label | content-free)."""
    def among_labels(s: dict[str, float]) -> dict[str, float]:
        top = max(s.values())
        log_total = top + math.log(sum(math.exp(v - top) for v in s.values()))
        return {w: v - log_total for w, v in s.items()}

    if set(scores) != set(prior):
        raise ValueError(f"calibration needs the same labels, got {sorted(scores)} and {sorted(prior)}")
    text, free = among_labels(scores), among_labels(prior)
    return {w: text[w] - free[w] for w in scores}


@dataclass
class Classifier:
    """Many-shot in-context classification: demonstrations ``template.format(text=..., label=word)`` sit in memory
    (thousands of them, far beyond the local window) and, optionally, a few more sit in the prompt itself: the fixed
    ``context`` (k-shot), or those ``choose`` picks for each text (e.g. the ones its memory finds,
    ``longmem.tasks.demos.DemoFinder.chooser``). A new text is scored against every label word,
    log P(word | "<demonstrations><separator><template up to {label}>", memory), and the likeliest word wins; with
    ``calibrate``, each score is first divided by the label's probability for ``content_free`` read after the same
    demonstrations (``calibrate``).

    When every label word is a single token after the template (BPE backbones: " positive"), all labels are scored
    from one forward pass; otherwise (e.g. a character tokenizer) each label word is scored with its own pass."""

    model: SegmentLM
    memory: Memory | None
    template: str  # e.g. "Review: {text} Sentiment: {label}", the demonstrations' template
    labels: list[str]  # the label words, as written in the demonstrations
    context: list[str] = field(default_factory=list)  # formatted demonstrations put in the prompt, before the text
    separator: str = "\n"  # joins the context's demonstrations and the text (the paper: newlines)
    choose: Callable[[str], list[str]] | None = None  # text -> formatted demonstrations for its prompt (not context)
    calibrate: bool = False  # divide by each label's probability for a content-free input (contextual calibration)
    content_free: str = "N/A"  # the content-free input (Zhao et al.'s)

    def __post_init__(self):
        if "{label}" not in self.template or "{text}" not in self.template.split("{label}")[0]:
            raise ValueError(f"template {self.template!r} needs {{text}} before {{label}}")
        if len(self.labels) < 2:
            raise ValueError(f"a classifier needs at least two labels, got {self.labels}")
        if len(set(self.labels)) != len(self.labels) or not all(w.strip() for w in self.labels):
            raise ValueError(f"the label words must be distinct and not blank, got {self.labels}")
        self.context = list(self.context)
        self._chosen: tuple[str, list[str]] | None = None  # the last text's demonstrations (``read`` then scores)

    @classmethod
    def from_documents(cls, model: SegmentLM, memory: Memory | None, documents: Iterable,
                       context: Sequence[str] = (), separator: str = "\n") -> "Classifier":
        """The template and label words of the demonstration sets stored in a bank (``storage.Document``s)."""
        demos = [d for d in documents if d.kind == "demos"]
        if not demos:
            raise ValueError("the bank holds no demonstrations (ingest a CSV/TSV/JSONL file of text,label rows)")
        templates = sorted({d.meta["template"] for d in demos})
        if len(templates) > 1:
            raise ValueError(f"the bank's demonstration sets use different templates: {templates}")
        words = sorted({w for d in demos for w in d.meta["label_counts"]})
        return cls(model, memory, templates[0], words, list(context), separator)

    def read(self, text: str) -> list[str]:
        """The formatted demonstrations the prompt for ``text`` holds, in prompt order: ``choose(text)``, else the
        fixed ``context``."""
        if not text.strip():
            raise ValueError("the text to classify is empty")
        if self.choose is None:
            return self.context
        if self._chosen is None or self._chosen[0] != text:
            self._chosen = (text, list(self.choose(text)))
        return self._chosen[1]

    def prompt(self, text: str) -> str:
        """What the model reads before a label word: the demonstrations (``read``), then the template up to {label}
        (without its trailing whitespace, which goes with the label word, as in the demonstrations' tokens)."""
        return self._parts(text, self.read(text))[0]

    def _parts(self, text: str, demos: list[str]) -> tuple[str, str, str]:
        """(prompt, the text's own prompt, whitespace between the prompt and a label word)."""
        if not text.strip():
            raise ValueError("the text to classify is empty")
        own, gap = prompt_parts(self.template, text)  # as the demonstrations were written
        head = self.separator.join(demos) + self.separator if demos else ""
        return head + own, own, gap

    def scores(self, text: str) -> dict[str, float]:
        """log P(label word | prompt, memory) for every label (calibrated: see ``calibrate``)."""
        demos = self.read(text)
        raw = self._scores(text, demos)
        return calibrate(raw, self._scores(self.content_free, demos)) if self.calibrate else raw

    def _scores(self, text: str, demos: list[str]) -> dict[str, float]:
        tok, window = self.model.backbone.tokenizer, self.model.segment_len
        prompt, own, gap = self._parts(text, demos)
        words = {w: tok(gap + w, add_special_tokens=False).input_ids for w in self.labels}
        longest = max(len(ids) for ids in words.values())
        n_own = len(tok(own, add_special_tokens=False).input_ids)
        if n_own + longest > window:
            raise ValueError(f"the text is too long to classify: its prompt takes {n_own} tokens and the longest "
                             f"label word {longest}, more than the model's {window}-token window")
        ids = tok(prompt, add_special_tokens=False).input_ids  # longer than the window: model.score keeps its end
        if longest == 1:
            return self._scores_one_pass(ids, {w: t[0] for w, t in words.items()})
        return {w: self.model.score(ids, t, self.memory) for w, t in words.items()}

    @torch.no_grad()
    def _scores_one_pass(self, ids: list[int], targets: dict[str, int]) -> dict[str, float]:
        """Single-token label words: one forward pass, all words read off the next-token distribution. The prompt
        keeps its last window-1 tokens, exactly what ``model.score`` keeps for a one-token continuation."""
        x = torch.tensor([ids[-(self.model.segment_len - 1):]], device=self.model.backbone.device)  # (1, T)
        hidden = self.model.step(x, self.memory).hidden[:, -1:]  # (1, 1, E) at the last prompt token
        logp = torch.log_softmax(self.model.backbone.logits(hidden).float(), dim=-1)[0, 0]  # (V,)
        return {w: logp[t].item() for w, t in targets.items()}

    def predict(self, text: str) -> str:
        scores = self.scores(text)
        return max(scores, key=scores.get)

    def predict_many(self, texts: Sequence[str], progress: Callable[[int, int], None] | None = None) -> list[str]:
        """``predict`` for each text, in order; ``progress(done, total)`` after each."""
        out = []
        for i, text in enumerate(texts):
            out.append(self.predict(text))
            if progress is not None:
                progress(i + 1, len(texts))
        return out


DEMO_FINDERS = ("fused", "memory", "lexical", "none")
METHODS = ("head", "in-context")  # how a saved classifier decides (``ClassifierSpec.method``)


@dataclass
class Choice:
    """Which demonstrations a classifier reads in its prompt for an input (found by ``longmem.tasks.demos``)."""

    finder: str = "fused"  # "fused", "memory", "lexical", or "none" (the fixed demonstrations: the paper's setting)
    shots: int = 20  # demonstrations read in the prompt
    balance: bool = False  # take the labels in turn (each label's best first), not the best regardless of label
    depth: int = 200  # candidates each finder ranks before fusion and filtering

    def __post_init__(self):
        if self.finder not in DEMO_FINDERS:
            raise ValueError(f"the demonstration finder must be one of {', '.join(DEMO_FINDERS)}, got {self.finder!r}")
        if self.shots < 0 or self.depth < 1:
            raise ValueError(f"shots must be >= 0 and depth >= 1, got {self.shots} and {self.depth}")


@dataclass
class ClassifierSpec:
    """Everything needed to rebuild a classifier over its bank: the prompt side and the evaluation set."""
    name: str
    template: str  # demonstrations' template, e.g. "Review: {text} Sentiment: {label}"
    labels: list[str]  # label words
    context: list[str] = field(default_factory=list)  # formatted demonstrations in the prompt (k-shot)
    separator: str = "\n"  # between the context demonstrations and the text
    source: str = ""  # name of the file the demonstrations came from
    n_memory: int = 0  # demonstrations written into the bank's memory
    n_test: int = 0  # held-out examples
    seed: int = 0  # of the split
    test: list[Example] = field(default_factory=list)  # the held-out examples
    last_eval: dict | None = None  # EvalResult.to_dict() of the latest evaluation
    # the demonstrations in the prompt: "none" = the fixed ``context``; "fused", "memory" or "lexical" = the ``shots``
    # best of the bank's found for each text (``longmem.tasks.demos``), ``balance``d over the labels or not
    finder: str = "none"
    shots: int = 4
    balance: bool = False
    calibrate: bool = False  # contextual calibration (``classify.calibrate``)
    # how it decides: "head", a head fitted on the in-memory examples reads the bank model's state and the text's
    # sentence embedding (``tasks.head``); "in-context", the likeliest label word after the prompt and memory (the
    # paper's, the fields above). A classifier saved before heads existed gets its head on first use
    method: str = "head"

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"a classifier's method must be one of {', '.join(METHODS)}, got {self.method!r}")

    def classifier(self, model: SegmentLM, memory, demos=None) -> Classifier:
        """The classifier over ``memory``; ``demos`` (a ``demos.DemoFinder`` over the bank) chooses the prompt's
        demonstrations when ``finder`` is not "none"."""
        choose = None
        if self.finder != "none":
            if demos is None:
                raise ValueError(f"classifier {self.name!r} finds its demonstrations in its bank: give it a DemoFinder")
            choose = demos.chooser(Choice(self.finder, self.shots, self.balance))
        return Classifier(model, memory, self.template, list(self.labels), list(self.context), self.separator,
                          choose=choose, calibrate=self.calibrate)

    def to_dict(self) -> dict:
        return asdict(self)  # Examples become {"text", "label"}; all values JSON-safe

    @classmethod
    def from_dict(cls, d: dict) -> "ClassifierSpec":
        missing = [k for k in ("name", "template", "labels") if k not in d]
        if missing:
            raise ValueError(f"a saved classifier needs {', '.join(missing)}")
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}  # fields added by later versions are ignored
        kw["test"] = [Example(e["text"], e["label"]) for e in d.get("test", [])]
        return cls(**kw)


# -----------------------------------------------------------------------------
# classifying a whole file

def classify_rows(classifier: Classifier, texts: Sequence[str], progress: Progress | None = None) -> list[dict]:
    """One row per text: the text, the predicted label, its probability among the labels ("confidence"),
    log P(word | prompt, memory) of every label word as "score_<word>" (calibrated when the classifier is), "read":
    the demonstrations its prompt held, one per line, when they are chosen per text (else empty), and "error": why a
    text could not be classified (e.g. longer than the window), empty otherwise. One bad row never loses the
    others."""
    rows = []
    for i, text in enumerate(texts):
        try:
            scores = classifier.scores(text)
        except ValueError as e:
            rows.append({"text": text, "prediction": "", "confidence": None,
                         **{f"score_{w}": None for w in classifier.labels}, "read": "", "error": str(e)})
        else:
            best = max(scores, key=scores.get)
            confidence = 1 / sum(math.exp(s - scores[best]) for s in scores.values())  # softmax over the labels
            read = "\n".join(classifier.read(text)) if classifier.choose is not None else ""
            rows.append({"text": text, "prediction": best, "confidence": confidence,
                         **{f"score_{w}": s for w, s in scores.items()}, "read": read, "error": ""})
        if progress is not None:
            progress(i + 1, len(texts))
    return rows


def write_predictions_csv(rows: Sequence[dict], path: str | Path) -> Path:
    """``classify_rows`` output as a UTF-8 CSV file with a header."""
    columns = list(rows[0]) if rows else ["text", "prediction", "confidence"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)
