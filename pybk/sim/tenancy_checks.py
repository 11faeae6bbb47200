"""Invariants T3-T5 of the bookies' tenancy gate in the simulator, judged as gates decide
(what the gate promises, docs/tenancy.md; the run is :mod:`pybk.sim.tenancy_gate`'s):

- **T3** (quota): a bookie admits a new entry (not a recovery add) of a namespace with a storage
  quota only while its stored payload bytes for the namespace, less a slack, are under the
  quota. The slack: the cluster principal's writes there since the bookie started (not charged
  until a recount) and the most bytes of the namespace's adds admitted and unanswered at once.
- **T4** (rate): the adds of one (principal, namespace) a bookie let through that were asked
  at ``x`` or later and started by ``y`` carry at most ``rate * (y - x)`` bytes (records) plus
  a burst (the token bucket's ``rate * BURST_SECONDS``), for windows up to
  :data:`T4_WINDOW`. Over the rate adds wait; they are never refused (T5). The same for the
  entries reads ask for, and for read bytes (charged once answered) with the slack of reads
  in flight at once (docs/tenancy.md).
- **T5** (refusals): a gate refuses only a new add of a namespace at its storage quota
  (QUOTA_EXCEEDED): never a read, a recovery add, a namespace without a quota (the calm
  tenant's), nor anyone for another tenant's limits.

T3 and T4 judge a bookie once it knows the namespace's limits (losses are the run checker's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pybk.bookie.tenancy import BURST_SECONDS, add_payload
from pybk.sim.checker import Violation
from pybk.sim.cluster import SimBookie
from pybk.storage.records import RECORD_HEADER_SIZE
from pybk.transport.identity import CLUSTER
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    AddRequest,
    ReadBatchRequest,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
)

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun
    from pybk.sim.tenancy_gate import GatePolicies

__all__ = ["T4_WINDOW", "GateChecks", "RateWindow"]

#: T4 judges windows of up to this many seconds
T4_WINDOW = 5.0
#: violations kept per invariant (a broken gate breaks its rule at every admission)
MAX_PER_INVARIANT = 5


class RateWindow:
    """T4 over one (bookie incarnation, principal, namespace, kind). The adds the gate let
    through, each with when it was asked (``c``) and when it started: for any ``x``, those
    asked at ``x`` or later and started by ``y`` carry at most ``rate * (y - x)`` plus a
    burst. (The bucket's schedule bounds them so however late the loop ran them: a stalled
    loop or a clock jump delays a start, never the bucket's accounting.) Windows of up to
    :data:`T4_WINDOW` seconds are judged."""

    __slots__ = ("rate", "recent")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.recent: list[tuple[float, int]] = []  # (asked, n), within the window

    def admit(self, asked: float, at: float, n: int) -> float:
        """The excess over the bound of the worst window ending now (> 0: too much)."""
        recent = self.recent
        recent.append((asked, n))
        if recent[0][0] < at - T4_WINDOW:
            recent[:] = [e for e in recent if e[0] >= at - T4_WINDOW]
        total = 0
        worst = float("-inf")
        for c, k in sorted(recent, reverse=True):
            total += k
            worst = max(worst, total - self.rate * (at - c))
        return worst - self.rate * BURST_SECONDS - 1e-6 * self.rate - 1e-6


class _Incarnation:
    """What T3 and T4 know of one bookie incarnation."""

    def __init__(self, sb: SimBookie, stored: int) -> None:
        self.sb = sb
        self.bound = stored  # an upper bound of (stored - slack): recount when at the quota
        self.cluster = 0  # bytes the cluster principal's adds of the namespace carried here
        self.pending: dict[int, tuple[Request, int]] = {}  # admitted adds, unanswered
        self.in_flight = 0
        self.most_in_flight = 0
        self.buckets: dict[tuple[str, str], RateWindow] = {}  # (principal, what)
        self.reads: dict[int, float] = {}  # started reads of a read-bytes rate: when asked
        self.answers: list[float] = []  # when such reads were answered, recent ones
        self.most_reads = 0  # the most such reads in flight at once (asked to answered)
        self.largest_read = 0  # the largest answer's bytes


class GateChecks:
    """T3-T5 over one run: told of each bookie incarnation as its gate is installed
    (:meth:`started`), of each gate's decisions and of each add's answer."""

    def __init__(self, run: SimRun, namespace: str, limits: GatePolicies,
                 ledger_namespace: dict[int, str]) -> None:
        self.run = run
        self.namespace = namespace
        self.limits = limits
        self.ledger_namespace = ledger_namespace
        self.violations: list[Violation] = []
        self.found: dict[str, int] = {}  # violations per invariant (kept or not)
        self.bookies: dict[str, _Incarnation] = {}
        net = run.cluster.network
        net.gatekeeper.watchers.append(self._decided)
        net.add_observers.append(self._answered)
        net.gatekeeper.read_watchers.append(self._read_answered)

    def _violation(self, violation: Violation) -> None:
        n = self.found[violation.invariant] = self.found.get(violation.invariant, 0) + 1
        if n <= MAX_PER_INVARIANT:
            self.violations.append(violation)

    def started(self, sb: SimBookie) -> None:
        """A bookie incarnation runs, with its gate: what it stores now is its start."""
        self.bookies[sb.bookie_id] = _Incarnation(sb, self._stored(sb))

    def _stored(self, sb: SimBookie) -> int:
        """Payload bytes the bookie's storage holds for the namespace (live ledgers)."""
        storage = sb.bookie.store if sb.bookie is not None else None
        if storage is None:
            return 0
        deleted = self.run.observer.deleted
        total = 0
        for lid in storage.ledger_ids():
            if self.ledger_namespace.get(lid) != self.namespace or lid in deleted:
                continue
            for first, last in storage.ranges(lid):
                for entry in range(first, last + 1):
                    size = storage.entry_size(lid, entry)
                    total += 0 if size is None else size - RECORD_HEADER_SIZE
        return total

    # -- as the gates decide ---------------------------------------------------------------

    def _decided(self, bookie: str, client: str, principal: str, request: Request,
                 refusal: Response | None, asked: float) -> None:
        lid = getattr(request, "ledger_id", -1)
        ns = self.ledger_namespace.get(lid)
        if refusal is not None:
            self._refused(bookie, client, principal, request, ns, refusal)
            return
        nbytes, records = add_payload(request)
        inc = self.bookies.get(bookie)
        if ns != self.namespace or inc is None:
            return
        gate = inc.sb.bookie.tenancy if inc.sb.bookie is not None else None
        known = gate.policies(self.namespace) if gate is not None else None  # (it applies)
        if isinstance(request, ReadRequest | ReadBatchRequest):
            if principal != CLUSTER:
                n = len(request.entry_ids) if isinstance(request, ReadBatchRequest) else 1
                self._rate(bookie, inc, known, principal, lid, "read", "records", n, asked)
                rate = self.limits.read_bytes_per_s
                if rate is not None and getattr(known, "read_bytes_per_s", None) == rate:
                    inc.reads[id(request)] = asked
            return
        if not records:
            return
        if principal == CLUSTER:
            inc.cluster += nbytes
            return
        now = self.run.now()
        self._rate(bookie, inc, known, principal, lid, "write", "bytes", nbytes, asked)
        self._rate(bookie, inc, known, principal, lid, "write", "records", records, asked)
        quota = self.limits.max_storage_bytes
        if (quota is not None and not getattr(request, "recovery", False)
                and getattr(known, "max_storage_bytes", None) == quota):
            self._check_quota(bookie, inc, lid, quota, now)
        inc.bound += nbytes
        inc.pending[id(request)] = (request, nbytes)
        inc.in_flight += nbytes
        inc.most_in_flight = max(inc.most_in_flight, inc.in_flight)

    def _rate(self, bookie: str, inc: _Incarnation, known: Any, principal: str, lid: int,
              op: str, kind: str, n: int, asked: float) -> None:
        """T4 for one started request: ``n`` of ``kind`` against the drawn ``op`` rate,
        judged once the bookie's gate applies it (``known``: the policies it applies)."""
        rate = getattr(self.limits, f"{op}_{kind}_per_s")
        if rate is None or getattr(known, f"{op}_{kind}_per_s", None) != rate:
            return
        now = self.run.now()
        bucket = inc.buckets.setdefault((principal, f"{op} {kind}"), RateWindow(rate))
        excess = bucket.admit(asked, now, n)
        if op == "read":
            self.run.cover("tenancy_read_rate_judged")
        if excess > 0:
            self._violation(Violation(
                "T4", lid, -1,
                f"{bookie} started {op}s of {principal!r} in {self.namespace} past the "
                f"rate: {excess:.6f} {kind} over {rate}/s x the window + the burst, at "
                f"t={now:.6f}"))

    def _check_quota(self, bookie: str, inc: _Incarnation, lid: int, quota: int,
                     now: float) -> None:
        if inc.bound < quota:
            return
        stored = self._stored(inc.sb)
        inc.bound = stored - inc.cluster - inc.most_in_flight
        self.run.cover("tenancy_quota_judged")
        if inc.bound >= quota:
            self._violation(Violation(
                "T3", lid, -1,
                f"{bookie} admitted a new entry of {self.namespace} at t={now:.6f} while "
                f"storing {stored} payload bytes of it: over its quota {quota} by more than "
                f"the slack (cluster writes {inc.cluster}, at most {inc.most_in_flight} "
                f"in flight)"))

    def _read_answered(self, bookie: str, principal: str, request: Request,
                       response: Response) -> None:
        """T4 for read bytes, judged as each read of a read-bytes rate is answered."""
        inc = self.bookies.get(bookie)
        asked = None if inc is None else inc.reads.pop(id(request), None)
        if inc is None or asked is None:
            return
        if isinstance(response, ReadResponse):
            nbytes = len(response.body) if response.body is not None else 0
        else:
            nbytes = sum(len(e[2]) for e in getattr(response, "entries", ())
                         if len(e) > 2 and e[2] is not None)
        inc.largest_read = max(inc.largest_read, nbytes)
        now = self.run.now()
        # in flight beside this one since it was asked: those answered meanwhile and those
        # started and unanswered (the last of a set in flight at once counts all the others)
        answers = inc.answers
        if answers and answers[0] < now - 2 * T4_WINDOW:
            answers[:] = [t for t in answers if t >= now - 2 * T4_WINDOW]
        beside = sum(1 for t in answers if t >= asked) + len(inc.reads)
        answers.append(now)
        inc.most_reads = max(inc.most_reads, 1 + beside)
        rate = self.limits.read_bytes_per_s
        assert rate is not None
        bucket = inc.buckets.setdefault((principal, "read bytes"), RateWindow(rate))
        excess = bucket.admit(asked, now, nbytes) - inc.most_reads * inc.largest_read
        self.run.cover("tenancy_read_bytes_judged")
        if excess > 0:
            self._violation(Violation(
                "T4", getattr(request, "ledger_id", -1), -1,
                f"{bookie} answered reads of {principal!r} in {self.namespace} past the rate: "
                f"{excess:.6f} bytes over {rate}/s x the window + the burst + "
                f"{inc.most_reads} reads in flight of at most {inc.largest_read} bytes, at "
                f"t={now:.6f}"))

    def _answered(self, bookie: str, client: str, request: Any, outcome: AddOutcome) -> None:
        inc = self.bookies.get(bookie)
        if inc is None:
            return
        found = inc.pending.pop(id(request), None)
        if found is not None:
            inc.in_flight -= found[1]

    def _refused(self, bookie: str, client: str, principal: str, request: Request,
                 ns: str | None, refusal: Response) -> None:
        quota_add = (isinstance(request, AddRequest | AddBatchRequest)
                     and not request.recovery and ns == self.namespace
                     and self.limits.max_storage_bytes is not None)
        if refusal.status == Status.QUOTA_EXCEEDED and quota_add:
            self.run.cover("tenancy_quota_refused")
            return
        self._violation(Violation(
            "T5", getattr(request, "ledger_id", -1), -1,
            f"{bookie} refused {type(request).__name__} of {client} (principal "
            f"{principal!r}, namespace {ns}) with {refusal.status.name}: "
            f"{refusal.message}"))
