"""The package's layering: a module imports only from its own layer or lower ones, the library imports no script
(``training``) and no UI (``app``), the app's UI modules call the library only through the service layer, no two
modules import each other (directly or round a circle, inside a package too), and no module imports another's
private name. Read from the source (every import statement, at any depth), so a lazy import inside a function counts
too. ``LAYERS`` below is the one numbering of the layers (README's table follows it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "longmem"
# lowest first; a module may import its own layer and the layers before it
LAYERS = ["util", "text", "memory", "model", "storage", "ingest", "tasks", "service", "bench", "eval", "cli"]
TOP = {"__init__": len(LAYERS), "__main__": len(LAYERS)}  # the package's own front doors: anything below them
APP_SCRIPTS = {"app.main", "app.bench"}  # the app's launcher (builds the model and the Workspace) and its benchmark:
#                                          scripts like the CLI, which may use any layer; the UI modules use the service


def layer_of(module: str) -> int:
    """``longmem.storage.bank`` -> the index of ``storage`` in ``LAYERS``."""
    parts = module.split(".")
    if parts[0] != "longmem":
        raise ValueError(module)
    if len(parts) == 1:
        return TOP["__init__"]
    return TOP[parts[1]] if parts[1] in TOP else LAYERS.index(parts[1])


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
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
APP = sorted((ROOT / "app").glob("*.py"))
MODULES = {module_name(p): p for p in [*SOURCES, *APP, *sorted((ROOT / "training").rglob("*.py"))]}


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


def app_violations(path: Path, module: str) -> list[str]:
    """What an app module must not import: a script, or (for a UI module) the library past its service layer."""
    out = []
    for target in imports(path, module):
        root = target.split(".")[0]
        if root == "training" or (root == "longmem" and module not in APP_SCRIPTS
                                  and not (target == "longmem.service" or target.startswith("longmem.service."))):
            out.append(target)
    return out


@pytest.mark.parametrize("path", APP, ids=lambda p: module_name(p))
def test_the_apps_ui_calls_the_library_through_the_service_layer(path):
    assert app_violations(path, module_name(path)) == []


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules among ``modules`` it imports (``from package import module`` names the module)."""
    graph = {}
    for name, path in modules.items():
        here = name.split(".")
        package = here if path.name == "__init__.py" else here[:-1]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = (".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
                        if node.level else node.module)
                edges |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {m for m in edges if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan): each holds an import circle."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other_round_a_circle():
    assert circles(import_graph(MODULES)) == []


def test_the_circle_check_sees_a_lazy_circle_inside_a_package(tmp_path):
    """Three probe modules in one package, the last importing the first inside a function: one circle."""
    files = {"pkg.a": "from pkg import b\n", "pkg.b": "from pkg.c import f\n",
             "pkg.c": "def f():\n    from pkg.a import x\n", "pkg.d": "import pkg.a\n"}
    modules = {}
    for name, text in files.items():
        path = tmp_path / (name.split(".")[1] + ".py")
        path.write_text(text)
        modules[name] = path
    assert circles(import_graph(modules)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_module_imports_another_modules_private_name():
    taken = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                taken += [f"{name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                          and a.name != "__version__"]
    assert taken == []


def test_readmes_layer_table_follows_the_layering_test():
    """The README's "How it is built" table names the layers, one row each, in this file's order."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## How it is built"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    rows = re.findall(r"^\| `([a-z]+)/` \|", section, flags=re.M)
    assert rows == LAYERS


def test_the_guides_module_table_goes_up_the_layers():
    """docs/guide.md's module table names the library's modules layer by layer, lowest first (its completeness is
    ``tests/test_docs.py``'s)."""
    guide = (ROOT / "docs" / "guide.md").read_text()
    table = guide[guide.index("## How it is built"):]
    table = table[:table.index("\n## ", 1)] if "\n## " in table[1:] else table
    packages = re.findall(r"^\| `longmem/([a-z]+)/", table, flags=re.M)
    order = [LAYERS.index(p) for p in packages]
    assert packages and order == sorted(order), packages

