"""The page: five tabs over one shared ``Workspace``, Chat first."""

from __future__ import annotations

import gradio as gr

from longmem.service.workspace import Workspace

from . import banks_tab, chat_tab, classify_tab, model_tab
from .shared import Shared

CSS = "#jobs .job {margin: 0.4em 0;} footer {display: none !important;}"


def build_app(ws: Workspace) -> gr.Blocks:
    with gr.Blocks(title="LongMem") as demo:
        gr.Markdown("# LongMem\nA language model with a long-term memory: put books or thousands of examples into a "
                    "memory bank, then chat about them, continue them, or classify with them.")
        shared = Shared(version=gr.Number(value=0, visible=False))
        # a new user's path first (drop a book, ask); bank management stays one tab away
        with gr.Tab("Chat", id="chat"):
            chat_tab.build_chat(ws, shared)
        with gr.Tab("Continue", id="continue"):
            chat_tab.build_continue(ws, shared)
        with gr.Tab("Classify", id="classify"):
            classify_tab.build(ws, shared)
        with gr.Tab("Memory banks", id="banks"):
            banks_tab.build(ws, shared)
        with gr.Tab("Model", id="model"):
            model_tab.build(ws, shared)

        def pickers():
            names = [b.name for b in ws.banks()]
            return [gr.update(choices=names) for _ in shared.pickers]

        shared.version.change(pickers, None, shared.pickers, queue=False, api_visibility="private")
        demo.load(pickers, None, shared.pickers, queue=False, api_visibility="private")
    return demo
