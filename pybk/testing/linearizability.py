"""A linearizability checker for single-key histories (Wing and Gong's search, with Lowe's
cache of visited (linearized set, state) pairs, as Knossos and Porcupine check).

A history is a list of :class:`Op`: who called what, with which argument, what came back,
and when it was called and returned. An operation whose outcome is unknown (the call failed
in a way that may or may not have taken effect: a crash, a fenced write) has ``ret=None``: it
may be linearized anywhere after its call, or not at all. The question: is there a total
order of the operations, consistent with real time (an operation that returned before
another was called comes first), in which a sequential model gives every known operation
the output it got? Histories are checked per key (linearizability is compositional).

The model here is a table's key: ``put`` (-> None), ``get`` (-> the value or None),
``delete`` (-> whether it existed), ``incr`` (-> the new value; refused on bytes: output
``"bad"``), and ``put`` on a counter refused the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Op", "check", "kv_step"]


@dataclass(frozen=True)
class Op:
    """One call: ``kind`` and ``arg`` in, ``out`` back; ``call``/``ret`` its times (``ret``
    None: outcome unknown)."""

    kind: str
    arg: Any
    out: Any
    call: float
    ret: float | None


def kv_step(state: Any, kind: str, arg: Any) -> tuple[Any, Any]:
    """The sequential model of one key: (new state, output)."""
    if kind == "get":
        return state, state
    if kind == "put":
        if isinstance(state, int):
            return state, "bad"
        return arg, None
    if kind == "delete":
        return None, state is not None
    if kind == "incr":
        if isinstance(state, bytes):
            return state, "bad"
        new = (state or 0) + arg
        return new, new
    raise ValueError(f"unknown operation {kind!r}")


def check(history: Sequence[Op], step: Callable[[Any, str, Any], tuple[Any, Any]] = kv_step,
          initial: Hashable = None, *, max_states: int = 2_000_000) -> bool:
    """Whether ``history`` (one key) is linearizable for ``step`` from ``initial``.
    ValueError when the search would visit more than ``max_states`` states."""
    ops = sorted(history, key=lambda o: o.call)
    n = len(ops)
    rets = [math.inf if o.ret is None else o.ret for o in ops]
    required = 0
    for i, o in enumerate(ops):
        if o.ret is not None:
            required |= 1 << i
    seen: set[tuple[int, Any]] = set()
    stack: list[tuple[int, Any]] = [(0, initial)]
    while stack:
        done, state = stack.pop()
        if done & required == required:
            return True
        if (done, state) in seen:
            continue
        seen.add((done, state))
        if len(seen) > max_states:
            raise ValueError(f"history too large to check ({n} operations)")
        # the earliest return among the operations not yet placed bounds what may go next
        horizon = min((rets[j] for j in range(n) if not done >> j & 1), default=math.inf)
        for i in range(n):
            if done >> i & 1 or ops[i].call > horizon:
                continue
            new, out = step(state, ops[i].kind, ops[i].arg)
            if ops[i].ret is None or out == ops[i].out:
                stack.append((done | 1 << i, new))
    return False
