"""Python work per add: function calls and allocations per ``LedgerHandle.append``.

A fixed workload through the public API, in process: a ``LocalCluster`` of 3 bookies (real
files under a temp dir, LocalCluster's default settings), one ledger per quorum (E3/Qw2/Qa2
and E1/Qw1/Qa1), ``--adds`` appends of ``--size`` bytes kept ``--inflight`` deep by the
closed-loop driver (``pybk.bench.closed_loop``), after a warm-up. Measured on the event loop's
thread (the fsync thread and the sync helper are not counted), twice:

* calls: ``cProfile``'s total function calls (Python and C) during the appends, divided by
  the appends; the functions with the most calls per add are listed;
* allocations: memory blocks allocated per add, counted by a profile hook that adds up every
  increase of ``sys.getallocatedblocks()`` between two call/return events (a lower bound: a
  block allocated and freed between two events is not seen; objects of up to 512 bytes, i.e.
  nearly every Python object, come from these blocks).

The driver's own share (its callback, the future and the lambda per append) is measured the
same way against a system that does nothing (a future resolved at the next pass of the
loop) and printed apart, then subtracted: "net" is pybk's work per add.

    python benchmarks/add_profile.py [--adds 5000] [--inflight 256] [--top 15]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from _common import closed_loop

import pybk
from pybk import LocalCluster

QUORUMS = ((3, 2, 2), (1, 1, 1))


class AllocationCounter:
    """A profile hook summing increases of ``sys.getallocatedblocks()`` between events."""

    def __init__(self) -> None:
        self.total = 0
        self._last = sys.getallocatedblocks()

    def hook(self, _frame: Any, _event: str, _arg: Any) -> None:
        now = sys.getallocatedblocks()
        if now > self._last:
            self.total += now - self._last
        self._last = now

    def __enter__(self) -> AllocationCounter:
        self._last = sys.getallocatedblocks()
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


async def fixed_work(append: Callable[[], asyncio.Future[Any]], adds: int,
                     inflight: int) -> None:
    """Exactly ``adds`` appends, ``inflight`` outstanding, each completion issuing the next."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    issued = done = 0

    def issue(f: asyncio.Future[Any] | None = None) -> None:
        nonlocal issued, done
        if f is not None:
            done += 1
            if f.exception() is not None:
                if not finished.done():
                    finished.set_exception(f.exception())  # type: ignore[arg-type]
                return
            if done == adds:
                finished.set_result(None)
        if issued < adds:
            issued += 1
            append().add_done_callback(issue)

    for _ in range(inflight):
        issue()
    await finished


_PREFIXES = (os.path.dirname(os.path.dirname(os.path.abspath(asyncio.__file__))) + os.sep,
             os.path.dirname(os.path.dirname(os.path.abspath(pybk.__file__))) + os.sep)


def short(func: tuple[str, int, str]) -> str:
    """``file:line(name)`` with the stdlib's and the checkout's directories cut off."""
    text = pstats.func_std_string(func)
    for prefix in _PREFIXES:
        text = text.replace(prefix, "")
    return text


def is_python(func: tuple[str, int, str]) -> bool:
    """A pstats key of a Python function (not a C builtin or method)."""
    return func[0] != "~"


async def measure(append: Callable[[], asyncio.Future[Any]], adds: int, inflight: int,
                  top: int) -> tuple[float, float, float, list[tuple[float, str]]]:
    """(calls per add, of which Python functions, allocations per add,
    [(calls per add, Python function)] most called)."""
    await closed_loop(append, inflight, 0.2)  # warm-up
    gc.collect()
    prof = cProfile.Profile()
    prof.enable()
    await fixed_work(append, adds, inflight)
    prof.disable()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    calls = sum(v[1] for v in stats.values()) / adds
    py_calls = sum(v[1] for k, v in stats.items() if is_python(k)) / adds
    rows = sorted(((v[1] / adds, short(k))
                   for k, v in stats.items() if is_python(k)), reverse=True)[:top]
    await closed_loop(append, inflight, 0.1)
    gc.collect()
    with AllocationCounter() as counter:
        await fixed_work(append, adds, inflight)
    return calls, py_calls, counter.total / adds, rows


class Nothing:
    """No I/O at all: each future resolved at the next pass of the loop (the driver alone)."""

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[None]] = []

    def append(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self.waiters:
            loop.call_soon(self._resolve)
        self.waiters.append(fut)
        return fut

    def _resolve(self) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            fut.set_result(None)


async def main_async(args: argparse.Namespace) -> None:
    payload = os.urandom(args.size)
    base_calls, base_py, base_allocs, _ = await measure(Nothing().append, args.adds,
                                                        args.inflight, 0)
    print(f"{args.adds} appends of {args.size} B, {args.inflight} in flight, in process "
          "(LocalCluster defaults, real files); per add, on the loop's thread")
    print(f"driver alone (a future per add, resolved by a no-op system): {base_calls:.1f} "
          f"calls ({base_py:.1f} of Python functions), {base_allocs:.1f} allocations per add")
    with tempfile.TemporaryDirectory(prefix="pybk-profile-", dir=args.dir) as root:
        async with LocalCluster(root, 3) as cluster:
            client = cluster.client()
            for quorum in QUORUMS:
                lh = await client.create_ledger(*quorum)
                calls, py, allocs, rows = await measure(lambda lh=lh: lh.append(payload),
                                                        args.adds, args.inflight, args.top)
                await lh.close()
                name = "E{}/Qw{}/Qa{}".format(*quorum)
                print(f"\n{name}: {calls:.1f} calls/add, {calls - base_calls:.1f} net of the "
                      f"driver (Python functions {py:.1f}, net {py - base_py:.1f}); "
                      f"{allocs:.1f} allocations/add, {allocs - base_allocs:.1f} net")
                if rows:
                    print("  Python functions most called (calls per add):")
                    for per, fn in rows:
                        print(f"  {per:7.2f}  {fn}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adds", type=int, default=5_000)
    ap.add_argument("--inflight", type=int, default=256)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--top", type=int, default=15, help="functions listed per quorum")
    ap.add_argument("--dir", default=None, help="where the temp directory goes")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
