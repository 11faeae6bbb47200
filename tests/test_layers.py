"""The package's layers, as docs/architecture.md draws them, checked against the imports.

Each part of pybk has a floor; a module may import from its own floor or below, never above
(imports made only for type checking are not counted: they cost nothing at run time and
make no cycle). Production code (everything below the outer floor) never imports the
simulator, the test kit or the command line, not even inside a function. A new package gets
a floor here when it is added; an import that must go up is listed in ``UPWARD`` with why.
"""

from __future__ import annotations

import ast
import pathlib

import pybk

ROOT = pathlib.Path(pybk.__file__).parent

#: floor of each part (a subpackage, or a module at the package root), ground first; a
#: module may have a floor of its own ("part.module"), higher or lower than its package's
FLOORS: dict[str, int] = {
    # the base: errors, stats, wire types and digests, runtime plumbing
    "errors": 0,
    "stats": 0,
    "runtime": 0,  # event-loop helpers, GC tuning, directory locks, Prometheus families
    "wire": 1,
    "storage": 2,
    "metadata": 2,
    "transport": 3,
    "bookie": 4,
    "client": 5,
    "logs": 6,
    "ops": 6,
    # the server and the embedded facades
    "clusters": 0,  # the shape every cluster has (a Protocol; imports nothing of pybk)
    "cluster": 7,
    "server": 8,
    "sync": 8,
    "tables": 8,  # key/value tables on logs and their gRPC server (beside server/ and sync/)
    "wal": 9,
    "__init__": 10,
    # the outer floor: may import anything; nothing below imports them
    "sim": 11,
    "testing": 11,
    "spark": 11,
    "bench": 11,
    "cli": 12,
    "__main__": 12,
}
OUTER = {"sim", "testing", "spark", "bench", "cli", "__main__"}

#: imports that go up a floor on purpose: (from part, to part, why)
UPWARD: set[tuple[str, str]] = {
    # Client.namespace() hands out the log layer's Namespace for the client it is called on
    # (docs/api.md: ``client.namespace("default")``); imported inside the method, no cycle
    ("client", "logs"),
    # Client.admin() hands out the admin API (pybk.ops.Admin) for the client it is called on
    # (docs/api.md: ``client.admin()``); imported inside the method, no cycle
    ("client", "ops"),
}


def floor(part: str) -> int:
    """A part's floor: its own entry ("part.module") if it has one, else its package's."""
    if part in FLOORS:
        return FLOORS[part]
    return FLOORS[part.split(".")[0]]


def _part(module: str) -> str:
    """``pybk.client.writer`` -> ``client.writer``; ``pybk.errors`` -> ``errors``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return ".".join(parts[1:3])


def _package(part: str) -> str:
    return part.split(".")[0]


def _modules() -> list[tuple[str, str, ast.Module]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out.append((str(path.relative_to(ROOT.parent)), module, ast.parse(path.read_text())))
    return out


def _runtime_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return [n for n in ast.walk(tree) if id(n) not in skip]


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        if node.module == "pybk":
            return [f"pybk.{a.name}" for a in node.names]
        if node.module.startswith("pybk."):
            return [node.module]
    elif isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("pybk.")]
    return []


def _imports() -> list[tuple[str, str, str, bool]]:
    """(importing module's file, its part, the imported part, at module level?) for every
    import of a pybk module that runs at run time."""
    found = []
    for path, module, tree in _modules():
        top = {id(n) for n in tree.body}
        for node in _runtime_nodes(tree):
            for target in _targets(node):
                found.append((path, _part(module), _part(target), id(node) in top))
    return found


def test_every_part_has_a_floor() -> None:
    parts = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert parts - FLOORS.keys() == set(), "give each new part a floor in FLOORS"


def _upward(src: str, dst: str) -> bool:
    return (floor(dst) > floor(src)
            and (_package(src), _package(dst)) not in UPWARD and (src, dst) not in UPWARD)


def test_no_import_goes_up_a_floor() -> None:
    """Per module: a module with a floor of its own is held to it, not to its package's."""
    bad = [f"{path}: {src} (floor {floor(src)}) imports {dst} (floor {floor(dst)})"
           for path, src, dst, _top in _imports()
           if _package(src) != _package(dst) and _upward(src, dst)]
    assert bad == []


def test_production_code_never_imports_the_simulator_the_test_kit_or_the_cli() -> None:
    bad = [f"{path}: {src} imports {dst}" for path, src, dst, _top in _imports()
           if _package(src) not in OUTER and _package(dst) in OUTER]
    assert bad == []


def test_no_module_imports_another_modules_private_names() -> None:
    """``from pybk.x import _name`` reaches into another module's insides: give the name a
    public spelling where it is defined instead (dunder names are not private)."""
    bad = [f"{path}: {node.module}.{a.name}"
           for path, _module, tree in _modules() for node in ast.walk(tree)
           if isinstance(node, ast.ImportFrom) and node.module
           and node.module.startswith("pybk") and node.level == 0
           for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


def _module_graph() -> dict[str, set[str]]:
    """module -> the pybk modules it imports at module level (run-time imports only)."""
    known = {module for _path, module, _tree in _modules()}
    graph: dict[str, set[str]] = {}
    for _path, module, tree in _modules():
        top = {id(n) for n in tree.body}
        deps = graph.setdefault(module, set())
        for node in _runtime_nodes(tree):
            if id(node) not in top:
                continue
            for target in _targets(node):
                if target in known:
                    deps.add(target)
                for a in getattr(node, "names", []):
                    if f"{target}.{a.name}" in known:  # from pybk.pkg import module
                        deps.add(f"{target}.{a.name}")
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_init_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Without the edges from a package's ``__init__`` to its own modules (it re-exports
    them; that is how a package is made, not a cycle between jobs)."""
    return {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_package_init_edges(_module_graph())) == []


def test_the_checker_above_can_fail() -> None:
    """The rules are not vacuous: an import going up is seen (cluster -> wal would be one), a
    module's own floor is used, a private import and a cycle would be seen."""
    assert FLOORS["wal"] > FLOORS["cluster"] and ("cluster", "wal") not in UPWARD
    assert _upward("cluster", "wal") and not _upward("wal", "cluster")
    assert any(src == "cli.simulate" and _package(dst) == "sim" for _p, src, dst, _t in _imports())
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
