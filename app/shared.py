"""What the tabs share: the bank pickers to refresh when banks change, the signal that they changed, and what the
page remembers across a reload (the chosen banks and tab, in the browser's local storage)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gradio as gr


@dataclass
class Shared:
    version: gr.Number  # hidden; a handler that changes banks returns ``bump()`` into it
    memo: gr.BrowserState  # {"tab": tab id, key: bank name for each remembered picker}
    pickers: list = field(default_factory=list)  # every bank dropdown of the page
    remembered: list = field(default_factory=list)  # (picker, key): pickers whose choice survives a reload

    @staticmethod
    def bump() -> float:
        return time.time()

    def remember(self, picker: gr.Dropdown, key: str) -> None:
        """Make ``picker`` a bank picker whose choice is stored under ``key`` and given back after a reload (pickers
        sharing a key, Chat's and Continue's, come back with the same bank). A picker left empty changes nothing: a
        bank that no longer exists is not picked again anyway."""
        self.pickers.append(picker)
        self.remembered.append((picker, key))

        def keep(value, memo):  # an emptied picker (its choices refreshed) must not forget another picker's choice
            return {**(memo or {}), key: value} if value else gr.skip()

        picker.change(keep, [picker, self.memo], [self.memo], queue=False, show_progress="hidden",
                      api_visibility="private")
