"""What people do with a model and its memory: chat about memorized text, classify with many-shot demonstrations.

``Chat`` keeps a conversation in the model's chat template. When the conversation no longer fits the local window
(with room left for the answer), its oldest turns move into memory, once, as the paper's update rule says; they stay
retrievable while the prompt stays short.

``Classifier`` scores label words after a prompt of optional in-context demonstrations and the text, while many
more demonstrations sit in memory (the paper's many-shot in-context learning); ``classifiers`` builds on it. The
demonstrations in the prompt are fixed, or chosen for each text (``longmem.demos``); scores may be calibrated
against a content-free input (``calibrate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch

from .lm import Sampling, SegmentLM
from .memory import MemoryBank
from .text import stream_text


@dataclass
class Chat:
    model: SegmentLM
    memory: MemoryBank | None
    sampling: Sampling = field(default_factory=Sampling)
    history: list[dict] = field(default_factory=list)  # turns still in the local window
    moved_turns: int = 0  # turns already moved into memory

    def __post_init__(self):
        tok = self.model.backbone.tokenizer
        if tok is None or getattr(tok, "chat_template", None) is None:
            raise ValueError("this backbone's tokenizer has no chat template; use generate instead of chat")
        if tok.eos_token_id is not None and tok.eos_token_id not in self.sampling.stop_ids:
            self.sampling.stop_ids = (*self.sampling.stop_ids, tok.eos_token_id)

    def _encode(self, turns: list[dict], prompt: bool):
        tok = self.model.backbone.tokenizer
        text = tok.apply_chat_template(turns, add_generation_prompt=prompt, tokenize=False)
        return tok(text, return_tensors="pt", add_special_tokens=False).input_ids

    def _fit_window(self, last: str) -> None:
        """Move the oldest turns into memory until the conversation, its last user turn read as ``last``, fits the
        window with room for the answer."""
        budget = self.model.segment_len - self.sampling.max_new_tokens
        while len(self.history) > 1 and self._encode(self._turns(last), True).shape[1] > budget:
            old = self.history.pop(0)
            if self.memory is not None and self.model.uses_memory:
                self.model.memorize(self._encode([old], False), self.memory)
            self.moved_turns += 1

    def _turns(self, last: str) -> list[dict]:
        return self.history[:-1] + [{"role": "user", "content": last}]

    def prompt_ids(self, question: str, reading: str | None = None, history: bool = True) -> torch.Tensor:
        """The prompt (1, T) the model would read for ``question`` now (with ``reading`` in its place, see ``ask``;
        without the earlier turns unless ``history``), without changing the conversation."""
        earlier = self.history if history else []
        return self._encode(earlier + [{"role": "user", "content": reading or question}], True)

    def ask(self, question: str, reading: str | None = None) -> Iterator[str]:
        """Stream the answer to ``question`` as text pieces; the turn is recorded once the answer is complete.
        ``reading``: what the model reads in the question's place this once (excerpts of the book, then the
        question: ``longmem.reading.reading_prompt``); the conversation keeps the question alone, so the excerpts
        of earlier turns do not crowd the window."""
        if not question.strip():
            raise ValueError("the question is empty")
        self.history.append({"role": "user", "content": question})
        last = reading or question
        self._fit_window(last)
        ids = self._encode(self._turns(last), True)
        pieces = []
        for piece in stream_text(self.model.backbone.tokenizer, self.model.generate(ids, self.memory, self.sampling)):
            pieces.append(piece)
            yield piece
        self.history.append({"role": "assistant", "content": "".join(pieces)})


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
    ``longmem.demos.DemoFinder.chooser``). A new text is scored against every label word,
    log P(word | "<demonstrations><separator><template up to {label}>", memory), and the likeliest word wins; with
    ``calibrate``, each score is first divided by the label's probability for ``content_free`` read after the same
    demonstrations (``calibrate``).

    When every label word is a single token after the template (BPE backbones: " positive"), all labels are scored
    from one forward pass; otherwise (e.g. a character tokenizer) each label word is scored with its own pass."""

    model: SegmentLM
    memory: MemoryBank | None
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
    def from_documents(cls, model: SegmentLM, memory: MemoryBank | None, documents: Iterable,
                       context: Sequence[str] = (), separator: str = "\n") -> "Classifier":
        """The template and label words of the demonstration sets stored in a bank (``store.Document``s)."""
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
        prefix = self.template.split("{label}")[0].format(text=text.strip())  # as the demonstrations were written
        own = prefix.rstrip()
        head = self.separator.join(demos) + self.separator if demos else ""
        return head + own, own, prefix[len(own):]

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
