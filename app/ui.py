"""The page: five tabs over one shared ``Workspace``, Chat first. A reload comes back to the same tab and banks."""

from __future__ import annotations

import hashlib

import gradio as gr

from longmem.service import Workspace

from . import banks_tab, chat_tab, classify_tab, model_tab
from .shared import Shared

RESTORE_TICKS = 10  # seconds a reloaded page keeps asking for its memo to be applied (see ``build_app``)
TABS = {"chat": "Chat", "continue": "Continue", "classify": "Classify", "banks": "Memory banks", "model": "Model"}
CSS = """
#jobs .job {margin: 0.4em 0;}
footer {display: none !important;}
.notice-box .notice {padding: 0.5em 0.8em; border-radius: var(--radius-md); margin: 0.2em 0;}
.notice-error {background: var(--color-red-50, #fef2f2); color: var(--color-red-700, #b91c1c);
               border: 1px solid var(--color-red-200, #fecaca);}
.notice-info {background: var(--color-green-50, #f0fdf4); color: var(--color-green-700, #15803d);
              border: 1px solid var(--color-green-200, #bbf7d0);}
.dark .notice-error {background: #450a0a; color: #fecaca;}
.dark .notice-info {background: #052e16; color: #bbf7d0;}
#chatbot .thought-group blockquote p {margin: 0.5em 0; line-height: 1.5;}
"""


def memo_secret(ws: Workspace) -> str:
    """A key for the browser-side memo that stays the same across restarts of the app on the same banks directory
    (Gradio's default is new at each start, which would forget the chosen bank whenever the app restarts). What
    it protects is only the names of the chosen bank and tab."""
    return hashlib.sha256(f"longmem-page-memo:{ws.directory.root.resolve()}".encode()).hexdigest()[:32]


def build_app(ws: Workspace) -> gr.Blocks:
    with gr.Blocks(title="LongMem") as demo:
        gr.Markdown("# LongMem\nA language model with a long-term memory: put books or thousands of examples into a "
                    "memory bank, then chat about them, continue them, or classify with them.")
        shared = Shared(version=gr.Number(value=0, visible=False),
                        memo=gr.BrowserState({}, storage_key="longmem-page", secret=memo_secret(ws)))
        builders = {"chat": chat_tab.build_chat, "continue": chat_tab.build_continue, "classify": classify_tab.build,
                    "banks": banks_tab.build, "model": model_tab.build}
        with gr.Tabs(elem_id="tabs") as tabs:
            # a new user's path first (drop a book, ask); bank management stays one tab away
            for tab_id, label in TABS.items():
                with gr.Tab(label, id=tab_id) as tab:
                    built = builders[tab_id](ws, shared)
                if tab_id == "model":  # what it shows (loaded banks, memory use) is current whenever it is opened
                    tab.select(lambda: model_tab.info_markdown(ws), None, [built], queue=False,
                               show_progress="hidden", api_visibility="private")

        def pickers():
            names = [b.name for b in ws.banks()]
            return [gr.update(choices=names) for _ in shared.pickers]

        def restore(memo):
            """The page as it was before a reload: its tab, and each remembered picker's bank if it still exists."""
            memo, names = memo or {}, [b.name for b in ws.banks()]
            keys = {id(p): k for p, k in shared.remembered}
            updates = [gr.update(choices=names, value=memo[keys[id(p)]])
                       if memo.get(keys.get(id(p))) in names else gr.update(choices=names) for p in shared.pickers]
            return [*updates, gr.Tabs(selected=memo["tab"]) if memo.get("tab") in TABS else gr.skip()]

        def remember_tab(memo, evt: gr.SelectData):
            """The tab a reader opened, into the memo. Heard from the tabs, not from each tab: as the page mounts,
            Gradio fires the first tab's own select event, and that report, coming back after a reader's first click
            on another tab, restored the first tab and threw the reader back to it."""
            return {**(memo or {}), "tab": evt.id} if evt.id in TABS else gr.skip()

        # The memo is read from the browser's storage when its component mounts, which a page under load can do after
        # the page's load event has run with the empty default: the memo's own change event then restores, once. A
        # timer is the backstop for a restore lost to the order of those events (a full CI run saw the reload find
        # no bank three times): for its first RESTORE_TICKS seconds the page asks again until the memo is applied.
        restored = gr.State(False)
        ticks = gr.State(0)
        retry = gr.Timer(1.0)
        n_out = len(shared.pickers) + 2  # the pickers, the tabs, whether the memo is applied

        def on_load(memo):
            return [*restore(memo), bool(memo)]

        def on_memo(memo, done):
            if done or not memo:
                return [gr.skip()] * n_out
            return [*restore(memo), True]

        def on_tick(memo, done, n):
            """Apply the memo if neither the load nor the memo's change did; stop once a memo is read (applied now
            or before) or after RESTORE_TICKS ticks (a first visit has nothing to apply)."""
            stop = bool(memo) or done or n + 1 >= RESTORE_TICKS
            return [*on_memo(memo, done), n + 1, gr.Timer(active=False) if stop else gr.skip()]

        tabs.select(remember_tab, [shared.memo], [shared.memo], queue=False, show_progress="hidden",
                    api_visibility="private")
        shared.version.change(pickers, None, shared.pickers, queue=False, api_visibility="private")
        demo.load(on_load, [shared.memo], [*shared.pickers, tabs, restored], queue=False, api_visibility="private")
        shared.memo.change(on_memo, [shared.memo, restored], [*shared.pickers, tabs, restored], queue=False,
                           show_progress="hidden", api_visibility="private")
        retry.tick(on_tick, [shared.memo, restored, ticks], [*shared.pickers, tabs, restored, ticks, retry],
                   queue=False, show_progress="hidden", api_visibility="private")
    return demo
