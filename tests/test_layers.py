"""The package's layering: a module imports only from its own layer or lower ones, and the library imports no
script (``training``) and no UI (``app``). Read from the source (every import statement, at any depth), so a
lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "longmem"
# lowest first; a module may import its own layer and the layers before it
LAYERS = ["util", "text", "memory", "model", "storage", "ingest", "tasks", "service", "bench", "eval", "cli"]
TOP = {"__init__": len(LAYERS), "__main__": len(LAYERS)}  # the package's own front doors: anything below them


def layer_of(module: str) -> int:
    """``longmem.storage.bank`` -> the index of ``storage`` in ``LAYERS``."""
    parts = module.split(".")
    if parts[0] != "longmem":
        raise ValueError(module)
    if len(parts) == 1:
        return TOP["__init__"]
    return TOP[parts[1]] if parts[1] in TOP else LAYERS.index(parts[1])


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module: str) -> list[str]:
    """Every module ``path`` (the source of ``module``) imports: absolute names, relative imports resolved."""
    here = module.split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                out.append(".".join([*base, *([node.module] if node.module else [])]))
            else:
                out.append(node.module)
    return out


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_lives_in_a_layer():
    """No module outside the layers (a new top-level module must be placed in one)."""
    loose = [module_name(p) for p in SOURCES if len(p.relative_to(PACKAGE).parts) == 1
             and p.stem not in TOP]
    assert loose == []
    assert {p.relative_to(PACKAGE).parts[0] for p in SOURCES if p.parent != PACKAGE} <= set(LAYERS)


def violations(path: Path, module: str) -> list[str]:
    """What ``module`` (source ``path``) must not import: a script, the app, Gradio, or a higher layer."""
    mine, out = layer_of(module), []
    for target in imports(path, module):
        root = target.split(".")[0]
        if root in ("training", "app", "gradio") or (root == "longmem" and layer_of(target) > mine):
            out.append(target)
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_no_module_imports_a_higher_layer_a_script_or_the_app(path):
    assert violations(path, module_name(path)) == []


def test_the_check_sees_a_lazy_upward_import_and_a_script(tmp_path):
    """Imports are read at any depth: a storage module importing the service layer or the trainer inside a
    function is caught; importing a lower layer is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from longmem.service.workspace import Workspace\n    import training.train\n"
                     "    from longmem.memory import Memory\n    return Workspace, Memory\n")
    assert violations(probe, "longmem.storage.probe") == ["longmem.service.workspace", "training.train"]
