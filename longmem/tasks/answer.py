"""One way to answer a question about a bank: find the passages, read them, answer, cite them, or say that the book
does not say. The app's chat (``service.Workspace.chat``), ``longmem chat``, the evaluation's app entrant
(``eval.answering``) and the benchmark (``bench.bank``) all call ``answer``, with the same defaults.

    chat = Chat(model, memory, ANSWER_SAMPLING)           # the bank's memory as ``bank.load_memory`` gives it
    reply = answer(chat, PassageFinder(bank, model, memory), "Whom did Mrs. Forrester marry?")
    for piece in reply:                                   # the answer's text, streamed
        print(piece, end="")
    reply.citations                                       # what it read, each with the sentence that supports it

How it reads (``Reading``, ``tasks.reading``): the finder's best passages go into the prompt before the question; the
model answers with its memory attached (fewer memory tokens per query while it reads), its next-token logits mixed
with the frozen backbone's (``Reading.side_weight``). With ``Reading.abstain`` > 0 the answer is checked as it is
made, sentence by sentence (``tasks.evidence.Checker``): a sentence is shown once enough of the words it adds to the
question are found together in one stretch of the passages read, and the first that is not ends the answer. When no
sentence is, the reply is ``NOT_SAID`` and the passages read are still cited, as the closest the book has. Without
the check, pieces stream as they are made. A reader told to say that the book does not say (the "book-or-not"
prompt) may be held to it only when sure (``Reading.decline``): its probability of saying so is read once it has read
the prompt, and below the threshold it answers with its likeliest other reply, which the check then judges. Once
its answer is made the reader may be asked whether it is stated in the excerpts (``Reading.confirm``: its
probability of Yes against No, read after the answer in the same window); unconfirmed, the reply says the book does
not say. That answer is held until confirmed.

Who reads. The chat's model is the reader: the bank's own LongMem model with the bank's memory attached (the full
path above), or any other model (``model.readers``: the frozen backbone alone, ``Chat(reader, None)``) reading the
same found passages with memory off; the finder keeps running on the bank's own model. ``Answer.reader`` names it
and ``Answer.memory`` says whether the bank's memory was read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from longmem.memory.view import MemoryView
from longmem.model.lm import Sampling, Trace
from longmem.tasks.chat import Chat
from longmem.tasks.evidence import Checker, grounding, support
from longmem.tasks.reading import (
    CONFIRM,
    DECLINE,
    SURE_TOKENS,
    Citation,
    Found,
    PassageFinder,
    Reading,
    citations,
    fit_for_chat,
    prompt_for,
)

ANSWER_TOKENS = 64  # tokens an answer says at most: a book question's answer is a sentence or two
NO_REPEAT = 4  # an answer never repeats a 4-gram of its own: the 135M reader's greedy loops end
NOT_SAID = "The book does not say. The passages closest to the question are below."


def answer_sampling(max_new_tokens: int = ANSWER_TOKENS) -> Sampling:
    """How an answer is decoded unless told otherwise: greedily, ending where the frozen backbone would end it, with
    no 4-gram said twice."""
    return Sampling(max_new_tokens=max_new_tokens, temperature=0.0, backbone_stops=True, no_repeat=NO_REPEAT)


ANSWER_SAMPLING = answer_sampling()


class Answer:
    """An answer being made: iterate for its text pieces (once); ``citations`` are known before the first piece;
    ``text``, ``said`` (False: the reply says the book does not say) and ``grounding`` once it is complete.
    ``close()`` (or leaving the iteration early) stops the generation between two tokens."""

    def __init__(self, question: str, found: list[Found], cited: list[Citation], view: MemoryView | None,
                 stop: Callable[[], bool] | None = None, reader: str = "", memory: bool = False):
        self.question = question
        self.reader = reader  # the name of the model that read the passages and wrote the answer
        self.memory = memory  # whether it read the bank's memory (False: a reader other than the bank's model)
        self.stop = stop  # asked after each generated token: True ends the answer there, unfinished
        self.found = found  # the passages read, in prompt order
        self.citations = cited
        self.view = view  # the memory as the answer read it (what it retrieved: ``view.top``)
        self.pieces: list[str] = []
        self.said = True  # False when the reply is NOT_SAID
        self.grounding: float | None = None  # share of the answer's added words in the passages read
        self.trace = Trace()  # what the generation saw: the reader's probability of declining (``Reading.decline``),
        #                       each answer token's probability
        self.sure: float | None = None  # the least probability of the answer's first tokens (``Reading.sure``;
        #                                 None: not judged)
        self.confirm: float | None = None  # the reader's probability that its answer is stated in the excerpts
        #                                    (``Reading.confirm``; None: not asked)
        self.draft: str | None = None  # what the model answered, when the reply shows less of it (cut at a sentence
        #                                the passages do not support, or NOT_SAID)
        self.complete = False
        self._source: Iterator[str] = iter(())  # the pieces, made by ``answer``

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def __iter__(self) -> Iterator[str]:
        for piece in self._source:
            self.pieces.append(piece)
            yield piece

    def close(self) -> None:
        self._source.close()


def answer(chat: Chat, finder: PassageFinder | None, question: str, reading: Reading | None = None,
           chunks: int | None = None, stop: Callable[[], bool] | None = None, whole_draft: bool = False,
           reader: str | None = None) -> Answer:
    """Answer ``question`` in ``chat`` (its model, memory and sampling) from the passages ``finder`` finds by
    ``reading`` (default ``Reading()``; no finder, or ``finder="none"``: read nothing, the paper's memory fusion
    alone). ``chunks``: memory chunks per query token and head (None: ``Reading.chunks``). When the finder finds
    nothing, the reply is ``NOT_SAID`` without asking the model (it would answer from what it knows, not from the
    book); when what it finds does not fit the window, the model answers from memory alone, unchecked. The turn is
    recorded in the chat once the answer is complete; an answer left unfinished is not, nor one that ``stop``
    (asked after each generated token, also while the sentences shown are held for checking) ended. ``whole_draft``
    (for records): once the check has ended the reply, the model still writes its draft to the end, unshown, so
    that ``Answer.draft`` is what it answers without the check (the reply and the turn recorded are the same).
    ``reader``: the name ``Answer.reader`` gives the chat's model (default: its backbone's name)."""
    reading = reading or Reading()
    if not question or not question.strip():
        raise ValueError("the question is empty")
    n, room = chat.prompt_ids(question, history=False).shape[1], chat.model.segment_len - chat.sampling.max_new_tokens
    if n > room:
        raise ValueError(f"the question is too long: {n:,} tokens with the prompt, and the {chat.model.segment_len:,}"
                         f"-token window leaves {room:,} beside the answer; ask in fewer words")
    reads = finder is not None and reading.finder != "none" and reading.passages > 0
    ranked = finder.find(question, reading) if reads else []
    # none may fit a small window: then memory alone answers
    found = fit_for_chat(ranked, chat, question, reading, finder.bank) if ranked else []
    cited = citations(finder.bank, found, question) if found else []
    view = None
    if chat.memory is not None:
        model_topk = chat.model.config.topk
        view = MemoryView(chat.memory, chunks if chunks is not None else reading.chunks(chat.memory, found, model_topk))
    reads_memory = chat.memory is not None and chat.model.uses_memory
    reply = Answer(question, found, cited, view, stop, reader or chat.model.backbone.name, reads_memory)
    if reads and not ranked:
        reply._source = _not_said(chat, reply)
    else:
        reply._source = _stream(chat, reply, reading, view, bool(found) and reading.abstain > 0, whole_draft)
    return reply


def _not_said(chat: Chat, reply: Answer) -> Iterator[str]:
    """The reply when nothing was found to read: NOT_SAID, recorded as the turn's answer."""
    reply.said = False
    yield NOT_SAID
    chat.record(reply.question, NOT_SAID, said=False)
    reply.complete = True


def _stream(chat: Chat, reply: Answer, reading: Reading, view: MemoryView | None, checks: bool,
            whole_draft: bool = False) -> Iterator[str]:
    """The answer's pieces: generated with ``view`` as the chat's memory (put back after) and the reading's blend of
    the backbone's logits while excerpts are read; when ``checks``, shown sentence by sentence as the passages read
    support them (``evidence.Checker``), and NOT_SAID when none is. The turn records what was shown. With
    ``whole_draft`` the generation goes on unshown after the check stops (the checker shows nothing more). With
    ``Reading.confirm`` the answer is made whole (the check's stop does not end it) and held: what the check shows of
    it comes once the reader confirmed the whole draft, else NOT_SAID."""
    question, found = reply.question, reply.found
    confirms = bool(found) and reading.confirm > 0  # the whole answer is held until the reader confirms it
    probe = chat.probe(CONFIRM) if confirms else None
    memory, sampling = chat.memory, chat.sampling
    chat.memory = view
    if found:
        chat.sampling = replace(sampling, side_weight=reading.side_weight, probe=probe)
        if reading.declines:
            tok = chat.model.backbone.tokenizer
            chat.sampling = replace(chat.sampling, decline=tuple(tok(DECLINE, add_special_tokens=False).input_ids),
                                    decline_above=reading.decline)
    checker = Checker(question, [f.passage.text for f in found], reading.abstain, reading.reach,
                      reading.asked_words) if checks else None
    made, completed = [], False
    held, judged, doubted = "", not (found and reading.sure > 0), False  # text held until the first tokens are judged
    probs = reply.trace.probs

    def judge() -> bool:
        """Whether the reader was unsure how its answer begins (``Reading.sure``): judged once, on its first
        ``SURE_TOKENS`` tokens (all of them, when it made fewer)."""
        reply.sure = min(probs[:SURE_TOKENS], default=0.0)
        return reply.sure < reading.sure
    try:
        excerpts = prompt_for(question, found, reading) if found else None
        pieces = chat.ask(question, excerpts, reading.search_excerpts, reply.trace)
        try:
            for piece in pieces:
                if reply.stop is not None and reply.stop():
                    return  # stopped by the reader: unfinished, not recorded
                made.append(piece)
                if reply.trace.declined or doubted:  # the reader was sure the book does not say, or unsure of what
                    continue                         # it answers: the reply says that the book does not say
                shown = piece if checker is None else checker.feed(piece)
                if not judged and len(probs) >= SURE_TOKENS:
                    judged, doubted = True, judge()
                if doubted:
                    if whole_draft:
                        continue
                    break
                held += shown
                if judged and held and not confirms:
                    yield held
                    held = ""
                if checker is not None and checker.stopped and not (whole_draft or confirms):
                    break  # (the reader confirms, or not, its whole answer)
            else:
                completed = True
                if checker is not None and not (reply.trace.declined or doubted):
                    held += checker.finish()
        finally:
            pieces.close()
    finally:
        chat.memory, chat.sampling = memory, sampling
    if not judged and not reply.trace.declined:  # fewer than SURE_TOKENS tokens made, or the check ended it first
        doubted = judge()
    if confirms and completed:
        reply.confirm = reply.trace.confirm
        doubted = doubted or (reply.confirm is not None and reply.confirm < reading.confirm)
    if held and not (doubted or reply.trace.declined):
        yield held
    draft = "".join(made)
    text = "" if doubted else draft if checker is None else checker.shown
    if found:
        reply.grounding = grounding(draft, question, [f.passage.text for f in found])
    if reply.trace.declined or doubted or (checker is not None and not text):
        reply.said, text = False, NOT_SAID
        yield text
    if text != draft.strip():
        reply.draft = draft
    if completed:
        chat.revise_last(text, reply.said)
    else:  # stopped at a sentence the passages do not support: the turn is what was shown
        chat.record(question, text, reply.said)
    if reply.said and found:
        reply.citations = supported(reply.citations, text, question)
    reply.complete = True


def supported(cited: list[Citation], text: str, question: str) -> list[Citation]:
    """``cited`` with the sentence of each that supports the answer ``text`` (``evidence.support``) and the one the
    answer rests on marked (``Citation.rests``): the one whose supporting sentence holds most of the answer's added
    words (ties: the first)."""
    found = [support(text, question, c.text) for c in cited]
    words = [s.words if s is not None else 0 for s in found]
    best = words.index(max(words)) if any(words) else -1
    return [replace(c, support=(s.start, s.end) if s is not None else None, rests=i == best)
            for i, (c, s) in enumerate(zip(cited, found))]
