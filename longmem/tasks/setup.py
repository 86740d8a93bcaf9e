"""The reading set-up, built in one place: which model reads a bank's found passages and writes the answer, with what
window, and how it reads (``Reading``). The CLI's chat, the service's chat, the evaluation's entrants and the
benchmarks all take it from here.

    setup = reading_setup(model, "auto")               # the best installed reader, with its own window and settings
    chat = Chat(setup.lm, memory if setup.own else None, ANSWER_SAMPLING)
    reply = answer(chat, finder, question, setup.reading, reader=setup.label)

Who reads. The bank's own LongMem model (``own``: it reads the bank's memory, in its own 1,024-token window, as the
paper's LongMem does), or another reader (``model.readers``): the frozen backbone of that model alone, memory off, in
a window of its own (``ReaderProfile.window``): a 1.5B reader with a 32k context is not held to the 135M's 1,024
tokens. How a reader reads by default is its profile (``READER_PROFILES``): the ``Reading`` fields it was tuned with
on the project's tuning sets (docs/design.md, "How a larger reader reads"); a field the asker chose (``told``) stays
as chosen. A reader without a profile reads as the bank's model does, in the bank model's window.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from longmem.model import readers
from longmem.tasks.reading import Reading


@dataclass(frozen=True)
class ReaderProfile:
    """How a reader reads unless told: its window and its ``Reading`` fields."""

    window: int | None = None  # tokens of its window (the prompt, the passages read and the answer; None: the bank
    #                            model's own); bounded by the reader's native context
    reading: dict = field(default_factory=dict)  # ``Reading`` fields


READER_PROFILES: dict[str, ReaderProfile] = {
    # Qwen2.5-Coder-1.5B-Instruct (32k native context). Told to say that the book does not say, held to it only when
    # >= 70% sure of it, an answer shown only when each of its first 4 tokens had >= 10% probability, the lexical
    # check at 0.5; it reads the lexical finder's best 4 passages in the bank model's window (issue 69's choices on
    # the tuning sets). Spans in a window of its own (``Reading.spans``, ``tasks.spans``) were measured on the same
    # sets in issue 85 and not chosen: they read the evidence for more questions and get more drafts right, but
    # the reader then answers questions the book does not answer, and the checks that stop it keep fewer right
    # answers than these settings do (48 against 61 of 128 within 20% wrong and 75% declined; docs/design.md). Its
    # own Yes, asked whether the excerpts state its answer (``Reading.confirm``), was measured too and not chosen: it
    # says Yes to right and invented answers alike (AUC 0.64; docs/design.md)
    "qwen2.5-coder-1.5b": ReaderProfile(reading={"prompt": "book-or-not", "decline": 0.7, "sure": 0.1}),
}


def reader_settings(reader: str, told: frozenset[str] | set[str] = frozenset()) -> dict:
    """Reader ``reader``'s own ``Reading`` fields (its profile; a name as ``model.readers`` takes it) but those the
    asker chose (``told``: field names, e.g. {"abstain"} when the check was turned off)."""
    own = READER_PROFILES.get(reader, ReaderProfile()).reading
    return {k: v for k, v in own.items() if k not in told}


def reading_for(reader: str, reading: Reading, told: frozenset[str] | set[str] = frozenset()) -> Reading:
    """``reading`` as reader ``reader`` reads it: its own settings in place of those the asker did not choose
    (``reader_settings``)."""
    own = reader_settings(reader, told)
    return replace(reading, **own) if own else reading


def reader_window(reader: str, model) -> int:
    """Tokens of reader ``reader``'s window: its profile's, else the bank model's (``model.segment_len``)."""
    return READER_PROFILES.get(reader, ReaderProfile()).window or model.segment_len


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
