"""The write pipeline's vocabulary: the actions :class:`pybk.client.pipeline.WritePipeline`
asks its driver to carry out, and what a bookie may answer to one of them.

Kept apart from the pipeline's rules so that both sides read them in one place: the sans-IO
core that makes them and the async driver (:mod:`pybk.client.writer`) that does what they say.
:mod:`pybk.client.pipeline` exports them too (their documented home).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pybk.errors import BKError

__all__ = ["Action", "AddOutcome", "ChangeEnsemble", "Fail", "Resolve", "Send", "SendLac"]

#: What a bookie said about a batch: None (every entry stored), one error for every entry,
#: or one outcome per entry, in the batch's order (see pybk.transport.base)
AddOutcome = BKError | None | Sequence[BKError | None]


class Send(NamedTuple):
    """Send ``bodies`` (entries ``entry_ids``, ascending) to the bookie in ensemble ``slot``."""

    slot: int
    bookie: str
    epoch: int
    entry_ids: list[int]
    bodies: list[bytes]


class Resolve(NamedTuple):
    """Entries ``first..last`` are confirmed (in order); ``waiters[i]`` is the waiter of entry
    ``first + i`` (None: nobody waits on that one)."""

    first: int
    last: int
    waiters: list[Any]


class Fail(NamedTuple):
    """The pipeline failed with ``error``: settle every waiter in ``waiters`` with it."""

    error: BaseException
    waiters: list[Any]


class ChangeEnsemble(NamedTuple):
    """Bookies failed and no change is in progress: start one. The driver loops on
    :meth:`WritePipeline.take_failed` until it returns nothing, then calls
    :meth:`WritePipeline.change_done`."""


class SendLac(NamedTuple):
    """Send ``lac`` to every bookie of ``bookies`` (readers tailing the ledger then see the
    last entries): the writer went quiet, or its timer ticked while idle
    (:mod:`pybk.client.lacflush`)."""

    lac: int
    bookies: list[str]


Action = Send | Resolve | Fail | ChangeEnsemble | SendLac
