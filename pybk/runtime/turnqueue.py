"""Long jobs run a bounded step per loop turn, one step per turn for all of them (issue 34).

A job that reschedules itself with ``call_soon`` after each step holds the loop one step a
turn, but a loop turn runs every callback that was ready when it began: with sixty-four such
jobs at once, one turn ran sixty-four steps and the loop stalled for as long. A
:class:`TurnQueue` runs its jobs' steps round robin, one step per loop turn whatever the
number of jobs, so a turn holds at most one step of them beside everything else.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

__all__ = ["Step", "TurnQueue"]

#: one bounded piece of a job; returns True once the job is finished (never raises)
Step = Callable[[], bool]


class TurnQueue:
    """Jobs' steps, one per loop turn, round robin (on the running loop)."""

    def __init__(self) -> None:
        self._jobs: collections.deque[Step] = collections.deque()
        self._scheduled = False
        #: steps run (tests, operators)
        self.steps = 0

    def __len__(self) -> int:
        """Jobs not finished."""
        return len(self._jobs)

    def submit(self, step: Step) -> None:
        """Run ``step`` in a later loop turn, again and again until it returns True."""
        self._jobs.append(step)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        jobs = self._jobs
        step = jobs.popleft()
        self.steps += 1
        try:
            done = step()
        except Exception as exc:  # a step's bug: drop its job, keep the others going
            done = True
            asyncio.get_running_loop().call_exception_handler(
                {"message": "a TurnQueue step raised", "exception": exc})
        if not done:
            jobs.append(step)
        if jobs:
            asyncio.get_running_loop().call_soon(self._turn)
        else:
            self._scheduled = False
