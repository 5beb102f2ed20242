"""The shape of the package, read from the source with ``ast`` (no module is imported).

The rules that keep ``raco_cli`` readable from the top down (docs/architecture.md):

* layers point down: a module imports modules of its own layer and of the layers below it
  (:data:`LAYERS`), never one above, so a lower layer is read and tested without the upper ones;
* a few libraries are imported by one part of the package only (:data:`ONLY_IMPORTED_BY`:
  Hydra and OmegaConf by the command line, MLflow by ``tracking/``, numba by the compiled pass);
* no command imports another command's module (``cli/main.py`` dispatches them);
* no import cycle between modules: a newcomer can read any module after the ones it imports;
* no module takes an underscore name from another: a name shared across modules is public.

Function-local imports count everywhere: they only hide an arrow, they do not remove it.  Edges
are import statements only; ``importlib.import_module`` (the method and dataset registries) is
dispatch by name and not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "raco_cli"

# The layers, top to bottom (docs/architecture.md has the same table): a module belongs to the
# layer of its longest listed prefix (the package itself, ``raco_cli/__init__.py``, only by name).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tools", ("raco_cli.__main__", "raco_cli.bench", "raco_cli.bench_images", "raco_cli.bench_noise")),
    ("python interface", ("raco_cli.api", "raco_cli.estimator")),
    ("command line", ("raco_cli.cli",)),
    ("run", ("raco_cli.run",)),
    ("records", ("raco_cli.tracking", "raco_cli.predictor")),
    ("audit", ("raco_cli.audit",)),
    ("methods", ("raco_cli.methods",)),
    ("mechanisms and measures", ("raco_cli.privacy", "raco_cli.metrics")),
    ("problem data", ("raco_cli.data", "raco_cli.constraints", "raco_cli.objectives", "raco_cli.models")),
    ("leaves", ("raco_cli", "raco_cli.errors", "raco_cli.cores", "raco_cli.defaults", "raco_cli.figures")),
)

# Library -> the only modules (or packages) that may import it.
ONLY_IMPORTED_BY: dict[str, tuple[str, ...]] = {
    "hydra": ("raco_cli.cli",),
    "hydra_plugins": ("raco_cli.cli",),  # Hydra's launcher plugins (joblib, submitit)
    "omegaconf": ("raco_cli.cli",),
    "submitit": ("raco_cli.cli",),  # the SLURM launcher's
    "mlflow": ("raco_cli.tracking",),
    "numba": ("raco_cli.methods.batched_scan",),
}


@cache
def module_files() -> dict[str, Path]:
    """``raco_cli.figures.plots -> .../raco_cli/figures/plots.py``; a package is its ``__init__``."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def _tree(module: str) -> ast.Module:
    path = module_files()[module]
    return ast.parse(path.read_text(), filename=str(path))


def _from_base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    is_package = module_files()[module].name == "__init__.py"
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _longest_module(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a module of the package."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in module_files():
            return ".".join(parts[:n])
    return None


def imports_of(module: str) -> Iterator[tuple[str, str | None, int]]:
    """``(target module, imported name or None, line)`` for every import of a package module
    in ``module``, wherever the statement stands (functions, ``if TYPE_CHECKING`` included)."""
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_module(alias.name)
                if target is not None:
                    yield target, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in module_files():  # `from pkg import submodule`
                    yield f"{base}.{alias.name}", None, node.lineno
                elif base in module_files():
                    yield base, alias.name, node.lineno


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (itself excluded)."""
    return {m: {t for t, _, _ in imports_of(m) if t != m} for m in module_files()}


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a circle (the strongly
    connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is a few hundred nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(sorted(c) for c in components)


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest import circle through the component's first module, breadth-first."""
    start = component[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & set(component)):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def private_uses() -> list[str]:
    """``file:line: name`` for each underscore name a module takes from another package module:
    ``from raco_cli.a import _x`` or ``a._x`` where ``a`` is bound to a package module by an import."""
    found: set[tuple[str, int, str]] = set()
    for module in module_files():
        where = _file(module)
        bound: dict[str, str] = {}  # local name -> package module it is bound to
        for target, name, line in imports_of(module):
            if name is not None and is_private(name) and target != module:
                found.add((where, line, f"from {target} import {name}"))
        tree = _tree(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in module_files():
                        bound[alias.asname] = alias.name
                    elif alias.name.split(".")[0] == PACKAGE:
                        bound[PACKAGE] = PACKAGE
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(module, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in module_files():
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                chain = _dotted(node)
                if chain is None or chain[0] not in bound:
                    continue
                target = bound[chain[0]]
                for attr in chain[1:]:
                    if is_private(attr) and target != module:
                        found.add((where, node.lineno, f"{'.'.join(chain)} ({target}.{attr})"))
                        break
                    if f"{target}.{attr}" not in module_files():
                        break
                    target = f"{target}.{attr}"
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def _dotted(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None when the chain does not start at a plain name."""
    parts: list[str] = []
    cur: ast.expr = node
    while isinstance(cur, ast.Attribute):
        parts.append(cur.attr)
        cur = cur.value
    if not isinstance(cur, ast.Name):
        return None
    return [cur.id, *reversed(parts)]


def _file(module: str) -> str:
    return str(module_files()[module].relative_to(ROOT))


def _within(module: str, prefix: str) -> bool:
    """Whether ``module`` is ``prefix`` or inside it (the package's own ``__init__`` only by name)."""
    return module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the module's layer (its longest listed prefix); None if unlisted."""
    found = [(len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes if _within(module, p)]
    return max(found)[1] if found else None


def upward(edges: Iterable[tuple[str, str, int]], layer: Callable[[str], int | None]) -> list[tuple[str, int, str]]:
    """``(module, line, target)`` of every import ``(module, target, line)`` whose target sits in a
    layer above the module's (a smaller layer index)."""
    out = set()  # (one line importing several names of a module is one arrow)
    for module, target, line in edges:
        mine, theirs = layer(module), layer(target)
        if mine is not None and theirs is not None and theirs < mine:
            out.add((module, line, target))
    return sorted(out)


def package_edges() -> Iterator[tuple[str, str, int]]:
    """``(module, imported package module, line)`` for every import between two modules."""
    for module in module_files():
        for target, _, line in imports_of(module):
            if target != module:
                yield module, target, line


def library_imports(module: str) -> Iterator[tuple[str, int]]:
    """``(top-level library name, line)`` for every absolute import of a module outside the package."""
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top != PACKAGE:
                yield top, node.lineno


def is_command(module: str) -> bool:
    """A ``raco <command>`` module: ``cli/<name>_cmd.py``."""
    return module.startswith(f"{PACKAGE}.cli.") and module.endswith("_cmd")


def describe(graph: dict[str, set[str]], tangle: list[str]) -> str:
    circle = " -> ".join(_file(m) for m in shortest_cycle(graph, tangle))
    return f"{', '.join(_file(m) for m in tangle)}\n    e.g. {circle}"


def test_relative_imports_resolve_from_the_importing_module() -> None:
    def base(module: str, statement: str) -> str:
        node = ast.parse(statement).body[0]
        assert isinstance(node, ast.ImportFrom)
        return _from_base(module, node)

    assert base("raco_cli.objectives.dro", "from . import divergences") == "raco_cli.objectives"
    assert base("raco_cli.objectives.dro", "from ..figures.canvas import save") == "raco_cli.figures.canvas"
    assert base("raco_cli.models", "from .resnet import resnet16") == "raco_cli.models.resnet"  # a package's __init__


def test_the_graph_sees_function_local_and_module_level_imports() -> None:
    graph = import_graph()
    assert len(graph) > 50 and all(m.startswith(PACKAGE) for m in graph)
    # a function-local import into a package's __init__ (models imports torch code only when
    # a model is built) and a module-level one
    assert "raco_cli.models.resnet" in graph["raco_cli.models"]
    assert "raco_cli.figures.canvas" in graph["raco_cli.figures.plots"]


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph()
    found = tangles(graph)
    assert not found, "modules that import each other round a circle:\n" + "\n".join(describe(graph, t) for t in found)


def test_no_module_takes_a_private_name_from_another() -> None:
    found = private_uses()
    assert not found, "underscore names used across modules (make them public):\n" + "\n".join(found)


def test_tangles_finds_a_planted_circle() -> None:
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert tangles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert shortest_cycle(graph, ["a", "b", "c"]) == ["a", "c", "a"]


def test_every_module_has_a_layer() -> None:
    unlisted = [_file(m) for m in module_files() if layer_of(m) is None]
    assert not unlisted, "modules in no layer (add them to LAYERS here and in docs/architecture.md):\n" + "\n".join(unlisted)


def test_layers_point_down() -> None:
    found = upward(package_edges(), layer_of)
    lines = []
    for module, line, target in found:
        mine, theirs = layer_of(module), layer_of(target)
        assert mine is not None and theirs is not None
        lines.append(f"{_file(module)}:{line}: imports {target} ({LAYERS[theirs][0]}), a layer above {LAYERS[mine][0]}")
    assert not found, "imports that point up a layer (move the imported code down, or pass it in from above):\n" + "\n".join(lines)


def test_libraries_are_imported_only_where_the_layers_allow() -> None:
    found = []
    for module in module_files():
        for library, line in library_imports(module):
            allowed = ONLY_IMPORTED_BY.get(library)
            if allowed is not None and not any(_within(module, a) for a in allowed):
                found.append(f"{_file(module)}:{line}: imports {library} (allowed only in {', '.join(allowed)})")
    assert not found, "libraries imported outside their layer:\n" + "\n".join(sorted(found))


def test_no_command_imports_another() -> None:
    """``cli/main.py`` dispatches the commands; a command calls the layers below and the shared
    modules of ``cli/``, never another command (what two commands share is a module of its own)."""
    found = sorted(f"{_file(m)}:{line}: imports {t}" for m, t, line in package_edges() if is_command(m) and is_command(t))
    assert not found, "commands that import another command's module:\n" + "\n".join(found)


def test_unit_tests_are_arranged_like_the_code() -> None:
    """``tests/unit/<package>/`` tests ``raco_cli/<package>/`` (top-level modules: ``tests/unit/``)."""
    folders = sorted(p.name for p in (ROOT / "tests" / "unit").iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert [f for f in folders if not (ROOT / PACKAGE / f).is_dir()] == []


def test_upward_finds_a_planted_import() -> None:
    layers = {"top": 0, "top.a": 0, "mid": 1, "low": 2}
    edges = [("mid", "low", 3), ("low", "mid", 7), ("low", "mid", 7), ("top.a", "top", 1), ("mid", "top.a", 9), ("low", "low", 2)]
    assert upward(edges, layers.get) == [("low", 7, "mid"), ("mid", 9, "top.a")]
    assert layer_of("raco_cli.run.private_search") == layer_of("raco_cli.run") == 3
    assert layer_of(PACKAGE) == len(LAYERS) - 1 and layer_of("raco_cli.cli") == 2
