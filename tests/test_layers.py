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

#: floor of each part (a subpackage, or a module at the package root), ground first
FLOORS: dict[str, int] = {
    "errors": 0,
    "stats": 0,
    "dirlock": 1,  # a process-life directory lock (bookie processes, the embedded WAL)
    "eventloop": 0,
    "gctune": 0,  # garbage-collector settings the entry points apply (bookie, cluster, bench)
    "protocol": 1,
    "storage": 2,
    "metadata": 2,
    "transport": 3,
    "bookie": 4,
    "replication": 4,
    "client": 5,
    "cluster": 6,
    "stream": 6,
    "sync": 7,
    "wal": 8,
    "ops": 5,
    "__init__": 9,
    # the outer floor: may import anything; nothing below imports them
    "sim": 10,
    "testing": 10,
    "spark": 10,
    "bench": 10,
    "cli": 11,
    "__main__": 11,
}
OUTER = {"sim", "testing", "spark", "bench", "cli", "__main__"}

#: imports that go up a floor on purpose: (from part, to part, why)
UPWARD: set[tuple[str, str]] = {
    # Client.namespace() hands out the log layer's Namespace for the client it is called on
    # (docs/api.md: ``client.namespace("default")``); imported inside the method, no cycle
    ("client", "stream"),
    # the bookie process (pybk/bookie/process.py, the ``pybk bookie`` server) runs the HTTP
    # admin endpoint, the Prometheus collectors and auto-recovery next to its bookie;
    # imported inside its start-up only (request handling never reaches pybk.ops), with the
    # client those use to reach the other bookies
    ("bookie", "ops"),
    ("bookie", "client"),
}


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _imports() -> list[tuple[str, str, str, bool]]:
    """(importing module's file, its part, the imported part, at module level?) for every
    import of a pybk module that runs at run time."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for n in ast.walk(node))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "pybk":
                    targets = [f"pybk.{a.name}" for a in node.names]
                elif node.module.startswith("pybk."):
                    targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("pybk.")]
            for target in targets:
                found.append((str(path.relative_to(ROOT.parent)), _part(module), _part(target),
                              id(node) in top))
    return found


def test_every_part_has_a_floor() -> None:
    parts = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert parts - FLOORS.keys() == set(), "give each new part a floor in FLOORS"


def test_no_import_goes_up_a_floor() -> None:
    bad = [f"{path}: {src} (floor {FLOORS[src]}) imports {dst} (floor {FLOORS[dst]})"
           for path, src, dst, _top in _imports()
           if src != dst and FLOORS[dst] > FLOORS[src] and (src, dst) not in UPWARD]
    assert bad == []


def test_production_code_never_imports_the_simulator_the_test_kit_or_the_cli() -> None:
    bad = [f"{path}: {src} imports {dst}" for path, src, dst, _top in _imports()
           if src not in OUTER and dst in OUTER]
    assert bad == []


def test_the_checker_above_can_fail() -> None:
    """The rules are not vacuous: an import going up is seen (cluster -> wal would be one)."""
    assert FLOORS["wal"] > FLOORS["cluster"] and ("cluster", "wal") not in UPWARD
    assert any(src == "cli" and dst == "sim" for _p, src, dst, _t in _imports())
