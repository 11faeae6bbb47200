"""The quorum rules of the ledger protocol, sans-IO.

Every decision the client makes about quorums lives here, as plain objects with no awaits
(the h11 style): which bookies an entry goes to, when an add is acknowledged, when a
fencing/LAC read has heard from enough bookies, when recovery may call an entry absent, and
what an ensemble change writes into the metadata. The async drivers in
:mod:`pybk.client.writer`, :mod:`~pybk.client.reader` and
:mod:`~pybk.client.recovery` only feed these objects replies and act on their answers,
so the rules can be checked exhaustively (``tests/client/test_quorum.py``).

Rules (Apache BookKeeper, ``RoundRobinDistributionSchedule``, ``AckSet``,
``RRQuorumCoverageSet``, ``ReadOpBase``, ``EnsembleUtils``) (listed in docs/internals.md,
"pybk/client/quorum.py").
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pybk.client.placement import BookieNode, PlacementPolicy
from pybk.errors import NotEnoughBookiesError

__all__ = [
    "AckSet",
    "Answer",
    "CoverageSet",
    "EnsembleChange",
    "EntryState",
    "Quorums",
    "RecoveryReadDecision",
    "choose_ensemble",
    "plan_ensemble_change",
    "validate_quorums",
]


def validate_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise ValueError naming the bad value unless ``E >= Qw >= Qa >= 1``."""
    for name, value in (
        ("ensemble_size", ensemble_size),
        ("write_quorum", write_quorum),
        ("ack_quorum", ack_quorum),
    ):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, not {value!r}")
    if ack_quorum < 1:
        raise ValueError(f"ack_quorum must be >= 1, got {ack_quorum}")
    if write_quorum < ack_quorum:
        raise ValueError(
            f"write_quorum ({write_quorum}) must be >= ack_quorum ({ack_quorum})"
        )
    if ensemble_size < write_quorum:
        raise ValueError(
            f"ensemble_size ({ensemble_size}) must be >= write_quorum ({write_quorum})"
        )


@dataclass(frozen=True, slots=True)
class Quorums:
    """E, Qw, Qa of a ledger, with the striping schedule."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        validate_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)

    def write_set(self, entry_id: int) -> list[int]:
        """Ensemble indices that store ``entry_id``, in send order."""
        e = self.ensemble_size
        start = entry_id % e
        return [(start + i) % e for i in range(self.write_quorum)]

    def has_entry(self, entry_id: int, index: int) -> bool:
        """Is ensemble index ``index`` in the write set of ``entry_id``?"""
        return (index - entry_id) % self.ensemble_size < self.write_quorum

    @property
    def max_failures(self) -> int:
        """Failures an add tolerates in its write set and can still reach Qa."""
        return self.write_quorum - self.ack_quorum

    @property
    def absent_threshold(self) -> int:
        """NoSuchEntry replies in a write set that prove an entry was never acknowledged."""
        return self.write_quorum - self.ack_quorum + 1


# --------------------------------------------------------------------------- acks


class AckSet:
    """Acks for one entry, by ensemble index (BookKeeper's ``AckSet``); bitmasks, as one
    exists per entry in flight."""

    __slots__ = ("_acked", "_failed", "quorums")

    def __init__(self, quorums: Quorums) -> None:
        self.quorums = quorums
        self._acked = 0
        self._failed = 0

    def ack(self, index: int) -> bool:
        """Record an ack from ``index``; True when the entry has reached Qa."""
        bit = 1 << index
        self._failed &= ~bit
        self._acked |= bit
        return self._acked.bit_count() >= self.quorums.ack_quorum

    def fail(self, index: int) -> bool:
        """Record a failure of ``index``; True when Qa can no longer be reached."""
        bit = 1 << index
        self._acked &= ~bit
        self._failed |= bit
        return self._failed.bit_count() > self.quorums.max_failures

    def unset(self, index: int) -> None:
        """Forget anything ``index`` said (its slot was given to another bookie)."""
        bit = ~(1 << index)
        self._acked &= bit
        self._failed &= bit

    @property
    def complete(self) -> bool:
        return self._acked.bit_count() >= self.quorums.ack_quorum

    @property
    def acked(self) -> frozenset[int]:
        return frozenset(i for i in range(self._acked.bit_length()) if self._acked >> i & 1)


# --------------------------------------------------------------------------- coverage


class Answer(enum.Enum):
    """How a bookie answered a LAC/fence/recovery read."""

    OK = "ok"  # a valid entry (good digest) or a valid "I hold nothing after X"
    ABSENT = "absent"  # NoSuchEntry / NoSuchLedger: a definite negative
    UNKNOWN = "unknown"  # error, timeout, digest mismatch, or not answered yet


class CoverageSet:
    """Has a LAC/fence read heard from enough bookies of the ensemble?

    Covered when each of the E write sets has fewer than Qa bookies whose answer is
    unknown: then no write set can hold Qa bookies that both accepted an entry we have not
    seen and were not fenced (``RRQuorumCoverageSet.checkCovered``).
    """

    __slots__ = ("_answers", "quorums")

    def __init__(self, quorums: Quorums) -> None:
        self.quorums = quorums
        self._answers: list[Answer] = [Answer.UNKNOWN] * quorums.ensemble_size

    def answer(self, index: int, answer: Answer) -> None:
        self._answers[index] = answer

    def covered(self) -> bool:
        q = self.quorums
        for start in range(q.ensemble_size):
            unknown = 0
            for i in range(q.write_quorum):
                if self._answers[(start + i) % q.ensemble_size] is Answer.UNKNOWN:
                    unknown += 1
            if unknown >= q.ack_quorum:
                return False
        return True


# --------------------------------------------------------------------------- recovery reads


class EntryState(enum.Enum):
    EXISTS = "exists"
    ABSENT = "absent"
    PENDING = "pending"  # more replies may still decide
    UNKNOWN = "unknown"  # every replica answered and nothing decided: recovery must fail


class RecoveryReadDecision:
    """The decision for one entry read during recovery (``ReadOpBase`` + TLA+ spec).

    Exists as soon as any replica returns it with a good digest; absent once
    ``Qw - Qa + 1`` replicas of its write set say NoSuchEntry/NoSuchLedger; when every
    replica has answered without either, the outcome is UNKNOWN and recovery fails.
    """

    __slots__ = ("_answers", "quorums")

    def __init__(self, quorums: Quorums) -> None:
        self.quorums = quorums
        self._answers: dict[int, Answer] = {}

    def answer(self, index: int, answer: Answer) -> EntryState:
        if index not in self._answers or self._answers[index] is Answer.UNKNOWN:
            self._answers[index] = answer
        return self.state

    @property
    def state(self) -> EntryState:
        answers = list(self._answers.values())
        if Answer.OK in answers:
            return EntryState.EXISTS
        if answers.count(Answer.ABSENT) >= self.quorums.absent_threshold:
            return EntryState.ABSENT
        if len(answers) >= self.quorums.write_quorum:
            return EntryState.UNKNOWN
        return EntryState.PENDING


# --------------------------------------------------------------------------- ensembles


def choose_ensemble(
    writable: Sequence[str], size: int, rng: random.Random, exclude: Sequence[str] = ()
) -> list[str]:
    """Pick ``size`` distinct bookies from ``writable`` (minus ``exclude``) with ``rng``."""
    excluded = set(exclude)
    candidates = sorted(b for b in dict.fromkeys(writable) if b not in excluded)
    if len(candidates) < size:
        raise NotEnoughBookiesError(
            f"need {size} writable bookies, have {len(candidates)}: {candidates}"
        )
    return rng.sample(candidates, size)


@dataclass(frozen=True, slots=True)
class EnsembleChange:
    """The result of :func:`plan_ensemble_change`."""

    ensembles: dict[int, tuple[str, ...]]  # the whole new ensembles map
    start: int  # first entry id of the changed fragment
    replaced: dict[int, str]  # ensemble index -> new bookie


def plan_ensemble_change(
    ensembles: Mapping[int, Sequence[str]],
    lac: int,
    failed: Mapping[int, str],
    writable: Sequence[str] | Sequence[BookieNode],
    rng: random.Random,
    policy: PlacementPolicy | None = None,
    write_quorum: int | None = None,
) -> EnsembleChange | None:
    """What an ensemble change writes (``EnsembleUtils.replaceBookiesInEnsemble``).

    ``failed`` maps ensemble indices of the *last* ensemble to the bookie that failed
    there. Slots that no longer hold that bookie are ignored (someone already replaced
    it); if none are left, returns None (nothing to do). Replacements come from
    ``writable``, never from the current ensemble or the failed bookies, chosen by
    ``policy`` (one slot at a time, so a rack-aware policy sees the slots already refilled;
    ``write_quorum`` is then required) or at random without one. The new fragment starts
    at ``lac + 1``; if the last fragment already starts there (nothing confirmed since it
    began) it is replaced in place. Raises NotEnoughBookiesError when there are too few
    replacements.
    """
    last_start = max(ensembles)
    last = list(ensembles[last_start])
    if last_start > lac + 1:
        raise AssertionError(f"last fragment starts at {last_start}, beyond LAC+1 = {lac + 1}")
    todo = {i: b for i, b in sorted(failed.items()) if 0 <= i < len(last) and last[i] == b}
    if not todo:
        return None
    replaced: dict[int, str] = {}
    if policy is None:
        ids = [w.bookie_id if isinstance(w, BookieNode) else w for w in writable]
        exclude = list(last) + list(failed.values())
        new_bookies = choose_ensemble(ids, len(todo), rng, exclude=exclude)
        for (index, _), bookie in zip(todo.items(), new_bookies, strict=True):
            last[index] = bookie
            replaced[index] = bookie
    else:
        if write_quorum is None:
            raise ValueError("plan_ensemble_change with a policy needs write_quorum")
        nodes = [w if isinstance(w, BookieNode) else BookieNode(w) for w in writable]
        for index in todo:
            bookie = policy.replace_bookie(nodes, last, index, write_quorum, rng,
                                           exclude=list(failed.values()))
            last[index] = bookie
            replaced[index] = bookie
    new = {k: tuple(v) for k, v in ensembles.items()}
    new[lac + 1] = tuple(last)
    return EnsembleChange(new, lac + 1, replaced)
