"""What the tabs share: the bank pickers to refresh when banks change, and the signal that they changed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gradio as gr


@dataclass
class Shared:
    version: gr.Number  # hidden; a handler that changes banks returns ``bump()`` into it
    pickers: list = field(default_factory=list)  # every bank dropdown of the page

    @staticmethod
    def bump() -> float:
        return time.time()
