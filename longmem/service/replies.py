"""What one request to the workspace is asked with and answers with: its ``Settings`` (an answer's by default,
``CONTINUE`` for the Continue tab) and the ``Reply`` it streams, with the chunks memory retrieved (``ChunkHit``) and
the passages the answer read (``Citation``)."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator

from longmem.model.lm import Sampling
from longmem.tasks.answer import ANSWER_SAMPLING
from longmem.tasks.reading import DEFAULT_FINDER, PASSAGES_READ, Citation, Reading


@dataclass
class Settings:
    """Generation and retrieval settings of one request; the defaults are an answer's (``tasks.answer``), and
    ``CONTINUE`` is the Continue tab's."""
    max_new_tokens: int = ANSWER_SAMPLING.max_new_tokens  # tokens to generate at most
    temperature: float = ANSWER_SAMPLING.temperature  # 0 = greedy
    top_p: float = ANSWER_SAMPLING.top_p  # nucleus sampling mass
    chunks: int | None = None  # memory chunks per query token and head; None: READING_TOPK tokens' worth while reading
    chunk_size: int | None = None  # chunk size used for retrieval, a divisor of the bank's; None = the bank's own
    seed: int | None = None  # for reproducible sampling
    finder: str = DEFAULT_FINDER  # how a chat finds the passages it reads before answering: "lexical", "fused",
    #                               "memory", "windows" (``longmem.tasks.reading``), or "none" (the paper's memory
    #                               fusion alone); a reader other than the bank's model reads windows unless "none"
    passages: int = PASSAGES_READ  # passages read at most (within what the window leaves for them)
    backbone_stops: bool = ANSWER_SAMPLING.backbone_stops  # an answer also ends where the frozen backbone would
    abstain: bool = True  # an answer the passages read do not support says that the book does not say
    reader: str | None = None  # the model that reads and answers (``model.readers``; None: the workspace's default)
    books: tuple[int, ...] = ()  # the bank's documents (ids) an answer's passages are found in; (): all of them

    def reading_config(self) -> Reading:
        """How a chat answer reads its bank under these settings (``tasks.reading.Reading``)."""
        return Reading(finder=self.finder, passages=self.passages, books=tuple(int(b) for b in self.books),
                       **({} if self.abstain else {"abstain": 0.0}))

    def sampling(self, stop_ids: tuple[int, ...] = ()) -> Sampling:
        if self.max_new_tokens < 1:
            raise ValueError(f"max new tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature must be >= 0 and top-p in (0, 1], got {self.temperature}, {self.top_p}")
        return Sampling(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                        seed=self.seed, stop_ids=stop_ids, backbone_stops=self.backbone_stops,
                        no_repeat=ANSWER_SAMPLING.no_repeat)


CONTINUE = Settings(max_new_tokens=160, temperature=0.7, backbone_stops=False)  # the Continue tab samples


@dataclass(frozen=True)
class ChunkHit:
    """A chunk memory retrieved while answering, as listed under the answer: its text, its surroundings and where
    it is."""
    document: str  # title of the book (or "this conversation" for chat turns moved into memory)
    location: str  # e.g. "part 12 of 40"
    text: str  # the retrieved chunk
    context: str  # the chunk with its neighbours
    hits: int  # how many times (heads x tokens) it was retrieved


class Reply:
    """The streamed output of a request: iterate for text pieces; ``text``, ``retrieved`` and ``citations`` once it
    is finished. ``cancel()`` stops the generation between two tokens (also done when the iterator is closed early).
    ``updates()`` yields the pieces too, and None once the passages a chat answer reads are known (``citations``,
    before its first piece: ``found``), so that they can be shown while the reader reads them."""

    _END = object()
    _FOUND = object()

    def __init__(self):
        self.pieces: list[str] = []
        self.retrieved: list[ChunkHit] = []  # the chunks memory retrieved most while answering
        self.citations: list[Citation] = []  # the passages the answer read, numbered as in its prompt
        self.said = True  # False: the reply says that the book does not say (the citations are the closest passages)
        self.reader = ""  # a chat answer's reader (``model.readers.label``), known before its first piece
        self.memory = False  # whether that reader read the bank's memory (the bank's own model does)
        self.notes: list[str] = []  # facts about the request worth telling the reader (e.g. a prompt was cut)
        self.done = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    def cancel(self) -> None:
        self._stop.set()

    def __iter__(self) -> Iterator[str]:
        updates = self.updates()
        try:
            yield from (piece for piece in updates if piece is not None)
        finally:
            updates.close()  # a reader that stops early stops the generation (``updates``)

    def updates(self) -> Iterator[str | None]:
        """The text pieces, and None where the passages read became known (``found``)."""
        try:
            while True:
                item = self._queue.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield None if item is self._FOUND else item
        finally:
            self._stop.set()  # a reader that stops early stops the generation

    # -- producer side (the worker thread) ----------------------------------------------------------------------
    def found(self, citations: list[Citation]) -> None:
        """The passages the answer reads, known before its first piece (their supporting sentences come at the end)."""
        self.citations = citations
        self._queue.put(self._FOUND)

    def emit(self, piece: str) -> None:
        self.pieces.append(piece)
        self._queue.put(piece)

    def finish(self, error: BaseException | None = None) -> None:
        if error is not None:
            self._queue.put(error)
        self._queue.put(self._END)
        self.done.set()
