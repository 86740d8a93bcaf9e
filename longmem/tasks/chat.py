"""Chat about memorized text: ``Chat`` keeps a conversation in the model's chat template. When the conversation no
longer fits the local window (with room left for the answer), its oldest turns move into memory, once, as the
paper's update rule says; they stay retrievable while the prompt stays short. (Classification: ``classify``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from longmem.memory.memory import Memory
from longmem.model.lm import Probe, Sampling, SegmentLM, Trace
from longmem.text.io import stream_text


@dataclass
class Chat:
    model: SegmentLM
    memory: Memory | None
    sampling: Sampling = field(default_factory=Sampling)
    history: list[dict] = field(default_factory=list)  # turns still in the local window; an answer turn with
    #                                                   "said": False (the book does not say) is kept out of prompts
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
        window with room for the answer and a question asked after it (``Sampling.probe``; a turn kept out of
        prompts is dropped from the window, not memorized)."""
        budget = self.model.segment_len - self.sampling.max_new_tokens - _probe_room(self.sampling)
        while len(self.history) > 1 and self._encode(self._turns(last), True).shape[1] > budget:
            unread = _unread(self.history)
            old = self.history.pop(0)
            if 0 not in unread and self.memory is not None and self.model.uses_memory:
                self.model.memorize(self._encode([_turn(old)], False), self.memory)
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
        """The turns a prompt reads: the earlier ones that are read (``_read``), then the last question as ``last``."""
        return _read(self.history[:-1]) + [{"role": "user", "content": last}]

    def prompt_ids(self, question: str, excerpts: str | None = None, history: bool = True) -> torch.Tensor:
        """The prompt (1, T) the model would read for ``question`` now (with ``excerpts`` in its place, see ``ask``;
        without the earlier turns unless ``history``), without changing the conversation."""
        earlier = _read(self.history) if history else []
        return self._encode(earlier + [{"role": "user", "content": excerpts or question}], True)

    def ask(self, question: str, excerpts: str | None = None, search_excerpts: bool = True,
            trace: Trace | None = None) -> Iterator[str]:
        """Stream the answer to ``question`` as text pieces; the turn is recorded once the answer is complete (an
        answer left unfinished leaves the conversation as it was, but for turns moved into memory to make room).
        ``excerpts``: what the model reads in the question's place this once (excerpts of the book, then the
        question: ``longmem.tasks.reading.reading_prompt``); the conversation keeps the question alone, so the excerpts
        of earlier turns do not crowd the window. ``search_excerpts=False``: the prompt up to the question (the
        earlier turns and the excerpts) reads the window alone; the question, the rest of the template and the answer
        search memory. ``trace``: filled with what the generation saw (``SegmentLM.generate``)."""
        if not question.strip():
            raise ValueError("the question is empty")
        self.history.append({"role": "user", "content": question})
        last = excerpts or question
        self._fit_window(last)
        ids = self._encode(self._turns(last), True)
        start = 0 if search_excerpts or not excerpts else self._question_start(last)
        pieces, complete = [], False
        answer = self.model.generate(ids, self.memory, self.sampling, search_from=start, trace=trace)
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

    def probe(self, question: str, yes: str = "Yes", no: str = "No") -> Probe:
        """``question`` asked of the model right after its answer, in its chat template (the end of the answer's turn,
        a user turn, the start of the next reply: ``Sampling.probe``), weighing the replies ``yes`` and ``no`` by
        their first tokens, as written alone, after a space, and lower-cased (those the two share left out)."""
        tok = self.model.backbone.tokenizer
        mark = "\u2063answer\u2063"  # the answer's place in the rendered turns (invisible separators around a word)
        text = tok.apply_chat_template([{"role": "user", "content": "Question"}, {"role": "assistant", "content": mark},
                                        {"role": "user", "content": question}], add_generation_prompt=True,
                                       tokenize=False)
        if mark not in text:
            raise ValueError("this backbone's chat template does not show an answer as written; it cannot be probed")
        tail = text[text.rindex(mark) + len(mark):]

        def firsts(word: str) -> set[int]:
            return {tok(w, add_special_tokens=False).input_ids[0]
                    for w in (word, " " + word, word.lower(), " " + word.lower())}
        ys, ns = firsts(yes), firsts(no)
        return Probe(tuple(tok(tail, add_special_tokens=False).input_ids), tuple(sorted(ys - ns)),
                     tuple(sorted(ns - ys)))

    def record(self, question: str, answer: str, said: bool = True) -> None:
        """Record a turn whose answer was not generated (e.g. a reply that the book does not say). ``said=False``:
        the answer says that the book does not say; the turn stays in the conversation, out of later prompts (a
        small model copies such a reply into the next answers)."""
        self.history += [{"role": "user", "content": question}, _answer_turn(answer, said)]

    def revise_last(self, answer: str, said: bool = True) -> None:
        """Replace the last answer recorded (the conversation keeps what the reader was shown); ``said`` as in
        ``record``."""
        if not self.history or self.history[-1]["role"] != "assistant":
            raise ValueError("the conversation has no answer to revise")
        self.history[-1] = _answer_turn(answer, said)


def _probe_room(sampling: Sampling) -> int:
    """Tokens a question asked after the answer takes in the window (``Sampling.probe``, with the answer's last
    token read before it)."""
    return len(sampling.probe.ids) + 1 if sampling.probe is not None else 0


def _answer_turn(answer: str, said: bool) -> dict:
    return {"role": "assistant", "content": answer, **({} if said else {"said": False})}


def _turn(turn: dict) -> dict:
    """A turn as the chat template reads it."""
    return {"role": turn["role"], "content": turn["content"]}


def _unread(history: list[dict]) -> set[int]:
    """Indices of the turns kept out of prompts: each answer with "said": False and the question before it."""
    out = set()
    for i, t in enumerate(history):
        if t["role"] == "assistant" and t.get("said", True) is False:
            out.add(i)
            if i > 0 and history[i - 1]["role"] == "user":
                out.add(i - 1)
    return out


def _read(history: list[dict]) -> list[dict]:
    """The turns of ``history`` that prompts read, as the chat template reads them."""
    unread = _unread(history)
    return [_turn(t) for i, t in enumerate(history) if i not in unread]
