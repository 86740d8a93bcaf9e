"""Memory banks tab: list, create, rename, delete banks; upload books or demonstration sets (ingested by a background
job whose progress the page polls, so it survives a reload); cancel; per-document info and removal."""

from __future__ import annotations

import gradio as gr

from longmem.service import DemoFormat, Workspace

from .common import BOOK_TYPES, DEMO_TYPES, Told, file_paths, job_html, mib, notice_box, parse_label_words, serve, wire
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


def confirm_box(yes: str, yes_id: str) -> tuple[gr.Group, gr.Markdown, gr.Button, gr.Button]:
    """A hidden box that asks before a destructive action: (box, its question, the button that does it, "Keep it")."""
    with gr.Group(visible=False) as box:
        question = gr.Markdown()
        with gr.Row():
            do = gr.Button(yes, variant="stop", elem_id=yes_id)
            keep = gr.Button("Keep it")
    return box, question, do, keep


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
            with gr.Row():
                rename = gr.Button("Rename")
                delete = gr.Button("Delete bank…", visible=False, elem_id="delete-bank")
            delete_confirm, delete_what, delete_yes, delete_no = confirm_box("Yes, delete it", "delete-bank-yes")
    notice = notice_box("banks-notice")

    gr.Markdown("### Add books or demonstrations")
    with gr.Row():
        target = gr.Dropdown(label="Into bank (a new name creates it)", choices=[], allow_custom_value=True,
                             elem_id="upload-bank")
        shared.pickers.append(target)
        files = gr.File(label=f"Files ({' '.join(BOOK_TYPES)}, or {' '.join(DEMO_TYPES)} demonstrations)",
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
    with gr.Row(visible=bool(active_jobs(ws))) as cancel_row:  # shown only while a job runs
        cancel_pick = gr.Dropdown(label="Running job", choices=[], allow_custom_value=True, elem_id="cancel-job")
        cancel = gr.Button("Cancel ingestion", elem_id="cancel-ingestion")

    gr.Markdown("### Documents")
    with gr.Row():
        doc_bank = gr.Dropdown(label="Bank", choices=[], allow_custom_value=True, elem_id="documents-bank")
        shared.pickers.append(doc_bank)
        doc_id = gr.Number(label="Document id", value=None, precision=0)
        remove = gr.Button("Remove document…", visible=False, elem_id="remove-document")
    remove_confirm, remove_what, remove_yes, remove_no = confirm_box("Yes, remove it", "remove-document-yes")
    docs = gr.Dataframe(headers=DOC_COLUMNS, interactive=False, label="Documents", elem_id="documents-table")
    timer = gr.Timer(1.0)

    # -- handlers (each calls the workspace) ----------------------------------------------------------------------
    def do_create(name):
        ws.create_bank((name or "").strip())
        return bank_rows(ws), shared.bump(), ""

    def do_rename(old, new):
        if not old:
            raise ValueError("pick a bank to rename")
        ws.rename_bank(old, (new or "").strip())
        return bank_rows(ws), shared.bump(), ""

    def do_delete(name, sure):
        if not name:
            raise ValueError("pick a bank to delete")
        if not sure:
            raise ValueError(f"tick the box to confirm that bank {name!r} and everything in it should be deleted")
        ws.delete_bank(name)
        return Told(f"deleted bank {name}", bank_rows(ws), shared.bump(), gr.update(visible=False))

    def ask_delete(name):
        """Show what deleting would remove, with the button that does it."""
        b = next((b for b in ws.banks() if b.name == name), None)
        if b is None:
            raise ValueError(f"no bank named {name!r}")
        what = f"{b.documents:,} document{'s' * (b.documents != 1)}, {b.tokens:,} tokens"
        return f"Delete bank **{b.name}** ({what})? This cannot be undone.", gr.update(visible=True)

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

    def do_cancel(job):
        if not job:
            raise ValueError("no running job selected")
        ws.jobs.cancel(job)
        return jobs_html(ws)

    def do_documents(name):
        if not name:
            return []
        return [[d.id, d.title, d.kind, d.status, d.n_tokens, d.n_segments, d.source, d.created[:19]]
                for d in ws.documents(name)]

    def do_remove(name, doc):
        if not name or doc is None:
            raise ValueError("pick a bank and a document id")
        removed = ws.delete_document(name, int(doc))
        return Told(f"removed {removed.title!r} from {name}", do_documents(name), bank_rows(ws), shared.bump(),
                    gr.update(visible=False))

    def ask_remove(name, doc):
        d = next((d for d in ws.documents(name) if d.id == int(doc)), None) if name and doc is not None else None
        if d is None:
            raise ValueError(f"bank {name!r} has no document {doc}" if name and doc is not None
                             else "pick a bank and a document id")
        return (f"Remove **{d.title}** ({d.n_tokens:,} tokens) from bank **{name}**? This cannot be undone.",
                gr.update(visible=True))

    was_active = gr.State(False)

    def poll(was: bool):
        """Refresh the job panel and the running-job picker (shown only while a job runs); the bank table too when
        a job has just finished."""
        running = active_jobs(ws)
        return (jobs_html(ws), gr.update(choices=running, value=running[0] if running else None),
                bank_rows(ws) if was and not running else gr.skip(), bool(running),
                gr.update(visible=bool(running)) if bool(running) != was else gr.skip())

    hide = gr.update(visible=False)
    wire(create.click, do_create, [new_name], [banks, shared.version, new_name], notice, api_name="create_bank")
    wire(rename.click, do_rename, [picked, rename_to], [banks, shared.version, rename_to], notice,
         api_name="rename_bank")
    picked.change(lambda name: (gr.update(visible=bool(name)), hide), [picked], [delete, delete_confirm],
                  queue=False, show_progress="hidden", api_visibility="private")
    wire(delete.click, ask_delete, [picked], [delete_what, delete_confirm], notice)
    delete_no.click(lambda: hide, None, [delete_confirm], queue=False, api_visibility="private")
    wire(delete_yes.click, lambda name: do_delete(name, True), [picked], [banks, shared.version, delete_confirm],
         notice)
    serve(do_delete, [picked, gr.Checkbox(visible=False)], [banks, shared.version, gr.Number(visible=False)],
          api_name="delete_bank")
    wire(start.click, do_ingest, [target, files, template, text_col, label_col, columns, label_words],
         [started, progress, cancel_pick, shared.version], notice, api_name="ingest")
    wire(cancel.click, do_cancel, [cancel_pick], [progress], notice, api_name="cancel_job")
    wire(doc_bank.change, do_documents, [doc_bank], [docs], notice, api_name="documents")
    doc_id.change(lambda doc: (gr.update(visible=doc is not None), hide), [doc_id], [remove, remove_confirm],
                  queue=False, show_progress="hidden", api_visibility="private")
    wire(remove.click, ask_remove, [doc_bank, doc_id], [remove_what, remove_confirm], notice)
    remove_no.click(lambda: hide, None, [remove_confirm], queue=False, api_visibility="private")
    wire(remove_yes.click, do_remove, [doc_bank, doc_id], [docs, banks, shared.version, remove_confirm], notice,
         api_name="remove_document")
    timer.tick(poll, [was_active], [progress, cancel_pick, banks, was_active, cancel_row], show_progress="hidden",
               queue=False, api_name="jobs")
    shared.version.change(lambda: bank_rows(ws), None, [banks], queue=False, api_visibility="private")


def demo_format(template, text_col, label_col, columns, label_words) -> DemoFormat:
    """A DemoFormat from the form's fields (empty fields keep the defaults)."""
    words = parse_label_words(label_words)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns and columns.strip() else None
    return DemoFormat(template=template or DemoFormat.template, label_words=words,
                      text_column=(text_col or "text").strip(), label_column=(label_col or "label").strip(),
                      columns=cols)
