"""'Sometimes' points: rare paths in protocol code, named, so a simulation sweep can say which
of them no seed reached (the idea of FoundationDB's TEST macro).

A module declares its points once (``RARE = sometimes.point("client.x", "why it matters")``)
and calls ``RARE()`` where the rare thing happens. Outside a :func:`recording` the call checks
one context variable and returns; the simulator records each run (its tasks inherit the
context), and its sweep lists the declared points never hit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["Point", "declared", "point", "recording"]

_hits: ContextVar[Counter[str] | None] = ContextVar("pybk_sometimes", default=None)
_declared: dict[str, str] = {}


class Point:
    """One named rare path; call it where the path is taken."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> None:
        hits = _hits.get()
        if hits is not None:
            hits[self.name] += 1

    def __repr__(self) -> str:
        return f"<sometimes {self.name}>"


def point(name: str, doc: str) -> Point:
    """Declare a point (module level); a name is declared once (ValueError otherwise)."""
    if not name or not doc:
        raise ValueError("a sometimes point needs a name and a line saying why it matters")
    if name in _declared and _declared[name] != doc:
        raise ValueError(f"sometimes point {name!r} is declared twice")
    _declared[name] = doc
    return Point(name)


def declared() -> dict[str, str]:
    """Every point declared by the modules imported so far: name -> why it matters."""
    return dict(sorted(_declared.items()))


@contextmanager
def recording() -> Iterator[Counter[str]]:
    """Count the points hit in this context (and the tasks created in it) until exit."""
    hits: Counter[str] = Counter()
    token = _hits.set(hits)
    try:
        yield hits
    finally:
        _hits.reset(token)
