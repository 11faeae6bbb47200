"""Knobs of auto-recovery, and the counters it keeps for operators.

Times are seconds of the running loop's clock (virtual under the simulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

__all__ = ["LEDGER_CHECKS", "AutoRecoveryConfig", "AutoRecoveryStats"]

#: how deep the auditor's periodic ledger check looks at each replica of each fragment:
#: ``edges`` reads the first and last entry the bookie should hold (BookKeeper's
#: LedgerChecker); ``entries`` asks the bookie which entries it holds and compares (the
#: replicas check); ``scrub`` reads every entry and checks its digest.
LEDGER_CHECKS: Final = ("edges", "entries", "scrub")


@dataclass
class AutoRecoveryConfig:
    """Auto-recovery tunables (BookKeeper's names in parentheses)."""

    #: a bookie must stay out of the registry this long before its ledgers are marked, so a
    #: rolling restart copies nothing (``lostBookieRecoveryDelay``); a value set
    #: cluster-wide (``pybk autorecovery``, the admin API) overrides it
    lost_bookie_recovery_delay: float = 0.0
    #: the auditor's bookie check runs on every registry change and at least this often
    #: (``auditorPeriodicBookieCheckInterval``)
    bookie_check_interval: float = 3600.0
    #: the auditor's check of every ledger's replicas (``auditorPeriodicCheckInterval``);
    #: 0 = only when an audit is triggered
    ledger_check_interval: float = 7 * 86400.0
    #: how deep that check looks (see :data:`LEDGER_CHECKS`)
    ledger_check: str = "edges"
    #: a ledger whose open last fragment names a lost bookie is left to its writer this
    #: long, then recovered (fenced) and copied (``openLedgerRereplicationGracePeriod``)
    open_ledger_grace: float = 30.0
    #: a worker looks for marks at least this often (it also wakes when the auditor marks)
    worker_poll_interval: float = 10.0
    #: first pause before a failed repair is retried; doubles up to the maximum
    #: (``rwRereplicateBackoffMs``)
    retry_backoff: float = 5.0
    max_retry_backoff: float = 300.0
    #: entries copied concurrently by one repair
    copy_window: int = 64
    #: ledgers repaired concurrently by one worker process
    concurrent_repairs: int = 2
    #: passwords tried for ledgers whose metadata carries no recovery keys
    passwords: tuple[bytes, ...] = (b"",)
    #: election name (one auditor per election; every process of a cluster uses the same)
    election: str = "auditor"

    def __post_init__(self) -> None:
        for name in ("lost_bookie_recovery_delay", "ledger_check_interval"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        for name in ("bookie_check_interval", "open_ledger_grace", "worker_poll_interval",
                     "retry_backoff", "max_retry_backoff"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.ledger_check not in LEDGER_CHECKS:
            raise ValueError(f"ledger_check must be one of {', '.join(LEDGER_CHECKS)}, "
                             f"not {self.ledger_check!r}")
        for name in ("copy_window", "concurrent_repairs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not all(isinstance(p, bytes) for p in self.passwords):
            raise TypeError("passwords must be bytes")


@dataclass
class AutoRecoveryStats:
    """What auto-recovery did, for operators (exported by :mod:`pybk.ops.metrics`)."""

    #: under-replicated ledgers as last counted by this process
    under_replicated: int = 0
    leading: bool = False
    audits: int = 0
    bookie_checks: int = 0
    ledger_checks: int = 0
    #: ledger checks that ran to the end (a failed one is retried)
    ledger_checks_completed: int = 0
    #: the last audit request (``AutoRecoverySettings.request_audit``'s number) this auditor
    #: served: both checks ran to the end after it was made
    audit_request_served: int = 0
    ledgers_marked: int = 0
    #: ledgers found by the ledger check with an entry no replica holds readable
    ledgers_lost_entries: int = 0
    ledgers_repaired: int = 0
    repairs_failed: int = 0
    repairs_deferred: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    slots_replaced: int = 0
    last_error: str = ""
    #: seconds spent by the last bookie check and the last ledger check
    durations: dict[str, float] = field(default_factory=dict)
