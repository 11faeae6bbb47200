"""Fault knobs of a simulated run (swarm testing: each seed picks its own mix and rates).

:class:`Faults` says which kinds of faults a run *may* inject; :meth:`Faults.swarm` turns that
into a concrete :class:`FaultPlan` for one seed by switching kinds off at random and drawing
their rates, as TigerBeetle's VOPR and swarm testing do: runs that stress one kind hard find
bugs that uniform low rates never reach.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, fields

__all__ = [
    "ALL_KINDS",
    "EVENT_KINDS",
    "FOCUS_MIXES",
    "LATER_KINDS",
    "NET_KINDS",
    "POLLED_SHARE",
    "WORKLOAD_KINDS",
    "FaultPlan",
    "Faults",
]

#: Network message faults (rates per message).
NET_KINDS = ("drop", "duplicate", "reorder", "corrupt", "reset")
#: Scheduled faults (events drawn during the safety phase).
EVENT_KINDS = (
    "partition",  # symmetric client<->bookie
    "asym_partition",  # one direction only
    "isolate",  # one bookie cut from every client
    "swizzle",  # clog a random subset one by one, heal in random order
    "slow_link",  # one writer->bookie path gets slow (messages late, still in order)
    "lose_fence",  # the next fencing request to one bookie is lost
    "recovery_timeout",  # recovery reads to some bookies of a ledger time out, then recover
    "crash",  # bookie crash (drop/torn/reorder unsynced data) + restart later
    "wipe",  # bookie restarts with an empty disk under the same identity
    "bitflip",  # flip a bit in a committed record (while the bookie is down)
    "latent",  # latent read error in committed data
    "misdirect",  # a write landed at another offset, or reads of a range come from another
    "fsync_eio",  # next fsync fails
    "enospc",  # disk full for a while
    "slow_fsync",  # fsync takes long for a while
    "pause_writer",  # freeze the writer past its timeouts
    "crash_writer",  # the writer process dies; a new writer takes over
    "meta_stall",  # metadata operations hang for a while
    "meta_cas",  # spurious compare-and-set conflicts for a while
    "meta_expire",  # the bookies' registry session expires (they vanish, then re-register)
    "clock_jump",  # the monotonic clock jumps ahead (every timer late), the wall clock +/-
    "lose_auditor_host",  # the auditor's host goes: its bookie and auditor, sessions lapse later
)
#: Kinds a workload schedules for itself, from its own stream, in the seeds that draw it (the
#: swarm never draws them: a seed without the workload keeps its plan and schedule). The spec
#: allows or forbids them as any kind.
WORKLOAD_KINDS = (
    "crash_table_server",  # a table server dies, aimed at a read beside a write in flight
)
ALL_KINDS = NET_KINDS + EVENT_KINDS + WORKLOAD_KINDS
#: Kinds added after the swarm's draws were settled: each is enabled from a stream of its own
#: (``Faults.swarm``'s ``draws``), so that a seed that does not draw it keeps its plan.
LATER_KINDS = ("lose_auditor_host",)
#: The share of seeds (of a spec with fault kinds) whose metadata watches are polled, drawn
#: from a stream of its own.
POLLED_SHARE = 1 / 3

#: Focused mixes: some seeds stress one dangerous area hard instead of everything a little
#: (a uniform mix rarely lines up the two or three faults a real bug needs).
FOCUS_MIXES: tuple[tuple[str, ...], ...] = (
    ("slow_link", "lose_fence", "drop"),  # late adds vs recovery (BK 2614)
    ("crash", "slow_fsync"),  # crashes with unsynced data in flight
    ("latent", "bitflip", "crash"),  # lying disks (BK 2908)
    ("pause_writer", "crash_writer", "partition", "crash"),  # zombie writers, fencing
    ("fsync_eio", "enospc", "crash"),  # disk errors (fsyncgate)
    ("recovery_timeout", "slow_link", "crash", "partition"),  # recovery meets slow bookies
    ("misdirect", "bitflip", "crash"),  # lying disks, misdirected I/O
    ("clock_jump", "pause_writer", "crash_writer", "slow_fsync"),  # time that jumps
)


@dataclass(frozen=True)
class Faults:
    """Which fault kinds a run may use, and the regime.

    ``beyond_tolerance=True`` lifts the fault atlas (more bookies may be damaged than the
    replication can cover); the checker then accepts clean errors and skips liveness, but a
    ledger must still never close short or serve wrong bytes.
    """

    kinds: tuple[str, ...] = ()
    beyond_tolerance: bool = False
    #: Mean seconds between scheduled fault events in the safety phase.
    mean_interval: float = 1.5
    #: Metadata watches delivered as real backends deliver them (established late, polled,
    #: coalesced; :mod:`pybk.metadata.memory_watches`) instead of at the instant of a change.
    polled_watches: bool = False

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in ALL_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(ALL_KINDS)}")

    @classmethod
    def none(cls) -> Faults:
        return cls(())

    @classmethod
    def all(cls) -> Faults:
        return cls(ALL_KINDS)

    @classmethod
    def network(cls) -> Faults:
        return cls((*NET_KINDS, "partition", "asym_partition", "isolate", "swizzle",
                    "slow_link", "lose_fence", "recovery_timeout"))

    @classmethod
    def process(cls) -> Faults:
        return cls(("crash", "wipe", "pause_writer", "crash_writer", "meta_stall", "meta_cas",
                    "meta_expire", "clock_jump", "lose_auditor_host", "crash_table_server"))

    @classmethod
    def disk(cls) -> Faults:
        return cls(("crash", "bitflip", "latent", "misdirect", "fsync_eio", "enospc",
                    "slow_fsync"))

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """``all``, ``none``, ``network``, ``process``, ``disk``, ``beyond`` or a comma list of
        kinds/groups (``beyond`` adds the beyond-tolerance regime)."""
        kinds: list[str] = []
        beyond = polled = False
        for part in filter(None, (p.strip() for p in spec.split(","))):
            if part == "beyond":
                beyond = True
                continue
            if part == "polled_watches":
                polled = True
                continue
            group = {"all": ALL_KINDS, "none": (), "network": cls.network().kinds,
                     "process": cls.process().kinds, "disk": cls.disk().kinds}.get(part)
            kinds.extend(group if group is not None else (part,))
        return cls(tuple(dict.fromkeys(kinds)), beyond_tolerance=beyond, polled_watches=polled)

    def spec(self) -> str:
        if set(self.kinds) == set(ALL_KINDS):
            text = "all"
        elif not self.kinds:
            text = "none"
        else:
            text = ",".join(self.kinds)
        return (text + (",beyond" if self.beyond_tolerance else "")
                + (",polled_watches" if self.polled_watches else ""))

    def swarm(self, rng: random.Random,
              draws: Callable[[str], random.Random] | None = None) -> FaultPlan:
        """The concrete plan of one seed: a random subset of the allowed kinds, random rates.

        ``draws(name)`` gives the seed's stream ``name``: each of the :data:`LATER_KINDS` is
        enabled as the others are (in 7 seeds of 10) but from a stream of its own, and the
        metadata watches are polled in :data:`POLLED_SHARE` of the seeds (without ``draws``:
        neither)."""
        plan = FaultPlan(beyond_tolerance=self.beyond_tolerance,
                         mean_interval=self.mean_interval * rng.choice((0.5, 1.0, 2.0)),
                         polled_watches=self.polled_watches)
        settled = [k for k in self.kinds if k not in LATER_KINDS and k not in WORKLOAD_KINDS]
        enabled = [k for k in settled if rng.random() < 0.7]
        focus = [m for m in FOCUS_MIXES if set(m) <= set(self.kinds)]
        if focus and rng.random() < 0.5:
            enabled = list(rng.choice(focus))
        if draws is not None:
            enabled += [k for k in LATER_KINDS
                        if k in self.kinds and draws(f"kind:{k}").random() < 0.7]
            if self.kinds and draws("polled_watches").random() < POLLED_SHARE:
                plan.polled_watches = True
        if self.kinds and not enabled:
            enabled = [rng.choice(settled or self.kinds)]
        for kind in NET_KINDS:
            if kind in enabled:
                setattr(plan, kind, rng.choice((0.002, 0.01, 0.03)))
        plan.events = [k for k in EVENT_KINDS if k in enabled]
        plan.weights = {k: rng.choice((1, 2, 4)) for k in plan.events}
        return plan


@dataclass
class FaultPlan:
    """The faults one seed actually injects (printed in the trace header)."""

    beyond_tolerance: bool = False
    mean_interval: float = 1.5
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    reset: float = 0.0
    events: list[str] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=dict)
    polled_watches: bool = False

    def describe(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if f.name in NET_KINDS and getattr(self, f.name)]
        parts.append("events=" + ",".join(f"{k}x{self.weights[k]}" for k in self.events))
        if self.beyond_tolerance:
            parts.append("beyond_tolerance")
        if self.polled_watches:
            parts.append("polled_watches")
        return " ".join(parts)
