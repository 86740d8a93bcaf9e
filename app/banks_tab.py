"""Memory banks tab: list, create, rename, delete banks; upload books or demonstration sets (ingested by a background
job whose progress the page polls, so it survives a reload); cancel; per-document info and removal."""

from __future__ import annotations

import gradio as gr

from longmem.ingest.readers import DemoFormat
from longmem.service.workspace import Workspace

from .common import BOOK_TYPES, DEMO_TYPES, file_paths, friendly, job_html, mib, parse_label_words
from .shared import Shared

BANK_COLUMNS = ["bank", "documents", "tokens", "on disk", "backbone", "stored chunk size", "usable", "status"]
DOC_COLUMNS = ["id", "title", "kind", "status", "tokens", "segments", "source", "added"]


def bank_rows(ws: Workspace) -> list[list]:
    return [[b.name, b.documents, f"{b.tokens:,}", mib(b.disk_bytes), b.backbone, b.chunk_size,
             "yes" if b.matches_model else "no (other backbone)", "ingesting" if b.busy else "ready"]
            for b in ws.banks()]


def jobs_html(ws: Workspace) -> str:
    jobs = ws.jobs.list()[:8]
    if not jobs:
        return "<p id='jobs-empty'>No ingestion yet. Upload files above.</p>"
    return "<div id='jobs'>" + "".join(job_html(j) for j in jobs) + "</div>"


def active_jobs(ws: Workspace) -> list[str]:
    return [j.id for j in ws.jobs.list() if j.active]


def build(ws: Workspace, shared: Shared) -> None:
    gr.Markdown("A bank holds books or labelled examples in long-term memory. It stays on disk between runs.")
    banks = gr.Dataframe(headers=BANK_COLUMNS, value=lambda: bank_rows(ws), interactive=False, label="Banks",
                         elem_id="banks-table")
    with gr.Row():
        with gr.Column():
            new_name = gr.Textbox(label="New bank name", placeholder="gatsby", elem_id="new-bank-name")
            create = gr.Button("Create bank", elem_id="create-bank")
        with gr.Column():
            picked = gr.Dropdown(label="Bank", choices=[], allow_custom_value=True, elem_id="manage-bank")
            shared.pickers.append(picked)
            rename_to = gr.Textbox(label="Rename to")
            rename = gr.Button("Rename")
        with gr.Column():
            confirm = gr.Checkbox(label="Yes, delete this bank and everything in it")
            delete = gr.Button("Delete bank", variant="stop")

    gr.Markdown("### Add books or demonstrations")
    with gr.Row():
        target = gr.Dropdown(label="Into bank (a new name creates it)", choices=[], allow_custom_value=True,
                             elem_id="upload-bank")
        shared.pickers.append(target)
        files = gr.File(label="Files (.txt .md .html .epub .pdf, or .csv .tsv .jsonl demonstrations)",
                        file_count="multiple", file_types=BOOK_TYPES + DEMO_TYPES, elem_id="upload-files")
    with gr.Accordion("Demonstration files: how rows become text", open=False):
        template = gr.Textbox(label="Template", value="Review: {text} Sentiment: {label}")
        with gr.Row():
            text_col = gr.Textbox(label="Text column", value="text")
            label_col = gr.Textbox(label="Label column", value="label")
            columns = gr.Textbox(label="Columns of a header-less file (e.g. label,text)", value="")
            label_words = gr.Textbox(label="Label words (e.g. 0=negative,1=positive)", value="")
    start = gr.Button("Ingest", variant="primary", elem_id="ingest")
    started = gr.Markdown()
    progress = gr.HTML(value=lambda: jobs_html(ws), elem_id="jobs-panel")
    with gr.Row():
        cancel_pick = gr.Dropdown(label="Running job", choices=[], allow_custom_value=True, elem_id="cancel-job")
        cancel = gr.Button("Cancel ingestion", variant="stop")

    gr.Markdown("### Documents")
    with gr.Row():
        doc_bank = gr.Dropdown(label="Bank", choices=[], allow_custom_value=True, elem_id="documents-bank")
        shared.pickers.append(doc_bank)
        doc_id = gr.Number(label="Document id", precision=0)
        remove = gr.Button("Remove document", variant="stop")
    docs = gr.Dataframe(headers=DOC_COLUMNS, interactive=False, label="Documents", elem_id="documents-table")
    timer = gr.Timer(1.0)

    # -- handlers (each calls the workspace) ----------------------------------------------------------------------
    @friendly
    def do_create(name):
        ws.create_bank((name or "").strip())
        return bank_rows(ws), shared.bump(), ""

    @friendly
    def do_rename(old, new):
        if not old:
            raise ValueError("pick a bank to rename")
        ws.rename_bank(old, (new or "").strip())
        return bank_rows(ws), shared.bump(), ""

    @friendly
    def do_delete(name, sure):
        if not name:
            raise ValueError("pick a bank to delete")
        if not sure:
            raise ValueError(f"tick the box to confirm that bank {name!r} and everything in it should be deleted")
        ws.delete_bank(name)
        return bank_rows(ws), shared.bump(), False

    @friendly
    def do_ingest(name, uploads, template, text_col, label_col, columns, label_words):
        paths = file_paths(uploads)
        if not paths:
            raise ValueError("choose one or more files to ingest")
        if not name or not name.strip():
            raise ValueError("choose a bank, or type a new bank name")
        demo_paths = [p for p in paths if p.lower().endswith(tuple(DEMO_TYPES))]
        if demo_paths and len(demo_paths) != len(paths):
            raise ValueError("ingest books and demonstration files separately (they are read differently)")
        demos = demo_format(template, text_col, label_col, columns, label_words) if demo_paths else None
        job = ws.ingest(name.strip(), paths, demos=demos, create=True,
                        titles=[p.rsplit("/", 1)[-1] for p in paths])
        return (f"Started {job}: progress below (it continues if you leave or reload the page).", jobs_html(ws),
                gr.update(choices=active_jobs(ws), value=job), shared.bump())

    @friendly
    def do_cancel(job):
        if not job:
            raise ValueError("no running job selected")
        ws.jobs.cancel(job)
        return jobs_html(ws)

    @friendly
    def do_documents(name):
        if not name:
            return []
        return [[d.id, d.title, d.kind, d.status, d.n_tokens, d.n_segments, d.source, d.created[:19]]
                for d in ws.documents(name)]

    @friendly
    def do_remove(name, doc):
        if not name or doc is None:
            raise ValueError("pick a bank and a document id")
        removed = ws.delete_document(name, int(doc))
        gr.Info(f"removed {removed.title!r} from {name}")
        return do_documents(name), bank_rows(ws), shared.bump()

    was_active = gr.State(False)

    def poll(was: bool):
        """Refresh the job panel and the running-job picker; the bank table too when a job has just finished."""
        running = active_jobs(ws)
        return (jobs_html(ws), gr.update(choices=running, value=running[0] if running else None),
                bank_rows(ws) if was and not running else gr.skip(), bool(running))

    create.click(do_create, [new_name], [banks, shared.version, new_name], api_name="create_bank")
    rename.click(do_rename, [picked, rename_to], [banks, shared.version, rename_to], api_name="rename_bank")
    delete.click(do_delete, [picked, confirm], [banks, shared.version, confirm], api_name="delete_bank")
    start.click(do_ingest, [target, files, template, text_col, label_col, columns, label_words],
                [started, progress, cancel_pick, shared.version], api_name="ingest")
    cancel.click(do_cancel, [cancel_pick], [progress], api_name="cancel_job")
    doc_bank.change(do_documents, [doc_bank], [docs], api_name="documents")
    remove.click(do_remove, [doc_bank, doc_id], [docs, banks, shared.version], api_name="remove_document")
    timer.tick(poll, [was_active], [progress, cancel_pick, banks, was_active], show_progress="hidden", queue=False,
               api_name="jobs")
    shared.version.change(lambda: bank_rows(ws), None, [banks], queue=False, api_visibility="private")


def demo_format(template, text_col, label_col, columns, label_words) -> DemoFormat:
    """A DemoFormat from the form's fields (empty fields keep the defaults)."""
    words = parse_label_words(label_words)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns and columns.strip() else None
    return DemoFormat(template=template or DemoFormat.template, label_words=words,
                      text_column=(text_col or "text").strip(), label_column=(label_col or "label").strip(),
                      columns=cols)
