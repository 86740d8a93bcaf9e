"""The reading set-up, built in one place: which model reads a bank's found passages and writes the answer, with what
window, and how it reads (``Reading``). The CLI's chat, the service's chat, the evaluation's entrants and the
benchmarks all take it from here.

    setup = reading_setup(model, "auto")               # the best installed reader, with its own window and settings
    chat = Chat(setup.lm, memory if setup.own else None, ANSWER_SAMPLING)
    reply = answer(chat, finder, question, setup.reading, reader=setup.label)

Who reads. The bank's own LongMem model (``own``: it reads the bank's memory, in its own 1,024-token window, as the
paper's LongMem does), or another reader (``model.readers``): the frozen backbone of that model alone, memory off, in
a window of its own (``ReaderProfile.window``): a 1.5B reader with a 32k context is not held to the 135M's 1,024
tokens. How a reader reads by default is its profile (``READER_PROFILES``): its window and ``Reading`` fields; a field
the asker chose (``told``) stays as chosen. A reader without a profile of its own reads as the RAG script a user would
write with it reads (``SCRIPT_READING``: windows of the book's raw text by BM25, the script's prompt, no check).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from longmem.model import readers
from longmem.model.lm import Sampling
from longmem.tasks.reading import Reading
from longmem.tasks.windows import WINDOW_TOKENS, WINDOWS_READ


@dataclass(frozen=True)
class ReaderProfile:
    """How a reader reads unless told: its window and its ``Reading`` fields."""

    window: int | None = None  # tokens of its window (the prompt, the passages read and the answer; None: the bank
    #                            model's own); bounded by the reader's native context
    reading: dict = field(default_factory=dict)  # ``Reading`` fields
    sampling: dict = field(default_factory=dict)  # ``Sampling`` fields it decodes an answer with, in place of the
    #                                               chat's (``decoding``)


SCRIPT_READING = ReaderProfile(window=WINDOW_TOKENS, reading={
    "finder": "windows", "prompt": "plain", "passages": WINDOWS_READ, "budget": 3072, "best_last": False,
    "abstain": 0.0, "decline": 0.0, "sure": 0.0, "spans": False}, sampling={"no_repeat": 0})
# How a reader other than the bank's model reads unless its profile says otherwise: as the RAG script a user would
# write with it (``eval.ragscript``): the best four windows of the book's raw text by BM25 (``tasks.windows``), best
# first, in the script's one-line prompt, in a 4,096-token window of its own, decoded greedily as the script decodes
# (no ban on repeated 4-grams: that is the 135M's), with no check. On books no choice was
# tuned on the script answered more questions than the passages and checks the 1.5B was tuned with in issues 69 and
# 85 (27 against 17 of 45 held out; 32 against 15 of the 48 aside), so issue 92 made its reading the base and any
# addition earns its place on sets no choice was made on (docs/design.md, "A reader other than the bank's model
# reads as the RAG script does").

READER_PROFILES: dict[str, ReaderProfile] = {
    "qwen2.5-coder-1.5b": SCRIPT_READING,  # Qwen2.5-Coder-1.5B-Instruct (32k native context), the default reader
}


def profile(reader: str) -> ReaderProfile:
    """Reader ``reader``'s profile (a name as ``model.readers`` takes it): its own, else ``SCRIPT_READING``."""
    return READER_PROFILES.get(reader, SCRIPT_READING)


def reader_settings(reader: str, told: frozenset[str] | set[str] = frozenset()) -> dict:
    """Reader ``reader``'s own ``Reading`` fields (its profile; a name as ``model.readers`` takes it) but those the
    asker chose (``told``: field names, e.g. {"abstain"} when the check was turned off)."""
    own = profile(reader).reading
    return {k: v for k, v in own.items() if k not in told}


def reading_for(reader: str, reading: Reading, told: frozenset[str] | set[str] = frozenset()) -> Reading:
    """``reading`` as reader ``reader`` reads it: its own settings in place of those the asker did not choose
    (``reader_settings``)."""
    own = reader_settings(reader, told)
    return replace(reading, **own) if own else reading


def decoding(reader: str, sampling: Sampling) -> Sampling:
    """``sampling`` as reader ``reader`` decodes an answer: its profile's ``Sampling`` fields in place of the chat's."""
    own = profile(reader).sampling
    return replace(sampling, **own) if own else sampling


def reader_window(reader: str, model) -> int:
    """Tokens of reader ``reader``'s window: its profile's, else the bank model's (``model.segment_len``)."""
    return profile(reader).window or model.segment_len


def load(reader: str, model, window: int | None = None):
    """Reader ``reader`` (resolved: ``readers.choose``) as the frozen backbone alone, with its own window (``window``
    tokens when given), in the bank model's dtype and on its device."""
    bb = model.backbone
    return readers.load_reader(reader, bb.dtype, bb.device, window or reader_window(reader, model))


def resolve(model, reader: str | None, default: str | None = None) -> tuple[str, bool]:
    """The reader ``reader`` stands for (None: ``default``, else ``readers.default_for`` the model's backbone) and
    whether it is the bank's own model ``model``."""
    name = readers.choose(reader or default) if (reader or default) else readers.default_for(model.config.backbone)
    return name, readers.same_model(name, model.config.backbone)


@dataclass
class ReadingSetup:
    """Who reads and how: the model (``lm``), its resolved name, whether it is the bank's own model (then it reads
    the bank's memory), and the ``Reading``."""

    name: str
    lm: object
    own: bool
    reading: Reading

    @property
    def label(self) -> str:
        return readers.label(self.name)

    def decoding(self, sampling: Sampling) -> Sampling:
        """``sampling`` as this reader decodes an answer: as given for the bank's own model, else as its profile
        says (``decoding``)."""
        return sampling if self.own else decoding(self.name, sampling)


def reading_setup(model, reader: str | None = None, reading: Reading | None = None,
                  told: frozenset[str] | set[str] = frozenset(), default: str | None = None,
                  loader: Callable[[str], object] | None = None) -> ReadingSetup:
    """The set-up of a chat over the banks of LongMem model ``model`` whose asker named ``reader`` (None: ``default``,
    else the best installed: ``resolve``) and chose ``reading``'s fields ``told`` (the rest: the reader's profile).
    ``loader(name)``: loads another reader (default ``load``; the service passes its cache)."""
    reading = reading or Reading()
    name, own = resolve(model, reader, default)
    if own:
        return ReadingSetup(name, model, True, reading)
    lm = (loader or (lambda n: load(n, model)))(name)
    return ReadingSetup(name, lm, False, reading_for(name, reading, told))
