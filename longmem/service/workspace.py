"""A workspace: one model shared by every user of an app, the banks directory, each bank's loaded memory and
conversation, and the background jobs that fill banks. The web app's handlers call this and nothing else.

    ws = Workspace(LongMemModel.from_config(), BankDirectory())
    job = ws.ingest("gatsby", ["gatsby.epub"], create=True)   # runs in the background; ws.jobs.get(job) for progress
    reply = ws.chat("gatsby", "Who is Daisy?")                 # streams: for piece in reply: print(piece, end="")
    reply.citations                                            # the passages the answer read, with their places

Concurrency. Model calls that read or change a bank's in-RAM memory (chat, continue, classify) run one at a time,
under the workspace's lock, each in its own thread that streams into a ``Reply``; a reader that goes away cancels
it between two tokens. Ingestion jobs only read the model's weights and write SQLite, so they run beside a chat.
An uploaded file is only checked in the request (``check_upload``); its text is extracted by the job, in a child
process held to ``limits`` (``sandbox``), so a hostile file costs its own job and cancelling the job ends it at once.
Changing the model waits for no one: it is refused while a job runs.

A bank's memory is loaded on first use and reloaded when its contents change (new or removed documents). The chat
of a bank is stored in the bank; when it outgrows the local window its oldest turns move into memory (``Chat``).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from longmem.ingest.limits import ExtractLimits
from longmem.ingest.pipeline import ingest as ingest_file
from longmem.ingest.readers import BOOK_SUFFIXES, SUPPORTED, DemoFormat, check_source, open_source
from longmem.ingest.titles import book_title
from longmem.memory.memory import Memory, MemoryView
from longmem.model.lm import Sampling
from longmem.service.classifier_builder import ClassifierBuilder
from longmem.service.jobs import JobContext, JobManager, JobState
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.directory import name_base
from longmem.storage.records import BankBusy, BankError, BankExists
from longmem.tasks.chat import Chat
from longmem.tasks.answer import ANSWER_SAMPLING, answer
from longmem.tasks.reading import DEFAULT_FINDER, PASSAGES_READ, Citation, PassageFinder, Reading
from longmem.text.io import InputError, stream_text

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 512 * 2**20  # files larger than this are refused before any work starts
LOADED_BANKS = 2  # bank memories kept in RAM at once (least recently used is dropped)
PASSAGES = 3  # passages shown under an answer


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
    reading: str = DEFAULT_FINDER  # passages a chat reads before answering: found by "lexical", "fused" or "memory"
    #                                ranking (``longmem.tasks.reading``), or "none" (the paper's memory fusion alone)
    passages: int = PASSAGES_READ  # passages read at most (within what the window leaves for them)
    backbone_stops: bool = ANSWER_SAMPLING.backbone_stops  # an answer also ends where the frozen backbone would
    abstain: bool = True  # an answer the passages read do not support says that the book does not say

    def reading_config(self) -> Reading:
        """How a chat answer reads its bank under these settings (``tasks.reading.Reading``)."""
        return Reading(finder=self.reading, passages=self.passages,
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
class PassageHit:
    """A passage behind an answer: the chunk memory retrieved, its surroundings and where it is."""
    document: str  # title of the book (or "this conversation" for chat turns moved into memory)
    location: str  # e.g. "part 12 of 40"
    text: str  # the retrieved chunk
    context: str  # the chunk with its neighbours
    hits: int  # how many times (heads x tokens) it was retrieved


@dataclass(frozen=True)
class BankSummary:
    name: str
    documents: int
    tokens: int
    disk_bytes: int
    backbone: str  # the backbone the bank was built with
    chunk_size: int
    matches_model: bool  # whether the loaded model can use it
    busy: bool  # a job is writing it
    updated: str


def _stored(turn: dict) -> dict:
    """What a stored turn keeps beside its text: {"retrieved", "read", "said"} (before 0.2, a list: retrieved)."""
    return turn["passages"] if isinstance(turn["passages"], dict) else {"retrieved": turn["passages"]}


def _chat_turns(bank: Bank) -> list[dict]:
    """The bank's conversation as a ``Chat`` keeps it: an answer that said the book does not say is marked so."""
    return [{"role": t["role"], "content": t["content"], **({} if _stored(t).get("said", True) else {"said": False})}
            for t in bank.chat_turns(passages=True)]


def _citation(stored: dict) -> Citation:
    """A citation as the bank stored it (JSON: the support span is a list, absent before it existed)."""
    support = stored.get("support")
    return Citation(**{**stored, "support": tuple(support) if support else None})


class Reply:
    """The streamed output of a request: iterate for text pieces; ``text`` and ``passages`` once it is finished.
    ``cancel()`` stops the generation between two tokens (also done when the iterator is closed early)."""

    _END = object()

    def __init__(self):
        self.pieces: list[str] = []
        self.passages: list[PassageHit] = []  # what memory retrieved most while answering
        self.citations: list[Citation] = []  # the passages the answer read, numbered as in its prompt
        self.said = True  # False: the reply says that the book does not say (the citations are the closest passages)
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
        try:
            while True:
                item = self._queue.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._stop.set()  # a reader that stops early stops the generation

    # -- producer side (the worker thread) ----------------------------------------------------------------------
    def _emit(self, piece: str) -> None:
        self.pieces.append(piece)
        self._queue.put(piece)

    def _finish(self, error: BaseException | None = None) -> None:
        if error is not None:
            self._queue.put(error)
        self._queue.put(self._END)
        self.done.set()


@dataclass
class _Session:
    """A bank's memory as loaded in RAM, its version, and its conversation."""
    bank: Bank
    version: tuple[int, int]  # (epoch, chunks) of the bank when loaded
    stored: Memory  # the bank's memory at its own chunk size
    chunk_size: int  # chunk size of ``memory``
    memory: Memory  # ``stored`` re-chunked to ``chunk_size`` (same K/V), plus what the chat moved into it
    bank_chunks: int  # chunks of ``stored`` that come from the bank (what a chat adds comes after them)
    chat: Chat | None = None
    finder: PassageFinder | None = None  # ranks the bank's passages for questions (made on first use)


class Workspace:
    def __init__(self, model, directory: BankDirectory, max_upload_bytes: int = MAX_UPLOAD_BYTES,
                 checkpoint: str | None = None, work_dir: str | os.PathLike | None = None,
                 limits: ExtractLimits | None = None, dtype: str = "auto"):
        self.model = model.eval()  # the app's model only answers: eval mode (LoRA projections merged)
        self.limits = limits or ExtractLimits()  # what one uploaded file may expand to while its text is read
        self.dtype = dtype  # the dtype asked for ("auto" or a name); ``load_model`` uses it unless told another
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self._own_work_dir = False  # a temporary work dir made here is removed by close()
        self.directory = directory
        self.jobs = JobManager()
        self.max_upload_bytes = max_upload_bytes
        self.checkpoint = checkpoint  # where the SideNet came from (None = shipped default or untrained)
        self._lock = threading.RLock()  # one model call at a time; guards the sessions
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self.classifiers = ClassifierBuilder(self)  # build, evaluate and use classifiers saved in banks

    # -- the model ------------------------------------------------------------------------------------------------
    def model_info(self) -> dict:
        """What is loaded: backbone, SideNet checkpoint and its provenance, sizes and memory use."""
        import psutil

        from longmem.model.backbone import dtype_choice

        m, bb = self.model, self.model.backbone
        spec = bb.spec
        trained = bool(m.provenance)
        dtype = str(bb.dtype).removeprefix("torch.")
        chosen, why = dtype_choice(self.dtype, bb.device)
        return {
            "backbone": bb.name, "backbone_sha256": bb.fingerprint(), "layers": spec.n_layers,
            "heads": f"{spec.n_heads} query / {spec.n_kv_heads} key-value, head dim {spec.head_dim}",
            "dtype": dtype, "dtype_reason": why if chosen == bb.dtype else f"{dtype}, as the model was given",
            "device": str(bb.device),
            "backbone_params": sum(p.numel() for p in bb.model.parameters()),
            "sidenet_params": sum(p.numel() for p in m.sidenet.parameters()),
            "sidenet": self.checkpoint or ("shipped default" if trained else "untrained (reproduces the backbone)"),
            "provenance": m.provenance,
            "memory_layer": m.config.memory_layer, "cached_layer": m.cached_layer, "chunk_size": m.chunk_size,
            "topk": m.config.topk, "segment_len": m.segment_len,
            "loaded_banks": list(self._sessions), "bank_memory_bytes": self.memory_bytes(),
            "process_rss_bytes": psutil.Process().memory_info().rss,
        }

    def known_models(self) -> list[str]:
        """Backbones to offer: "default", the models fetched on request and the GGUF files converted before
        (``backbone.known_backbones``)."""
        from longmem.model.backbone import known_backbones

        return known_backbones()

    def load_model(self, backbone: str, checkpoint: str | None = None, dtype: str | None = None) -> dict:
        """Replace the model: a local .gguf file or Hugging Face model directory (or "default") and optionally a SideNet
        checkpoint trained for it (refused, with the reason, when it was trained for another backbone), in ``dtype``
        ("auto" or a name; None: the workspace's). Refused while a job runs. Banks built for the old backbone stay
        on disk and are usable again with it."""
        from longmem.model.backbone import load_backbone, resolve_dtype
        from longmem.model.longmem import LongMemConfig, LongMemModel

        if any(j.active for j in self.jobs.list()):
            raise BankBusy("a job is running; wait for it or cancel it before changing the model")
        backbone = (backbone or "default").strip()
        device = str(self.model.backbone.device)
        dtype = dtype or self.dtype
        with self._lock:
            bb = load_backbone(backbone, resolve_dtype(dtype, device), device)
            if checkpoint and checkpoint.strip():
                model = LongMemModel.load(checkpoint.strip(), bb, device)
            else:
                from longmem.model.longmem import shipped_checkpoint

                ckpt = shipped_checkpoint(backbone)
                window = min(LongMemConfig.segment_len, bb.spec.max_positions)  # a small model's context bounds it
                model = LongMemModel.load(ckpt, bb, device) if ckpt else LongMemModel(bb, LongMemConfig(
                    backbone=backbone, segment_len=window))
            for name in list(self._sessions):
                self._drop(name)
            self.model, self.dtype = model.eval(), dtype  # inference only (LoRA projections merged)
            self.checkpoint = checkpoint.strip() if checkpoint and checkpoint.strip() else None
        return self.model_info()

    # -- banks ----------------------------------------------------------------------------------------------------
    def banks(self) -> list[BankSummary]:
        out = []
        for name in self.directory.names():
            try:
                with self.directory.open(name) as bank:
                    info, stats = bank.info, bank.stats()
                    out.append(BankSummary(
                        name=name, documents=stats["documents"], tokens=stats["tokens"],
                        disk_bytes=stats["disk_bytes"], backbone=info.backbone_name, chunk_size=info.chunk_size,
                        matches_model=self._matches(bank), busy=self.jobs.busy(name), updated=info.updated))
            except BankError as e:  # one damaged bank must not hide the others
                log.warning("bank %s: %s", name, e)
        return out

    def _matches(self, bank: Bank) -> bool:
        try:
            bank.check(self.model)
            return True
        except BankError:
            return False

    def create_bank(self, name: str) -> None:
        """A new empty bank for the loaded model (its backbone, cached layer and chunk size)."""
        self.directory.create(name, self.model).close()

    def rename_bank(self, old: str, new: str) -> None:
        self._idle(old)
        with self._lock:
            self._drop(old)
            self.directory.rename(old, new)

    def delete_bank(self, name: str) -> None:
        self._idle(name)
        with self._lock:
            self._drop(name)
            self.directory.delete(name)

    def documents(self, name: str) -> list:
        with self.directory.open(name) as bank:
            return bank.documents()

    def delete_document(self, name: str, doc_id: int):
        self._idle(name)
        with self.directory.open(name) as bank:
            return bank.delete_document(doc_id)

    def _idle(self, name: str) -> None:
        if self.jobs.busy(name):
            raise BankBusy(f"bank {name!r} is being written by a running job; wait for it or cancel it first")

    # -- ingestion ------------------------------------------------------------------------------------------------
    def check_upload(self, path: str | os.PathLike, demos: DemoFormat | None = None) -> None:
        """Refuse a file before any work starts: too large, unsupported, binary, empty, not of its kind
        (``readers.check_source``). Reads only what that takes, in this process: the text itself is extracted once,
        by the job, in a child process held to ``limits``."""
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{p.name}: no such file")
        size = p.stat().st_size
        if size > self.max_upload_bytes:
            raise InputError(f"{p.name} is {size / 2**20:,.0f} MiB; the limit is "
                             f"{self.max_upload_bytes / 2**20:,.0f} MiB")
        if p.suffix.lower() not in SUPPORTED:
            raise InputError(f"{p.name}: unsupported file type {p.suffix or '(none)'}; use one of "
                             f"{', '.join(SUPPORTED)}")
        check_source(p, demos, self.limits)

    def ingest(self, name: str, paths: list, demos: DemoFormat | None = None, create: bool = False,
               titles: list[str] | None = None) -> str:
        """Start a job that reads ``paths`` into bank ``name``; returns the job id. Every file is checked first.
        ``titles`` are the files' names as the user knows them (an upload's; default: the paths' own), shown in the
        job; a document is titled with the title its file gives itself (``Source.own_title``: EPUB or PDF metadata,
        HTML <title>, a Gutenberg header), else with that name without its extension."""
        if not paths:
            raise InputError("no file to ingest")
        for p in paths:
            self.check_upload(p, demos)
        if not self.directory.exists(name):
            if not create:
                self.directory.open(name)  # raises UnknownBank with the list of banks
            self.create_bank(name)
        with self.directory.open(name) as bank:
            bank.check(self.model)
        paths = [Path(p) for p in paths]
        return self._submit_ingest(name, paths, titles or [p.name for p in paths], demos)

    def _submit_ingest(self, name: str, paths: list[Path], titles: list[str], demos: DemoFormat | None,
                       documents: list[str] | None = None) -> str:
        """The ingestion job of files already checked, into a bank that exists and fits the model."""
        return self.jobs.submit("ingest", name, ", ".join(titles),
                                self.ingest_work(name, paths, titles, demos, documents=documents))

    def add_book(self, path: str | os.PathLike, title: str | None = None) -> tuple[str, str]:
        """A new user's one step: a new bank named after the book and the job that reads the book into it. Returns
        ``(bank name, job id)``. ``title`` is the file's name as the user knows it (an upload's; default: the path's
        own). The book's own title (``titles.book_title``: EPUB or PDF metadata, HTML <title>, a Gutenberg header),
        else that name without its extension, titles the document and names the bank (``BankDirectory.free_name``,
        so "A Lost Lady" -> "a-lost-lady", then "a-lost-lady-2"; the file's name when the title gives no name, as one
        in another script). The file is checked before the bank is made, so a refused file leaves no bank behind; a
        demonstration file is refused (it needs its columns and template: ``ingest``)."""
        title = title or Path(path).name
        if Path(title).suffix.lower() not in BOOK_SUFFIXES:
            raise InputError(f"{title}: a book is one of {', '.join(BOOK_SUFFIXES)}; labelled examples "
                             "(.csv, .tsv, .jsonl) build a classifier instead")
        self.check_upload(path)
        stem = Path(title).stem
        book = book_title(path, self.limits) or stem
        base = book if name_base(book) else stem
        for _ in range(100):  # another process may take the free name first
            name = self.directory.free_name(base)
            try:
                self.create_bank(name)
                break
            except BankExists:
                continue
        else:
            raise BankError(f"could not make a bank for {title!r}")
        return name, self._submit_ingest(name, [Path(path)], [title], None, [book])  # checked; the bank is the model's

    def loading(self, name: str) -> JobState | None:
        """The newest job that wrote (or writes) into bank ``name``, if the job manager still remembers one."""
        jobs = self.jobs.list(name)
        return jobs[0] if jobs else None

    def ingest_work(self, name: str, paths: list[Path], titles: list[str], demos: DemoFormat | None,
                    then: Callable[[Bank], str] | None = None,
                    documents: list[str] | None = None) -> Callable[[JobContext], str]:
        """The work of a job that reads ``paths`` (shown by their ``titles``, the files' names) into bank ``name``,
        then runs ``then`` on the bank. A document is titled ``documents[i]`` if given, else with the title the file
        gives itself (``Source.own_title``, found as its text is extracted), else with ``titles[i]`` without its
        extension."""
        model = self.model

        def work(ctx: JobContext) -> str:
            done, lines = 0, []
            with self.directory.open(name) as bank:
                for i, (path, title) in enumerate(zip(paths, titles)):
                    ctx.new_file(f"{title} ({i + 1}/{len(paths)})")
                    base = done

                    def progress(b, total, tokens, base=base):
                        ctx.progress(b, total, base + tokens)
                    with open_source(path, demos, self.limits, ctx.check) as source:  # the text, extracted once
                        document = documents[i] if documents is not None else source.own_title or Path(title).stem
                        res = ingest_file(bank, model, source, demos=demos, title=document, progress=progress)
                    done += res.tokens
                    lines.append(f"{title}: {res.action}, {res.document.n_tokens:,} tokens" if res.action != "skipped"
                                 else f"{title}: already in the bank, skipped")
                if then is not None:
                    lines.append(then(bank))
            return "; ".join(lines)

        return work

    # -- memory ---------------------------------------------------------------------------------------------------
    def _drop(self, name: str) -> None:
        s = self._sessions.pop(name, None)
        if s is not None:
            s.bank.close()

    def session(self, name: str, chunk_size: int | None = None) -> _Session:
        """The loaded memory of a bank, (re)loaded when the bank changed; callers hold the lock."""
        s = self._sessions.get(name)
        if s is not None:
            try:
                version = s.bank.version()
            except BankError:  # renamed or deleted behind our back
                version = None
            # the bank changed, or other chunks are asked for
            if version != s.version or (chunk_size is not None and chunk_size != s.chunk_size):
                self._drop(name)
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
            s = _Session(bank=bank, version=version, stored=stored, chunk_size=memory.chunk_size, memory=memory,
                         bank_chunks=stored.rows[0].n)
            self._sessions[name] = s
            while len(self._sessions) > LOADED_BANKS:
                self._drop(next(iter(self._sessions)))
        self._sessions.move_to_end(name)
        return s

    def memory_bytes(self) -> int:
        """RAM held by the loaded bank memories (keys and values)."""
        total = 0
        for s in list(self._sessions.values()):
            r = s.stored.rows[0]
            total += r.k.numel() * r.k.element_size() * 2
        return total

    # -- chat -----------------------------------------------------------------------------------------------------
    def chat_history(self, name: str) -> list[dict]:
        """The bank's stored conversation, oldest first: {"role", "content", "passages": [PassageHit], "citations":
        [Citation], "said"} per turn (what memory retrieved, what the answer read, False when the answer said that
        the book does not say)."""
        with self.directory.open(name) as bank:
            turns = bank.chat_turns(passages=True)
        out = []
        for t in turns:
            stored = _stored(t)
            out.append({**t, "passages": [PassageHit(**p) for p in stored.get("retrieved", [])],
                        "citations": [_citation(c) for c in stored.get("read", [])], "said": stored.get("said", True)})
        return out

    def clear_chat(self, name: str) -> None:
        with self._lock:
            self._drop(name)  # turns moved into memory leave with it
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
            if s.chat is None:
                s.chat = Chat(self.model, s.memory, history=_chat_turns(s.bank))
            chat = s.chat
            chat.sampling = settings.sampling(chat.sampling.stop_ids)
            if settings.reading != "none" and s.finder is None:
                s.finder = PassageFinder(s.bank, self.model, s.memory)
            made = answer(chat, s.finder, question, settings.reading_config(), settings.chunks,
                          stop=lambda: reply.cancelled)
            reply.citations = made.citations
            try:
                for piece in made:
                    reply._emit(piece)
                    if reply.cancelled:
                        break
            finally:
                made.close()
            if not made.complete:  # stopped: an unfinished answer is not part of the conversation
                return
            reply.citations, reply.said = made.citations, made.said
            reply.passages = self._passages(s, made.view)
            question_turn, answer_turn = chat.history[-2:]
            stored = {"read": [asdict(c) for c in reply.citations], "retrieved": [asdict(p) for p in reply.passages],
                      "said": reply.said}
            s.bank.add_chat_turns([question_turn, {**answer_turn, "passages": stored}])

        return self._start(run)

    # -- continue -------------------------------------------------------------------------------------------------
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
                reply._emit(piece)
                if reply.cancelled:
                    return
            reply.passages = self._passages(s, view)

        return self._start(run)

    def scratch_dir(self) -> Path:
        """Where derived files go (demonstration splits, plots, result CSVs): ``work_dir``, else a temporary
        directory that ``close()`` removes."""
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="longmem-"))
            self._own_work_dir = True
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return self.work_dir

    def close(self) -> None:
        """Stop waiting work, release the loaded banks and remove the temporary files this workspace made."""
        for j in self.jobs.list():
            if j.active:
                self.jobs.cancel(j.id)
        with self._lock:
            for name in list(self._sessions):
                self._drop(name)
        if self._own_work_dir and self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir, self._own_work_dir = None, False

    # -- running model calls ----------------------------------------------------------------------------------------
    def _start(self, run: Callable[[Reply], None]) -> Reply:
        reply = Reply()

        def target() -> None:
            try:
                with self._lock, torch.inference_mode():
                    run(reply)
            except BaseException as e:  # handed to the reader, who shows it
                if not isinstance(e, (InputError, BankError, ValueError)):
                    log.exception("request failed")
                reply._finish(e)
                return
            reply._finish()

        threading.Thread(target=target, name="longmem-request", daemon=True).start()
        return reply

    def run_locked(self, fn: Callable[[], object]):
        """Run ``fn`` under the model lock (for callers that use the model directly, e.g. classification)."""
        with self._lock, torch.inference_mode():
            return fn()

    def loaded_memory(self, name: str, chunk_size: int | None = None) -> Memory:
        """A bank's memory as used by requests (load it if needed); call under ``run_locked``."""
        return self.session(name, chunk_size).memory

    def _passages(self, s: _Session, view: MemoryView) -> list[PassageHit]:
        """The passages behind an answer: the most retrieved chunks, one per neighbourhood. A segment's first chunk
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
                    p = s.bank.passage(coarse)
                except KeyError:
                    continue
                if p.chunk == 0:
                    continue
                out.append(PassageHit(document=p.document, location=f"part {p.segment + 1} of {p.of_segments}",
                                      text=p.text, context=p.context, hits=hits))
            else:
                try:
                    ids = s.memory.chunk_tokens(0, serial)
                except KeyError:
                    continue
                text = tok.decode([int(i) for i in ids if i >= 0])
                out.append(PassageHit(document="this conversation", location="earlier turns", text=text,
                                      context=text, hits=hits))
            if len(out) == PASSAGES:
                break
        return out
