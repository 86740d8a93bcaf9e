"""Chat about memorized text: ``Chat`` keeps a conversation in the model's chat template. When the conversation no
longer fits the local window (with room left for the answer), its oldest turns move into memory, once, as the
paper's update rule says; they stay retrievable while the prompt stays short. (Classification: ``classify``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from longmem.memory.memory import Memory
from longmem.model.lm import Sampling, SegmentLM
from longmem.text.io import stream_text


@dataclass
class Chat:
    model: SegmentLM
    memory: Memory | None
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

    def _question_start(self, last: str) -> int:
        """The position in the prompt (whose last user turn is ``last``) of the question's first token: the last
        question asked (0 when the template does not show it)."""
        tok = self.model.backbone.tokenizer
        text = tok.apply_chat_template(self._turns(last), add_generation_prompt=True, tokenize=False)
        head = text.rfind(self.history[-1]["content"].strip())
        if head < 0:
            return 0
        return len(tok(text[:head].rstrip(), add_special_tokens=False).input_ids)  # rstrip: a space joins the next word

    def _turns(self, last: str) -> list[dict]:
        return self.history[:-1] + [{"role": "user", "content": last}]

    def prompt_ids(self, question: str, reading: str | None = None, history: bool = True) -> torch.Tensor:
        """The prompt (1, T) the model would read for ``question`` now (with ``reading`` in its place, see ``ask``;
        without the earlier turns unless ``history``), without changing the conversation."""
        earlier = self.history if history else []
        return self._encode(earlier + [{"role": "user", "content": reading or question}], True)

    def ask(self, question: str, reading: str | None = None, search_reading: bool = True) -> Iterator[str]:
        """Stream the answer to ``question`` as text pieces; the turn is recorded once the answer is complete (an
        answer left unfinished leaves the conversation as it was, but for turns moved into memory to make room).
        ``reading``: what the model reads in the question's place this once (excerpts of the book, then the
        question: ``longmem.tasks.reading.reading_prompt``); the conversation keeps the question alone, so the excerpts
        of earlier turns do not crowd the window. ``search_reading=False``: the prompt up to the question (the
        earlier turns and the excerpts) reads the window alone; the question, the rest of the template and the answer
        search memory."""
        if not question.strip():
            raise ValueError("the question is empty")
        self.history.append({"role": "user", "content": question})
        last = reading or question
        self._fit_window(last)
        ids = self._encode(self._turns(last), True)
        start = 0 if search_reading or not reading else self._question_start(last)
        pieces, complete = [], False
        answer = self.model.generate(ids, self.memory, self.sampling, search_from=start)
        try:
            for piece in stream_text(self.model.backbone.tokenizer, answer):
                pieces.append(piece)
                yield piece
            complete = True
        finally:
            if complete:
                self.history.append({"role": "assistant", "content": "".join(pieces)})
            elif self.history and self.history[-1]["role"] == "user":
                self.history.pop()

    def record(self, question: str, answer: str) -> None:
        """Record a turn whose answer was not generated (e.g. a reply that the book does not say)."""
        self.history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    def revise_last(self, answer: str) -> None:
        """Replace the last answer recorded (the conversation keeps what the reader was shown)."""
        if not self.history or self.history[-1]["role"] != "assistant":
            raise ValueError("the conversation has no answer to revise")
        self.history[-1] = {"role": "assistant", "content": answer}
