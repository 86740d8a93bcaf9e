"""What every tab shares: how a handler's outcome reaches the page (``wire``: errors and confirmations in the tab's
notice line, beside the work, never over it; the same handler served to API clients, where a failure raises),
readable messages that name the user's own files, and small formatting helpers."""

from __future__ import annotations

import functools
import html
import inspect
import logging
import re

import gradio as gr
from gradio.utils import get_upload_folder

from longmem.service import (
    BOOK_SUFFIXES,
    DEMO_SUFFIXES,
    BackboneError,
    BankError,
    CheckpointError,
    InputError,
    JobState,
)

log = logging.getLogger("longmem.app")

BOOK_TYPES = list(BOOK_SUFFIXES)  # what an upload box takes as a book
DEMO_TYPES = list(DEMO_SUFFIXES)  # ... as labelled examples
EXPECTED = (InputError, BankError, BackboneError, CheckpointError, ValueError, KeyError, FileNotFoundError)


def own_names(text: str) -> str:
    """``text`` with every uploaded file's temporary path (``/tmp/gradio/<hash>/book.txt``) cut to the name the user
    gave the file (``book.txt``): errors name the user's file, never the server's copy of it."""
    return re.sub(re.escape(get_upload_folder().rstrip("/")) + r"/[^/\s]+/", "", text)


def _message(e: BaseException) -> str:
    if isinstance(e, EXPECTED):
        text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        return own_names(text or type(e).__name__)
    log.exception("unexpected error in a handler")
    return f"Something went wrong ({type(e).__name__}: {own_names(str(e))}). The details are in the app's log."


def notice_html(text: str = "", kind: str = "error") -> dict:
    """What a tab's notice line shows: nothing (hidden), an error, or a short confirmation (``kind`` "info")."""
    if not text:
        return gr.update(value="", visible=False)
    icon = "⚠" if kind == "error" else "✓"
    return gr.update(value=f"<div class='notice notice-{kind}' role='{'alert' if kind == 'error' else 'status'}'>"
                           f"{icon} {html.escape(text)}</div>", visible=True)


def notice_box(elem_id: str) -> gr.HTML:
    """A tab's notice line (hidden until there is something to say): errors and confirmations appear here, next to
    the work, instead of in toasts and "Error" badges over the conversation and the input boxes."""
    return gr.HTML(visible=False, elem_id=elem_id, elem_classes=["notice-box"], padding=False)


class Told:
    """A handler's result that also puts a confirmation in its tab's notice line: ``Told("removed x", a, b)``."""

    def __init__(self, message: str, *values):
        self.message = message
        self.values = values


def _values(result, n_outputs: int) -> tuple:
    result = result.values if isinstance(result, Told) else (result,) if n_outputs == 1 else result
    return tuple(result or ())


def _handled(fn, done, failed):
    """``fn`` (a function or a generator function) with ``done`` applied to each result and ``failed`` to an
    exception it raises (``failed`` returns what to give instead, or raises)."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                for result in fn(*args, **kwargs):
                    yield done(result)
            except Exception as e:
                yield failed(e)
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return done(fn(*args, **kwargs))
        except Exception as e:
            return failed(e)
    return call


def reported(fn, n_outputs: int):
    """``fn`` with its outputs preceded by the notice's: cleared on success (or a ``Told`` confirmation); on failure
    the error's message, and every other output left as it is (``gr.skip``), so that nothing the user typed or was
    shown disappears."""
    def ok(result) -> tuple:
        said = notice_html(result.message, "info") if isinstance(result, Told) else notice_html()
        return (said, *_values(result, n_outputs))

    return _handled(fn, ok, lambda e: (notice_html(_message(e)), *[gr.skip()] * n_outputs))


def friendly(fn, n_outputs: int = 1):
    """``fn`` for API clients: a failure raises a readable ``gr.Error`` (never a stack trace); a ``Told`` result
    gives its values, and the page's show/hide updates give their values."""
    def plain(value):
        return value["value"] if isinstance(value, dict) and value.get("__type__") == "update" and "value" in value \
            else value

    def unwrap(result):
        values = _values(result, n_outputs)
        return plain(values[0]) if n_outputs == 1 else tuple(plain(v) for v in values)

    def fail(e: Exception):
        raise gr.Error(_message(e), print_exception=False) from None

    return _handled(fn, unwrap, fail)


def wire(event, fn, inputs, outputs: list, notice: gr.HTML, api_name: str | None = None, **kwargs):
    """``event(fn, inputs, outputs)`` for the page, with ``fn``'s errors shown in ``notice`` (a ``notice_box``) and
    its progress only on ``outputs``; returns that event (for ``.then``, ``cancels``). With ``api_name``, ``fn`` is
    also served under that name to API clients (``gradio_client``), where a failure raises an error, as API callers
    expect, instead of filling a notice (Gradio serves an endpoint from an event, so it gets a hidden button of
    its own)."""
    page_kwargs = {"show_progress_on": outputs or None, **kwargs}
    page = event(reported(fn, len(outputs)), inputs, [notice, *outputs], api_visibility="private", **page_kwargs)
    if api_name:
        kwargs.pop("show_progress_on", None)
        serve(fn, inputs, outputs, api_name, **kwargs)
    return page


def serve(fn, inputs, outputs: list, api_name: str, **kwargs) -> None:
    """Serve ``fn`` to API clients only, under ``api_name`` (a hidden button's event; failures raise)."""
    gr.Button(visible=False).click(friendly(fn, len(outputs)), inputs, outputs, api_name=api_name, **kwargs)


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
    detail = html.escape(own_names(j.message)) if not j.active else (
        f"{j.file_tokens:,} / {total} tokens · {j.tokens_per_s:,.0f} tok/s · {j.bytes_done / 2**20:,.2f} / "
        f"{j.bytes_total / 2**20:,.2f} MiB · {duration(j.eta_s)} left" if j.unit == "B" else
        f"{j.bytes_done:,} / {j.bytes_total:,} {html.escape(j.unit)} · {duration(j.eta_s)} left")
    return (f"<div class='job' data-status='{j.status}' data-job='{j.id}'><b>{html.escape(j.bank)}</b> · "
            f"{html.escape(j.step or j.title)} · <span class='job-status'>{j.status}</span><br>"
            f"<progress max='100' value='{pct:.1f}' style='width:100%'></progress><br><small>{detail}</small></div>")
