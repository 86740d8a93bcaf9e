"""Each bank's loaded memory and conversation, and the model calls that use them: chat and continue.

    sessions = Sessions(model, BankDirectory())
    reply = sessions.chat("gatsby", "Who is Daisy?")   # streams: for piece in reply: print(piece, end="")

Concurrency. Model calls that read or change a bank's in-RAM memory (chat, continue, classify) run one at a time,
under ``lock``, each in its own thread that streams into a ``Reply``; a reader that goes away cancels it between two
tokens. A bank's memory is loaded on first use, at most ``LOADED_BANKS`` at once (the least recently used is
dropped), and reloaded when the bank's contents change (new or removed documents). The chat of a bank is stored in
the bank; when it outgrows the local window its oldest turns move into memory (``Chat``).

Readers. An answer is read by the reader its settings name (``Settings.reader``; None: ``default_reader``). The
bank's own model reads with the bank's memory; any other (``model.readers``) reads the same found passages with
memory off, loaded on first use and kept (``LOADED_READERS`` at once). The finder always runs on the bank's model.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from longmem.memory.memory import Memory
from longmem.memory.view import MemoryView
from longmem.model.readers import default_for, label
from longmem.service.replies import CONTINUE, ChunkHit, Reply, Settings
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.records import BankError
from longmem.tasks.answer import answer
from longmem.tasks.chat import Chat
from longmem.tasks.reading import Citation, PassageFinder
from longmem.tasks.setup import decoding, reading_for, resolve
from longmem.tasks.setup import load as load_reader
from longmem.text.io import InputError, stream_text

log = logging.getLogger(__name__)

LOADED_BANKS = 2  # bank memories kept in RAM at once (least recently used is dropped)
LOADED_READERS = 1  # readers other than the bank's model kept in RAM at once (a 1.5B one holds ~3.3 GiB)
CHUNKS_SHOWN = 3  # retrieved chunks shown under an answer


@dataclass
class Session:
    """A bank's memory as loaded in RAM, its version, and its conversation."""

    bank: Bank
    version: tuple[int, int]  # (epoch, chunks) of the bank when loaded
    stored: Memory  # the bank's memory at its own chunk size
    chunk_size: int  # chunk size of ``memory``
    memory: Memory  # ``stored`` re-chunked to ``chunk_size`` (same K/V), plus what the chat moved into it
    bank_chunks: int  # chunks of ``stored`` that come from the bank (what a chat adds comes after them)
    chat: Chat | None = None  # the conversation, read by ``chat.model`` (the bank's model, or another reader)
    finder: PassageFinder | None = None  # ranks the bank's passages for questions (made on first use)


def _stored(turn: dict) -> dict:
    """What a stored turn keeps beside its text: {"retrieved", "read", "said"} (before 0.2, a list: retrieved)."""
    return turn["passages"] if isinstance(turn["passages"], dict) else {"retrieved": turn["passages"]}


def _chat_turns(bank: Bank) -> list[dict]:
    """The bank's conversation as a ``Chat`` keeps it: an answer that said the book does not say is marked so."""
    return [{"role": t["role"], "content": t["content"], **({} if _stored(t).get("said", True) else {"said": False})}
            for t in bank.chat_turns(passages=True)]


def _citation(stored: dict) -> Citation:
    """A citation as the bank stored it (JSON: the spans are lists, absent before they existed)."""
    spans = {k: tuple(stored[k]) if stored.get(k) else None for k in ("support", "nearest")}
    return Citation(**{**stored, **spans})


class Sessions:
    """The loaded banks' memories and conversations of one model, and the requests that use them (one at a time)."""

    def __init__(self, model, directory: BankDirectory, reader: str | None = None):
        self.model = model  # the model every request runs (``swap`` replaces it)
        self.directory = directory
        self.lock = threading.RLock()  # one model call at a time; guards the sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        # the reader an answer reads with unless its settings name another (``readers.default_for``)
        self.default_reader = default_for(model.config.backbone, reader)
        self._readers: OrderedDict[str, object] = OrderedDict()  # readers other than ``model``, loaded

    def reader(self, name: str | None = None) -> tuple[object, str, bool]:
        """The reader ``name`` stands for (None: ``default_reader``): ``(model, name, own)``, ``name`` resolved
        (``readers.choose``), ``own`` when it is the bank's model (then it reads the bank's memory). Another is
        loaded on first use (call under the lock)."""
        name, own = resolve(self.model, name, self.default_reader)
        if own:
            return self.model, name, True
        lm = self._readers.get(name)
        if lm is None:
            lm = load_reader(name, self.model)  # with its own window (``tasks.setup``)
            self._readers[name] = lm
            while len(self._readers) > LOADED_READERS:
                _, gone = self._readers.popitem(last=False)
                for s in self._sessions.values():  # a conversation it read is read again by whoever comes next
                    if s.chat is not None and s.chat.model is gone:
                        s.chat = None
        self._readers.move_to_end(name)
        return lm, name, False

    def names(self) -> list[str]:
        """The banks whose memory is loaded, least recently used first."""
        return list(self._sessions)

    def swap(self, model) -> None:
        """Run ``model`` from now on; every loaded memory is dropped (it was the old model's)."""
        with self.lock:
            self.close()
            self._readers.clear()  # the new model may be one of them; others load again when asked for
            self.model = model

    def close(self) -> None:
        """Release every loaded bank."""
        with self.lock:
            for name in list(self._sessions):
                self.drop(name)

    def drop(self, name: str) -> None:
        """Forget bank ``name``'s loaded memory and conversation (both stay stored in the bank)."""
        s = self._sessions.pop(name, None)
        if s is not None:
            s.bank.close()

    def session(self, name: str, chunk_size: int | None = None) -> Session:
        """The loaded memory of a bank, (re)loaded when the bank changed; callers hold the lock."""
        s = self._sessions.get(name)
        if s is not None:
            try:
                version = s.bank.version()
            except BankError:  # renamed or deleted behind our back
                version = None
            # the bank changed, or other chunks are asked for
            if version != s.version or (chunk_size is not None and chunk_size != s.chunk_size):
                self.drop(name)
                s = None
        if s is None:
            bank = self.directory.open(name)
            try:
                version = bank.version()
                stored = bank.load_memory(self.model)
            except BaseException:
                bank.close()
                raise
            memory = stored.rechunk(chunk_size) if chunk_size is not None else stored  # shares the keys/values
            s = Session(bank=bank, version=version, stored=stored, chunk_size=memory.chunk_size, memory=memory,
                        bank_chunks=stored.rows[0].n)
            self._sessions[name] = s
            while len(self._sessions) > LOADED_BANKS:
                self.drop(next(iter(self._sessions)))
        self._sessions.move_to_end(name)
        return s

    def memory_bytes(self) -> int:
        """RAM held by the loaded bank memories (keys and values)."""
        total = 0
        for s in list(self._sessions.values()):
            r = s.stored.rows[0]
            total += r.k.numel() * r.k.element_size() * 2
        return total

    def chat_history(self, name: str) -> list[dict]:
        """The bank's stored conversation, oldest first: {"role", "content", "retrieved": [ChunkHit], "citations":
        [Citation], "said", "reader", "memory"} per turn (what memory retrieved, what the answer read, False when the
        answer said that the book does not say, which reader answered (None: not recorded, before readers could be
        chosen) and whether it read the bank's memory)."""
        with self.directory.open(name) as bank:
            turns = bank.chat_turns(passages=True)
        out = []
        for t in turns:
            stored = _stored(t)
            row = {k: v for k, v in t.items() if k != "passages"}  # the stored column: what was retrieved and read
            out.append({**row, "retrieved": [ChunkHit(**p) for p in stored.get("retrieved", [])],
                        "citations": [_citation(c) for c in stored.get("read", [])], "said": stored.get("said", True),
                        "reader": stored.get("reader"), "memory": stored.get("memory", True)})
        return out

    def clear_chat(self, name: str) -> None:
        """Forget bank ``name``'s conversation: its stored turns, and the loaded memory its old turns moved into."""
        with self.lock:
            self.drop(name)  # turns moved into memory leave with it
            with self.directory.open(name) as bank:
                bank.clear_chat()

    def chat(self, name: str, question: str, settings: Settings | None = None) -> Reply:
        """Answer ``question`` about bank ``name`` (streamed). The turn is stored in the bank once answered."""
        settings = settings or Settings()
        if not question or not question.strip():
            raise InputError("the question is empty")
        self.directory.open(name).close()  # an unknown bank fails here, in the caller

        def run(reply: Reply) -> None:
            s = self.session(name, settings.chunk_size)
            lm, reader, own = self.reader(settings.reader)
            if s.chat is not None and s.chat.model is not lm:  # another reader: the conversation as stored
                if s.chat.moved_turns:  # its old turns are in the loaded memory; the bank's memory comes back bare
                    self.drop(name)
                    s = self.session(name, settings.chunk_size)
                s.chat = None
            if s.chat is None:
                s.chat = Chat(lm, s.memory if own else None, history=_chat_turns(s.bank))
            chat = s.chat
            chat.sampling = settings.sampling(chat.sampling.stop_ids)
            if not own:  # as that reader decodes (its profile)
                chat.sampling = decoding(reader, chat.sampling)
            if settings.finder != "none" and s.finder is None:
                s.finder = PassageFinder(s.bank, self.model, s.memory)
            reading = settings.reading_config()
            if not own:  # another reader reads as its profile says, but for what the settings turn off
                off = {name for name, chosen in (("abstain", not settings.abstain),
                                                 ("finder", settings.finder == "none")) if chosen}
                reading = reading_for(reader, reading, off)
            finder = s.finder if settings.finder != "none" else None  # none: nothing is read
            made = answer(chat, finder, question, reading, settings.chunks, stop=lambda: reply.cancelled,
                          reader=label(reader))
            reply.reader, reply.memory = made.reader, made.memory
            reply.found(made.citations)  # shown while the reader reads them (the first piece takes seconds)
            try:
                for piece in made:
                    reply.emit(piece)
                    if reply.cancelled:
                        break
            finally:
                made.close()
            if not made.complete:  # stopped: an unfinished answer is not part of the conversation
                return
            reply.citations, reply.said = made.citations, made.said
            reply.retrieved = self._retrieved(s, made.view) if made.view is not None else []
            question_turn, answer_turn = chat.history[-2:]
            stored = {"read": [asdict(c) for c in reply.citations], "retrieved": [asdict(p) for p in reply.retrieved],
                      "said": reply.said, "reader": reply.reader, "memory": reply.memory}
            s.bank.add_chat_turns([question_turn, {**answer_turn, "passages": stored}])

        return self.start(run)

    def continue_text(self, name: str, prompt: str | None = None, settings: Settings | None = None) -> Reply:
        """Continue the bank's text from its end (``prompt`` None) or from ``prompt``, with the bank in memory.
        The prompt keeps its last tokens so that the generation never pushes anything into the bank's memory."""
        settings = settings or CONTINUE
        if prompt is not None and not prompt.strip():
            raise InputError("the passage to continue is empty")
        self.directory.open(name).close()
        model, tok = self.model, self.model.backbone.tokenizer
        room = model.segment_len - settings.max_new_tokens
        if room < 16:
            raise ValueError(f"{settings.max_new_tokens} new tokens leave no room for a prompt in the "
                             f"{model.segment_len}-token window")

        def run(reply: Reply) -> None:
            s = self.session(name, settings.chunk_size)
            if prompt is None:
                ids = s.stored.tail_tokens(min(room, model.segment_len // 2))
                if ids.numel() == 0:
                    raise InputError(f"bank {name!r} is empty: ingest a book first, or give a passage")
            else:
                ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids[0]
                if ids.numel() > room:
                    reply.notes.append(f"the passage has {ids.numel():,} tokens; its last {room:,} were used")
                    ids = ids[-room:]
            view = MemoryView(s.memory, settings.chunks)
            stop = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
            for piece in stream_text(tok, model.generate(ids[None], view, settings.sampling(stop))):
                reply.emit(piece)
                if reply.cancelled:
                    return
            reply.retrieved = self._retrieved(s, view)

        return self.start(run)

    # -- running model calls ----------------------------------------------------------------------------------------
    def start(self, run: Callable[[Reply], None]) -> Reply:
        reply = Reply()

        def target() -> None:
            try:
                with self.lock, torch.inference_mode():
                    run(reply)
            except BaseException as e:  # handed to the reader, who shows it
                if not isinstance(e, (InputError, BankError, ValueError)):
                    log.exception("request failed")
                reply.finish(e)
                return
            reply.finish()

        threading.Thread(target=target, name="longmem-request", daemon=True).start()
        return reply

    def run_locked(self, fn: Callable[[], object]):
        """Run ``fn`` under the model lock (for callers that use the model directly, e.g. classification)."""
        with self.lock, torch.inference_mode():
            return fn()

    def loaded_memory(self, name: str, chunk_size: int | None = None) -> Memory:
        """A bank's memory as used by requests (load it if needed); call under ``run_locked``."""
        return self.session(name, chunk_size).memory

    def _retrieved(self, s: Session, view: MemoryView) -> list[ChunkHit]:
        """The chunks behind an answer: the most retrieved ones, one per neighbourhood. A segment's first chunk
        is left out: every segment is encoded from position 0, and the keys of its first tokens (the attention
        sink) match almost any query, whatever they say."""
        f = s.stored.chunk_size // s.chunk_size
        n_stored = s.bank_chunks * f  # serials below this are the bank's; above, the chat's
        tok = self.model.backbone.tokenizer
        out, taken = [], []
        for serial, hits in view.top(50):
            coarse = serial // f if serial < n_stored else None
            key = coarse if coarse is not None else ("chat", serial)
            if any(isinstance(key, int) and isinstance(t, int) and abs(key - t) <= 8 or key == t for t in taken):
                continue
            taken.append(key)
            if coarse is not None:
                try:
                    p = s.bank.chunk_text(coarse)
                except KeyError:
                    continue
                if p.chunk == 0:
                    continue
                out.append(ChunkHit(document=p.document, location=f"part {p.segment + 1} of {p.of_segments}",
                                    text=p.text, context=p.context, hits=hits))
            else:
                try:
                    ids = s.memory.chunk_tokens(0, serial)
                except KeyError:
                    continue
                text = tok.decode([int(i) for i in ids if i >= 0])
                out.append(ChunkHit(document="this conversation", location="earlier turns", text=text,
                                    context=text, hits=hits))
            if len(out) == CHUNKS_SHOWN:
                break
        return out
