"""What every tab shares: turning library errors into readable messages, and small formatting helpers."""

from __future__ import annotations

import functools
import inspect
import logging

import gradio as gr

from longmem.backbone import BackboneError
from longmem.bank import BankError
from longmem.model import CheckpointError
from longmem.text import InputError

log = logging.getLogger("longmem.app")

EXPECTED = (InputError, BankError, BackboneError, CheckpointError, ValueError, KeyError, FileNotFoundError)


def _message(e: BaseException) -> str:
    if isinstance(e, EXPECTED):
        text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        return text or type(e).__name__
    log.exception("unexpected error in a handler")
    return f"Something went wrong ({type(e).__name__}: {e}). The details are in the app's log."


def friendly(fn):
    """Show a handler's failure as a readable message in the page (never a stack trace)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as e:
                raise gr.Error(_message(e), print_exception=False) from None
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as e:
            raise gr.Error(_message(e), print_exception=False) from None
    return call


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def file_paths(files) -> list[str]:
    """Paths of what a gr.File gave (one file, several, or none)."""
    if not files:
        return []
    files = files if isinstance(files, list) else [files]
    return [f if isinstance(f, str) else getattr(f, "name", str(f)) for f in files]


def parse_label_words(text: str | None) -> dict[str, str] | None:
    """"0=negative,1=positive" -> {"0": "negative", "1": "positive"}; empty -> None (labels as written)."""
    if not text or not text.strip():
        return None
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"label words are VALUE=WORD pairs like 0=negative,1=positive; got {item!r}")
        out[key.strip()] = value.strip()
    return out
