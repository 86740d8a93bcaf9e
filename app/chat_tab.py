"""Chat tab (drop a book and watch it load, or pick a bank; ask about it; answers stream; under each answer, the
passages it read, each opening onto its surrounding text, and the passages memory retrieved most) and Continue tab
(continue the bank's text from its end or from a given passage)."""

from __future__ import annotations

import html

import gradio as gr

from longmem.service.workspace import CONTINUE, PassageHit, Settings, Workspace
from longmem.tasks.reading import FINDERS, READING_TOPK, Citation

from .common import BOOK_TYPES, file_paths, friendly, job_html
from .shared import Shared

FINDER_NAMES = {"lexical": "words (BM25)", "fused": "memory retrieval and words, fused", "memory": "memory retrieval",
                "none": "none"}


def passages_markdown(passages: list[PassageHit]) -> str:
    parts = []
    for i, p in enumerate(passages, 1):
        context = html.escape(p.context.strip()).replace("\n", " ")
        parts.append(f"**{i}. {html.escape(p.document)}**, {p.location} (retrieved {p.hits}×)\n\n> {context}")
    return "\n\n".join(parts)


def passages_message(passages: list[PassageHit]) -> dict:
    """The collapsible block shown under an answer."""
    return {"role": "assistant", "content": passages_markdown(passages),
            "metadata": {"title": "Passages memory retrieved", "status": "done"}}


def _words(text: str, n: int) -> str:
    w = text.split()
    return " ".join(w[:n]) + ("…" if len(w) > n else "")


def marked(c: Citation) -> str:
    """The passage as HTML, the sentence that supports the answer in bold."""
    if not c.support:
        return html.escape(c.text)
    a, b = c.support
    return html.escape(c.text[:a]) + "<b>" + html.escape(c.text[a:b]) + "</b>" + html.escape(c.text[b:])


def citations_message(citations: list[Citation], said: bool = True) -> dict:
    """The block of what an answer read: each passage with its place and the sentence that supports the answer (or
    its opening); opening one shows the passage, that sentence in bold, in its surrounding text."""
    parts = []
    for c in citations:
        quote = c.text[c.support[0]:c.support[1]] if c.support else c.text
        before, _, after = c.context.partition(c.text)
        around = (html.escape(before) + "<mark>" + marked(c) + "</mark>" + html.escape(after)
                  if c.text in c.context else marked(c))
        parts.append(f"<details><summary><b>[{c.number}]</b> {html.escape(c.place)}: "
                     f"“{html.escape(_words(quote, 40 if c.support else 18))}”</summary>\n\n"
                     f"<blockquote>{around.strip()}</blockquote></details>")
    n = len(citations)
    title = (f"Read from the book: {n} passage{'s' * (n != 1)}" if said
             else f"The closest passages the book has: {n}")
    return {"role": "assistant", "content": "\n".join(parts), "metadata": {"title": title, "status": "done"}}


def history_messages(turns: list[dict]) -> list[dict]:
    """A stored conversation as chatbot messages, each answer followed by what it read and what memory retrieved."""
    out = []
    for t in turns:
        out.append({"role": t["role"], "content": t["content"]})
        if t.get("citations"):
            out.append(citations_message(t["citations"], t.get("said", True)))
        if t["passages"]:
            out.append(passages_message(t["passages"]))
    return out


def settings_panel(ws: Workspace, defaults: Settings, reading: bool = False) -> list:
    """Temperature, max tokens, memory chunks per query, chunk size (and with ``reading``, how an answer finds the
    passages it reads, how many, and whether an unsupported answer says that the book does not say): an accordion
    starting at ``defaults``."""
    model = ws.model
    with gr.Accordion("Settings", open=False):
        extra = []
        if reading:
            with gr.Row():
                extra = [gr.Dropdown([(FINDER_NAMES[f], f) for f in FINDERS], value=Settings.reading,
                                     elem_id="reading", label="Read passages found by",
                                     info="none: the paper's memory fusion alone"),
                         gr.Slider(0, 8, value=Settings.passages, step=1, label="Passages read at most"),
                         gr.Checkbox(value=Settings.backbone_stops, label="End answers where the backbone would",
                                     info="the SideNet, trained on book text, ends a chat turn late"),
                         gr.Checkbox(value=Settings.abstain, label="Say when the book does not say",
                                     info="an answer whose words the passages read do not hold is not shown")]
        with gr.Row():
            temperature = gr.Slider(0.0, 1.5, value=defaults.temperature, step=0.05,
                                    label="Temperature (0 = the most likely words)")
            tokens = gr.Slider(8, 512, value=defaults.max_new_tokens, step=8, label="Max new tokens")
        with gr.Row():
            top = model.config.topk // model.chunk_size  # the model's own: what it was evaluated with
            reads = max(1, min(READING_TOPK, model.config.topk) // model.chunk_size)
            chunks = gr.Slider(0, max(64, 4 * top), value=0, step=1, label="Top-K memory chunks per token and head",
                               info=f"0: automatic ({reads} while passages are read, else the model's {top})")
            sizes = [d for d in range(model.chunk_size, 0, -1) if model.chunk_size % d == 0]
            chunk_size = gr.Dropdown(choices=sizes, value=model.chunk_size,
                                     label="Chunk size (tokens; finer = more precise)")
    return [temperature, tokens, chunks, chunk_size, *extra]


def make_settings(temperature, tokens, chunks, chunk_size, reading=Settings.reading,
                  passages=Settings.passages, backbone_stops=Settings.backbone_stops,
                  abstain=Settings.abstain) -> Settings:
    return Settings(max_new_tokens=int(tokens), temperature=float(temperature), chunks=int(chunks) or None,
                    chunk_size=int(chunk_size) if chunk_size else None, reading=reading or "none",
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
        book = gr.File(label="Drop a book here (.txt .md .html .epub .pdf)", file_types=BOOK_TYPES,
                       file_count="single", height=120, elem_id="chat-book", scale=2)
        with gr.Column(scale=3):
            with gr.Row():
                bank = gr.Dropdown(label="Bank", choices=[], allow_custom_value=True, elem_id="chat-bank", scale=3)
                shared.pickers.append(bank)
                clear = gr.Button("Clear conversation", scale=1)
            loading = gr.HTML(elem_id="chat-loading-panel")
    chatbot = gr.Chatbot(label="Conversation", height=460, elem_id="chatbot")
    with gr.Row():
        question = gr.Textbox(placeholder="Ask about the book…", show_label=False, scale=5, elem_id="question")
        send = gr.Button("Send", variant="primary", scale=1, elem_id="send")
        stop = gr.Button("Stop", scale=1, elem_id="stop")
    settings = settings_panel(ws, Settings(), reading=True)

    @friendly
    def load_history(name):
        return history_messages(ws.chat_history(name)) if name else []

    @friendly
    def drop_book(upload):
        paths = file_paths(upload)
        if not paths:
            raise ValueError("drop a book file to read")
        name, _ = ws.add_book(paths[0], title=paths[0].rsplit("/", 1)[-1])
        return gr.update(choices=[b.name for b in ws.banks()], value=name), loading_html(ws, name), shared.bump()

    @friendly
    def ask(name, q, history, *s):
        if not name:
            raise ValueError("drop a book above, or pick a bank, first")
        job = ws.loading(name)
        if job is not None and job.active:
            raise ValueError(f"{name} is still loading ({100 * job.fraction:.0f}% read); ask when it is ready")
        reply = ws.chat(name, q, make_settings(*s))
        history = list(history or []) + [{"role": "user", "content": q}, {"role": "assistant", "content": ""}]
        yield history, ""
        try:
            for piece in reply:
                history[-1]["content"] += piece
                yield history, ""
        finally:
            reply.cancel()
        if reply.citations:
            history.append(citations_message(reply.citations, reply.said))
        if reply.passages:
            history.append(passages_message(reply.passages))
        yield history, ""

    @friendly
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

    bank.change(load_history, [bank], [chatbot], api_name="chat_history")
    bank.change(lambda name: loading_html(ws, name), [bank], [loading], queue=False, api_visibility="private")
    book.upload(drop_book, [book], [bank, loading, shared.version], api_name="add_book")
    gr.Timer(1.0).tick(poll, [bank, loading_now], [loading, loading_now, shared.version], show_progress="hidden",
                       queue=False, api_name="loading")
    asking = [event(ask, [bank, question, chatbot, *settings], [chatbot, question], concurrency_id="model",
                    concurrency_limit=1, api_name=api or None, api_visibility="public" if api else "private")
              for event, api in ((send.click, "chat"), (question.submit, False))]
    stop.click(None, None, None, cancels=asking, api_visibility="private")
    clear.click(do_clear, [bank], [chatbot], api_name="clear_chat")


def build_continue(ws: Workspace, shared: Shared) -> None:
    bank = gr.Dropdown(label="Bank", choices=[], allow_custom_value=True, elem_id="continue-bank")
    shared.pickers.append(bank)
    passage = gr.Textbox(label="Passage to continue (leave empty to continue the book from its end)", lines=4,
                         elem_id="continue-passage")
    with gr.Row():
        go = gr.Button("Continue", variant="primary", elem_id="continue")
        stop = gr.Button("Stop")
    output = gr.Textbox(label="Continuation", lines=12, interactive=False, elem_id="continuation")
    with gr.Accordion("Passages memory retrieved", open=False):
        found = gr.Markdown()
    settings = settings_panel(ws, CONTINUE)

    @friendly
    def run(name, text, *s):
        if not name:
            raise ValueError("pick a bank first (make one in the Memory banks tab)")
        reply = ws.continue_text(name, text if text and text.strip() else None, make_settings(*s))
        out = ""
        try:
            for piece in reply:
                out += piece
                yield out, ""
        finally:
            reply.cancel()
        notes = "".join(f"*{n}*\n\n" for n in reply.notes)
        yield out, notes + passages_markdown(reply.passages)

    event = go.click(run, [bank, passage, *settings], [output, found], concurrency_id="model", concurrency_limit=1,
                     api_name="continue")
    stop.click(None, None, None, cancels=[event], api_visibility="private")
