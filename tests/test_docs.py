"""The documentation stays in step with the tree: every local link in README.md and docs/ resolves, the guide's
module table names every library module. (README's layer table is checked against ``LAYERS`` beside it, in
``tests/test_layers.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def local_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_every_local_link_in_the_docs_resolves():
    broken = [f"{p.relative_to(ROOT)}: {t}" for p in markdown_files() for t in local_links(p)
              if not (p.parent / t.split("#")[0]).exists()]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def named_modules(table: str) -> set[str]:
    """The module paths a markdown table's first column names: ``longmem/x/a.py``, then bare ``b.py`` in the same
    folder, as in "`longmem/bench/inference.py`, `bank.py`"."""
    out = set()
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            if "/" in name:
                folder = name.rsplit("/", 1)[0]
                out.add(name)
            elif folder:
                out.add(f"{folder}/{name}")
    return out


def test_the_guides_module_table_names_every_library_module():
    guide = (ROOT / "docs" / "guide.md").read_text()
    table = guide[guide.index("## How it is built"):]
    named = named_modules(table)
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "longmem").rglob("*.py")
               if p.name != "__init__.py" and p.parent.name != "samples"} - {"longmem/__main__.py"}
    missing = sorted(modules - named)
    assert not missing, "docs/guide.md's module table does not name: " + ", ".join(missing)

