"""What people do with a model and its memory: chat about memorized text, classify with many-shot demonstrations.

``Chat`` keeps a conversation in the model's chat template. When the conversation no longer fits the local window
(with room left for the answer), its oldest turns move into memory, once, as the paper's update rule says; they stay
retrievable while the prompt stays short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

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

    def _fit_window(self) -> None:
        budget = self.model.segment_len - self.sampling.max_new_tokens
        while len(self.history) > 1 and self._encode(self.history, True).shape[1] > budget:
            old = self.history.pop(0)
            if self.memory is not None and self.model.uses_memory:
                self.model.memorize(self._encode([old], False), self.memory)
            self.moved_turns += 1

    def ask(self, question: str) -> Iterator[str]:
        """Stream the answer to ``question`` as text pieces; the turn is recorded once the answer is complete."""
        if not question.strip():
            raise ValueError("the question is empty")
        self.history.append({"role": "user", "content": question})
        self._fit_window()
        ids = self._encode(self.history, True)
        pieces = []
        for piece in stream_text(self.model.backbone.tokenizer, self.model.generate(ids, self.memory, self.sampling)):
            pieces.append(piece)
            yield piece
        self.history.append({"role": "assistant", "content": "".join(pieces)})


@dataclass
class Classifier:
    """Many-shot in-context classification: demonstrations ``template.format(text=..., label=word)`` sit in memory
    (thousands of them, far beyond the local window); a new text is scored against every label word,
    log P(word | "<template up to {label}>", memory), and the likeliest word wins."""

    model: SegmentLM
    memory: MemoryBank | None
    template: str  # e.g. "Review: {text} Sentiment: {label}", the demonstrations' template
    labels: list[str]  # the label words, as written in the demonstrations

    def __post_init__(self):
        if "{label}" not in self.template or "{text}" not in self.template.split("{label}")[0]:
            raise ValueError(f"template {self.template!r} needs {{text}} before {{label}}")
        if len(self.labels) < 2:
            raise ValueError(f"a classifier needs at least two labels, got {self.labels}")

    @classmethod
    def from_documents(cls, model: SegmentLM, memory: MemoryBank | None, documents: Iterable) -> "Classifier":
        """The template and label words of the demonstration sets stored in a bank (``store.Document``s)."""
        demos = [d for d in documents if d.kind == "demos"]
        if not demos:
            raise ValueError("the bank holds no demonstrations (ingest a CSV/TSV/JSONL file of text,label rows)")
        templates = sorted({d.meta["template"] for d in demos})
        if len(templates) > 1:
            raise ValueError(f"the bank's demonstration sets use different templates: {templates}")
        words = sorted({w for d in demos for w in d.meta["label_counts"]})
        return cls(model, memory, templates[0], words)

    def scores(self, text: str) -> dict[str, float]:
        """log P(label word | prompt, memory) for every label."""
        tok = self.model.backbone.tokenizer
        prefix = self.template.split("{label}")[0].format(text=text.strip())  # as the demonstrations were written
        context = prefix.rstrip()
        ctx = tok(context, add_special_tokens=False).input_ids
        return {w: self.model.score(ctx, tok(prefix[len(context):] + w, add_special_tokens=False).input_ids,
                                    self.memory) for w in self.labels}

    def predict(self, text: str) -> str:
        scores = self.scores(text)
        return max(scores, key=scores.get)
