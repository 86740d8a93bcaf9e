"""Chat tab (drop a book and watch it load, or pick a bank; ask about it; answers stream; under each answer, the
passages it read, each opening onto its surrounding text, and the chunks memory retrieved most) and Continue tab
(continue the bank's text from its end or from a given passage)."""

from __future__ import annotations

import html
import re
import uuid

import gradio as gr

from longmem.service import (
    CONTINUE,
    FINDERS,
    READING_TOPK,
    BankError,
    ChunkHit,
    Citation,
    Reply,
    Settings,
    Workspace,
)

from .common import BOOK_TYPES, file_paths, job_html, notice_box, wire
from .shared import Shared

RETRIEVED_TITLE = "What memory retrieved"  # the block under an answer (and Continue's) showing the chunks memory gave
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")  # a blank line between two paragraphs
FINDER_NAMES = {"lexical": "words (BM25)", "fused": "memory retrieval and words, fused", "memory": "memory retrieval",
                "windows": "words, in windows of the book's text (BM25, as a RAG script)", "none": "none"}


class Stops:
    """What Stop stops: the reply being written for each page (keyed by the page's ``gr.State`` key), and which of
    them its reader stopped. A stopped reply ends between two tokens and still shows what it has (``Reply.cancel``),
    where cancelling the event would lose it."""

    def __init__(self):
        self.running: dict[str, Reply] = {}
        self.stopped: set[str] = set()

    def start(self, key: str, reply: Reply) -> None:
        self.running[key] = reply
        self.stopped.discard(key)

    def stop(self, key: str) -> None:
        reply = self.running.get(key)
        if reply is not None:
            self.stopped.add(key)
            reply.cancel()

    def end(self, key: str) -> bool:
        """Forget the page's reply; whether its reader stopped it."""
        self.running.pop(key, None)
        return key in self.stopped


def stopped_mark(text: str) -> str:
    """A reply cut short by Stop, marked as such."""
    shown = text.rstrip()
    return f"{shown} *[stopped]*" if shown else "*[stopped before any of the answer was shown]*"


def retrieved_markdown(chunks: list[ChunkHit]) -> str:
    """The chunks memory retrieved most while answering, each quoted with the text around it."""
    parts = []
    for i, p in enumerate(chunks, 1):
        paragraphs = [html.escape(x).replace("\n", " ") for x in _PARAGRAPH_BREAK.split(p.context.strip())]
        quote = "\n>\n".join(f"> {x}" for x in paragraphs if x.strip())
        parts.append(f"**{i}. {html.escape(p.document)}**, {p.location} (retrieved {p.hits}×)\n\n{quote}")
    return "\n\n".join(parts)


def retrieved_message(chunks: list[ChunkHit]) -> dict:
    """The collapsible block shown under an answer."""
    return {"role": "assistant", "content": retrieved_markdown(chunks),
            "metadata": {"title": RETRIEVED_TITLE, "status": "done"}}


def highlighted(text: str, spans: list[tuple[int, int, str]]) -> str:
    """``text`` as HTML with each ``(start, end, tag)`` span wrapped in ``<tag>`` (spans listed outer first, nested
    or disjoint; clipped to the text)."""
    cuts = sorted({0, len(text), *(min(max(x, 0), len(text)) for a, b, _ in spans for x in (a, b))})
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        piece = html.escape(text[lo:hi])
        for a, b, tag in reversed(spans):
            if a <= lo and hi <= b:
                piece = f"<{tag}>{piece}</{tag}>"
        out.append(piece)
    return "".join(out)


def context_html(c: Citation) -> str:
    """The passage in its surrounding text as HTML paragraphs: the passage marked (``<mark>``), the sentence that
    supports the answer in bold, or where none does the sentence nearest the question in italics; the book's
    hard-wrapped lines joined, so that the text reads as prose. A mark that crosses paragraphs is marked in each."""
    at = c.context.find(c.text)
    spans = [] if at < 0 else [(at, at + len(c.text), "mark")]
    full = c.context if at >= 0 else c.text
    span, tag = (c.support, "b") if c.support else (c.nearest, "i")
    if span:
        base = max(at, 0)
        spans.append((base + span[0], base + span[1], tag))
    paragraphs, pos = [], 0
    for m in [*_PARAGRAPH_BREAK.finditer(full), None]:
        end = m.start() if m else len(full)
        if full[pos:end].strip():
            shifted = [(a - pos, b - pos, tag) for a, b, tag in spans if a < end and b > pos]
            paragraphs.append("<p>" + highlighted(full[pos:end], shifted).replace("\n", " ") + "</p>")
        pos = m.end() if m else end
    return "".join(paragraphs)


def answered_by(reader: str | None, memory: bool = True) -> str:
    """How the block of what an answer read names its reader, and whether it read the bank's memory ("" for a turn
    stored before readers could be chosen)."""
    if not reader:
        return ""
    return f" · answered by {reader}, " + ("with the bank's memory" if memory else "memory not read")


def citations_message(citations: list[Citation], said: bool = True, reader: str | None = None,
                      memory: bool = True, reading: bool = False) -> dict:
    """The block of what an answer read: each passage with its place and the sentence that supports the answer (else
    the one nearest the question, else its opening); opening one shows the passage, that sentence marked, in its
    surrounding text. Its title names the reader that answered (``answered_by``). ``reading``: the answer is still
    being made (the block is shown as soon as the passages are found, pending, and made whole at the end)."""
    parts = []
    for c in citations:
        quote = c.quote()
        quoted = quote if quote[:1] in "“\"'‘" else f"“{quote}”"  # a quote that opens with its own mark keeps it
        rests = " <i>(the answer rests on this)</i>" if c.rests else ""
        parts.append(f"<details><summary><b>[{c.number}]</b> {html.escape(c.place)}: {html.escape(quoted)}{rests}"
                     f"</summary><blockquote>{context_html(c)}</blockquote></details>")
    n = len(citations)
    on = next((c.number for c in citations if c.rests), None)
    if reading:
        who = f"{reader} is reading" if reader else "Reading"
        return {"role": "assistant", "content": "\n".join(parts),
                "metadata": {"title": f"{who} {n} passage{'s' * (n != 1)} found in the book…", "status": "pending"}}
    title = (f"Read from the book: {n} passage{'s' * (n != 1)}" + (f", the answer rests on [{on}]" if on else "")
             if said else f"The closest passages the book has: {n}") + answered_by(reader, memory)
    return {"role": "assistant", "content": "\n".join(parts), "metadata": {"title": title, "status": "done"}}


def history_messages(turns: list[dict]) -> list[dict]:
    """A stored conversation as chatbot messages, each answer followed by what it read and what memory retrieved."""
    out = []
    for t in turns:
        out.append({"role": t["role"], "content": t["content"]})
        if t.get("citations"):
            out.append(citations_message(t["citations"], t.get("said", True), t.get("reader"), t.get("memory", True)))
        if t["retrieved"]:
            out.append(retrieved_message(t["retrieved"]))
    return out


def settings_panel(ws: Workspace, defaults: Settings, answers: bool = False) -> list:
    """The settings under a Chat or Continue box, starting at ``defaults``: first what a reader understands (how long
    an answer may be, how adventurous its words, and for ``answers`` whether it says when the book does not say),
    then, in a closed "Advanced" group, the model's own knobs (how passages are found and how many are read, memory
    chunks per query, chunk size). Returns the inputs in ``make_settings``'s order."""
    model = ws.model
    with gr.Accordion("Settings", open=False):
        with gr.Row():
            abstain = (gr.Checkbox(value=Settings.abstain, label="Say so when the book does not say",
                                   info="an answer the passages read do not support is replaced by that (the bank's "
                                        "own model; another reader reads as a RAG script would)")
                       if answers else None)
            tokens = gr.Slider(8, 512, value=defaults.max_new_tokens, step=8, label="Longest answer (tokens)",
                               info="about ¾ of a word each")
            temperature = gr.Slider(0.0, 1.5, value=defaults.temperature, step=0.05, label="Variety",
                                    info="0: always the most likely words; higher: freer, less exact")
        with gr.Accordion("Advanced", open=False):
            extra = []
            if answers:
                with gr.Row():
                    extra = [gr.Dropdown([(FINDER_NAMES[f], f) for f in FINDERS], value=Settings.finder,
                                         elem_id="finder", label="Find the passages to read by",
                                         info="the bank's own model; another reader reads windows of the book's "
                                              "text. none: the paper's memory fusion alone"),
                             gr.Slider(0, 8, value=Settings.passages, step=1, label="Passages read at most"),
                             gr.Checkbox(value=Settings.backbone_stops, label="End answers where the backbone would",
                                         info="the SideNet, trained on book text, ends a chat turn late")]
            with gr.Row():
                top = model.config.topk // model.chunk_size  # the model's own: what it was evaluated with
                reads = max(1, min(READING_TOPK, model.config.topk) // model.chunk_size)
                chunks = gr.Slider(0, max(64, 4 * top), value=0, step=1,
                                   label="Memory pieces each word looks up (top-K chunks per token and head)",
                                   info=f"0: automatic ({reads} while passages are read, else the model's {top})")
                sizes = [d for d in range(model.chunk_size, 0, -1) if model.chunk_size % d == 0]
                chunk_size = gr.Dropdown(choices=sizes, value=model.chunk_size,
                                         label="Memory piece size (chunk size, tokens)",
                                         info="smaller: more precise look-ups, slower")
    return [temperature, tokens, chunks, chunk_size, *extra, *([abstain] if answers else [])]


def make_settings(temperature, tokens, chunks, chunk_size, finder=Settings.finder,
                  passages=Settings.passages, backbone_stops=Settings.backbone_stops,
                  abstain=Settings.abstain) -> Settings:
    return Settings(max_new_tokens=int(tokens), temperature=float(temperature), chunks=int(chunks) or None,
                    chunk_size=int(chunk_size) if chunk_size else None, finder=finder or "none",
                    passages=int(passages), backbone_stops=bool(backbone_stops), abstain=bool(abstain))


def loading_html(ws: Workspace, name: str | None) -> str:
    """What the Chat tab says about the picked bank's newest ingestion: its progress while the book loads, then
    whether it is ready (or why it failed). Empty when no job wrote into the bank since the app started."""
    job = ws.loading(name) if name else None
    if job is None:
        return ""
    if job.active:
        return f"<div id='chat-loading' data-status='{job.status}'>Reading the book into memory…{job_html(job)}</div>"
    if job.status == "done":
        return (f"<div id='chat-loading' data-status='done'><b>{html.escape(job.bank)}</b> is ready: "
                f"{job.tokens_done:,} tokens in memory. Ask about it below.</div>")
    return (f"<div id='chat-loading' data-status='{job.status}'>Loading <b>{html.escape(job.title)}</b> "
            f"{job.status}: {html.escape(job.message)}</div>")


def build_chat(ws: Workspace, shared: Shared) -> None:
    gr.Markdown("Drop a book to ask about it (it is read into a memory bank of its own, kept on disk), or pick a bank "
                "made before. Each answer reads the passages it finds in the book and cites them.")
    with gr.Row():
        book = gr.File(label=f"Drop a book ({' '.join(BOOK_TYPES)})", file_types=BOOK_TYPES, file_count="single",
                       height=150, elem_id="chat-book", scale=2)
        with gr.Column(scale=3):
            with gr.Row():
                bank = gr.Dropdown(label="Book (memory bank)", choices=[], allow_custom_value=True,
                                   elem_id="chat-bank", scale=3)
                reader = gr.Dropdown(label="Reader (the model that answers)", choices=ws.readers(),
                                     value=ws.default_reader, elem_id="chat-reader", scale=2,
                                     info="another model than the bank's reads the passages found, memory off")
                clear = gr.Button("Clear conversation", scale=1, elem_id="clear-chat")
            books = gr.Dropdown(label="Books read", choices=[], value=[], multiselect=True, visible=False,
                                elem_id="chat-books", info="the bank holds several: answers look in those picked "
                                                           "(none: all of them)")
            loading = gr.HTML(elem_id="chat-loading-panel")
    shared.remember(bank, "bank")
    chatbot = gr.Chatbot(label="Conversation", height=460, elem_id="chatbot", buttons=["copy"],
                         feedback_options=None)
    with gr.Row():
        question = gr.Textbox(placeholder="Ask about the book…", show_label=False, scale=5, elem_id="question")
        send = gr.Button("Send", variant="primary", scale=1, elem_id="send")
        stop = gr.Button("Stop", scale=1, elem_id="stop", interactive=False)
    notice = notice_box("chat-notice")
    settings = settings_panel(ws, Settings(), answers=True)
    session = gr.State(lambda: uuid.uuid4().hex)  # this page's key for its running answer (what Stop stops)
    stops = Stops()

    def load_history(name):
        return history_messages(ws.chat_history(name)) if name else []

    def drop_book(upload):
        paths = file_paths(upload)
        if not paths:
            raise ValueError("drop a book file to read")
        name, _ = ws.add_book(paths[0], title=paths[0].rsplit("/", 1)[-1])
        return gr.update(choices=[b.name for b in ws.banks()], value=name), loading_html(ws, name), shared.bump()

    def ask(name, q, history, key, *s):
        if not name:
            raise ValueError("drop a book above, or pick a bank, first")
        job = ws.loading(name)
        if job is not None and job.active:
            raise ValueError(f"{name} is still loading ({100 * job.fraction:.0f}% read); ask when it is ready")
        *s, who, picked = s  # the reader and the books come last: API clients that leave them out get the defaults
        settings = make_settings(*s)
        settings.reader, settings.books = who or None, tuple(int(b) for b in picked or ())
        reply = ws.chat(name, q, settings)
        stops.start(key, reply)
        history = list(history or []) + [{"role": "user", "content": q}, {"role": "assistant", "content": ""}]
        said = len(history) - 1  # the answer's message; the passages found follow it as soon as they are known
        try:
            yield history, "", gr.update(interactive=True)
            for piece in reply.updates():
                if piece is None:  # found: shown while the reader reads them, seconds before its first words
                    if reply.citations:
                        history.append(citations_message(reply.citations, reader=reply.reader, reading=True))
                else:
                    history[said]["content"] += piece
                yield history, "", gr.skip()
        except Exception:  # failed midway: what was shown stays, and no block of passages is left pending
            del history[said + 1:]
            yield history, "", gr.update(interactive=False)
            raise
        finally:
            reply.cancel()
            was_stopped = stops.end(key)
        del history[said + 1:]  # the pending block: made whole below, with the sentences the answer rests on
        if was_stopped:  # an answer cut short is marked, and still shows what it read
            history[said]["content"] = stopped_mark(history[said]["content"])
        if reply.citations:
            history.append(citations_message(reply.citations, reply.said, reply.reader, reply.memory))
        if reply.retrieved:
            history.append(retrieved_message(reply.retrieved))
        yield history, "", gr.update(interactive=False)

    def do_clear(name):
        if name:
            ws.clear_chat(name)
        return []

    loading_now = gr.State(False)

    def poll(name, was: bool):
        """Refresh the loading panel; when the picked bank's job has just ended, the banks changed (busy to ready)."""
        job = ws.loading(name) if name else None
        active = job is not None and job.active
        return loading_html(ws, name), active, (shared.bump() if was and not active else gr.skip())

    def library_books(name, picked=None):
        """The Books picker for bank ``name``: its complete books, shown when it holds more than one; of the books
        ``picked`` before, those still there stay picked (a bank picked anew: none)."""
        try:
            docs = [d for d in ws.documents(name) if d.status == "complete"] if name else []
        except BankError:  # a name typed that is no bank (yet): asking says so
            docs = []
        kept = [b for b in picked or [] if b in {d.id for d in docs}]
        return gr.update(choices=[(d.title, d.id) for d in docs], value=kept, visible=len(docs) > 1)

    wire(bank.change, load_history, [bank], [chatbot], notice, api_name="chat_history")
    bank.change(library_books, [bank], [books], queue=False, api_visibility="private")
    shared.version.change(library_books, [bank, books], [books], queue=False,
                          api_visibility="private")  # a book added or removed: the picks still there kept
    bank.change(lambda name: loading_html(ws, name), [bank], [loading], queue=False, api_visibility="private")
    wire(book.upload, drop_book, [book], [bank, loading, shared.version], notice, api_name="add_book"
         ).then(lambda: None, None, [book], queue=False, api_visibility="private")  # ready for the next book
    gr.Timer(1.0).tick(poll, [bank, loading_now], [loading, loading_now, shared.version], show_progress="hidden",
                       queue=False, api_name="loading")
    for event, api in ((send.click, "chat"), (question.submit, None)):
        wire(event, ask, [bank, question, chatbot, session, *settings, reader, books], [chatbot, question, stop],
             notice, show_progress_on=[chatbot], concurrency_id="model", concurrency_limit=1, api_name=api
             ).then(lambda: gr.update(interactive=False), None, [stop], queue=False, api_visibility="private")
    stop.click(stops.stop, [session], None, queue=False, api_visibility="private")
    shared.version.change(lambda: gr.update(choices=ws.readers()), None, [reader], queue=False,
                          api_visibility="private")  # a reader fetched in the Model tab is offered at once
    wire(clear.click, do_clear, [bank], [chatbot], notice, api_name="clear_chat")
    wire(chatbot.clear, do_clear, [bank], [chatbot], notice)  # its bin icon clears the stored conversation too


def build_continue(ws: Workspace, shared: Shared) -> None:
    bank = gr.Dropdown(label="Book (memory bank)", choices=[], allow_custom_value=True, elem_id="continue-bank")
    shared.remember(bank, "bank")
    passage = gr.Textbox(label="Passage to continue (leave empty to continue the book from its end)", lines=4,
                         elem_id="continue-passage")
    with gr.Row():
        go = gr.Button("Continue", variant="primary", elem_id="continue")
        stop = gr.Button("Stop", interactive=False)
    notice = notice_box("continue-notice")
    output = gr.Textbox(label="Continuation", lines=12, interactive=False, elem_id="continuation")
    with gr.Accordion(RETRIEVED_TITLE, open=False):
        found = gr.Markdown()
    settings = settings_panel(ws, CONTINUE)
    session = gr.State(lambda: uuid.uuid4().hex)  # this page's key for its running continuation
    stops = Stops()

    def run(name, text, key, *s):
        if not name:
            raise ValueError("pick a bank first (drop a book in the Chat tab, or make one in Memory banks)")
        reply = ws.continue_text(name, text if text and text.strip() else None, make_settings(*s))
        stops.start(key, reply)
        out = ""
        try:
            yield out, "", gr.update(interactive=True)
            for piece in reply:
                out += piece
                yield out, "", gr.skip()
        finally:
            reply.cancel()
            was_stopped = stops.end(key)
        notes = "".join(f"*{n}*\n\n" for n in reply.notes)
        shown = f"{out.rstrip()} [stopped]" if was_stopped else out  # plain text: no Markdown here
        yield shown, notes + retrieved_markdown(reply.retrieved), gr.update(interactive=False)

    event = wire(go.click, run, [bank, passage, session, *settings], [output, found, stop], notice,
                 show_progress_on=[output], concurrency_id="model", concurrency_limit=1, api_name="continue")
    event.then(lambda: gr.update(interactive=False), None, [stop], queue=False, api_visibility="private")
    stop.click(stops.stop, [session], None, queue=False, api_visibility="private")
