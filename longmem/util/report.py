"""How every measuring command (benchmarks, ``training.evaluate``, ``training.studies.probe``) hands back its result:
the JSON on stdout, a blank line, the markdown table; the same JSON written to a file when asked (atomically)."""

from __future__ import annotations

import json
from pathlib import Path

from longmem.util.files import write_file_atomic


def print_report(result: dict, table: str | None = None, out: str | Path | None = None) -> dict:
    """Print ``result`` as indented JSON, then ``table`` (if any) after a blank line; write the JSON to ``out`` when
    given. Returns ``result``."""
    text = json.dumps(result, indent=2)
    print(text)
    if table is not None:
        print()
        print(table)
    if out:
        write_file_atomic(out, (text + "\n").encode())
    return result
