"""What every tab shares: turning library errors into readable messages, and small formatting helpers."""

from __future__ import annotations

import functools
import html
import inspect
import logging

import gradio as gr

from longmem.ingest.readers import BOOK_SUFFIXES, DEMO_EXTS
from longmem.model.backbone import BackboneError
from longmem.model.longmem import CheckpointError
from longmem.service.jobs import JobState
from longmem.storage.records import BankError
from longmem.text.io import InputError

log = logging.getLogger("longmem.app")

BOOK_TYPES = list(BOOK_SUFFIXES)  # what an upload box takes as a book
DEMO_TYPES = list(DEMO_EXTS)  # ... as labelled examples
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


def job_html(j: JobState) -> str:
    """One job as the page shows it: bank, step, status, a progress bar, and tokens, speed, bytes and time left while
    it runs (its outcome or error once it ended). ``data-status`` and ``data-job`` are for tests and scripts."""
    pct = 100 * (1.0 if j.status == "done" else j.fraction)
    # the total is known in bytes; in tokens it is estimated from the tokens per byte seen so far
    total = f"~{j.file_tokens * j.bytes_total / j.bytes_done:,.0f}" if j.bytes_done else "?"
    detail = html.escape(j.message) if not j.active else (
        f"{j.file_tokens:,} / {total} tokens · {j.tokens_per_s:,.0f} tok/s · {j.bytes_done / 2**20:,.2f} / "
        f"{j.bytes_total / 2**20:,.2f} MiB · {duration(j.eta_s)} left")
    return (f"<div class='job' data-status='{j.status}' data-job='{j.id}'><b>{html.escape(j.bank)}</b> · "
            f"{html.escape(j.step or j.title)} · <span class='job-status'>{j.status}</span><br>"
            f"<progress max='100' value='{pct:.1f}' style='width:100%'></progress><br><small>{detail}</small></div>")
