"""What every client-side operation needs: the store, the transport, the config, the rng.

Kept in one small object so writers, readers and recovery take one argument, and so the
simulator can build a client from its own pieces (virtual-time loop, simulated network).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pybk.client.placement import DefaultPlacementPolicy, PlacementPolicy
from pybk.metadata.base import MetadataStore
from pybk.metadata.tenancy import NamespacePolicies
from pybk.stats import ClientStats
from pybk.transport.base import Transport
from pybk.transport.wireformat import DEFAULT_MAX_FRAME, MAX_BATCH_ENTRIES

__all__ = ["DEFAULT_MAX_ENTRY_SIZE", "ClientConfig", "ClientContext"]

#: ``ClientConfig.max_entry_size`` by default: a default-sized TCP frame (5 MiB) less room
#: for the request's framing (ids, master key, entry header and digest: under 200 bytes)
DEFAULT_MAX_ENTRY_SIZE = DEFAULT_MAX_FRAME - 1024


@dataclass
class ClientConfig:
    """Client tunables (BookKeeper's ``ClientConfiguration``, with its defaults in spirit).

    Times are seconds of the running loop's clock (virtual under the simulator).
    """

    #: How long a bookie may take to answer an add before it is replaced (ensemble change).
    add_timeout: float = 10.0
    #: How long a bookie may take to answer a read before the next replica is asked.
    read_timeout: float = 10.0
    #: Ask the next replica of the write set when the current one has not answered after
    #: this long (0 disables speculative reads).
    speculative_read_delay: float = 2.0
    #: Send the writer's LAC explicitly (WriteLac) when idle, every this many seconds
    #: (0 = off). Lets tailing readers see the last entry without waiting for the next add:
    #: the piggybacked LAC lags one entry and stops when writes stop, so without it a quiet
    #: writer's last acknowledged entries stay invisible to readers until recovery. On by
    #: default, so such entries become visible within about two intervals. As in
    #: BookKeeper, not sent while adds keep carrying the LAC on (a tick after an interval
    #: whose adds brought the bookies a newer LAC sends nothing).
    explicit_lac_interval: float = 0.2
    #: Tell the bookies the writer's LAC (WriteLac) as soon as it moves with nothing after it
    #: in the pipeline to carry it, so tailing readers see an acknowledged entry within a
    #: round trip at any write rate, the last one included (coalesced: a burst of
    #: confirmations costs one message, a writer whose adds keep carrying the LAC sends
    #: none). False: only the periodic ``explicit_lac_interval`` (fewer messages from a
    #: writer adding now and then; its entries become visible with the next add or tick).
    immediate_lac: bool = True
    #: Seconds the immediate LAC waits for an add to carry it before it is sent on its own
    #: (0: three loop passes, time enough for a caller on the loop who appends again at once).
    #: ``pybk.WAL``, whose caller comes back from another thread, waits half a millisecond.
    immediate_lac_delay: float = 0.0
    #: Entries read ahead during recovery (BookKeeper ``recoveryReadBatchSize``).
    recovery_read_batch_size: int = 1
    #: Entries read concurrently by ``read(first, last)``.
    read_batch_size: int = 256
    #: Seconds one long poll waits on the bookies inside ``tail()``.
    long_poll_timeout: float = 1.0
    #: How a long poll (``read_last_add_confirmed_and_entry``, ``tail()``) asks the last
    #: ensemble: False (BookKeeper's default, its ``parallel=false``) asks one bookie and the
    #: next only when that one fails, answers early without the entry, or is silent past
    #: the poll's timeout plus ``speculative_read_delay``: one request per poll while the
    #: writer writes. True asks every bookie of the ensemble at once (the first answer with
    #: the entry wins): the entry as soon as any bookie learns it is confirmed, for
    #: ensemble-size times the requests.
    long_poll_parallel: bool = False
    #: TCP connections per bookie (BookKeeper's ``numChannelsPerBookie``); a ledger's requests
    #: to one bookie always use the same connection. Only used by the TCP transport.
    connections_per_bookie: int = 1
    #: The largest entry (payload bytes) ``append`` accepts; a bigger one is refused with
    #: :class:`pybk.EntryTooLargeError` before an entry id is taken. One limit in process and
    #: over TCP: the default leaves room for the framing in one default-sized frame (5 MiB).
    max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE
    #: A writer sends the entries it pushed in one loop iteration to each bookie as one
    #: request of at most this many entries / body bytes (larger runs are split).
    add_batch_max_entries: int = 4096
    add_batch_max_bytes: int = 1 << 20
    #: names of deliberately broken behaviours (mutation switches) for checker tests, made
    #: by the outermost layer (``pybk.testing.Mutations``); empty in production
    mutations: frozenset[str] = frozenset()
    #: Read a ledger from one bookie while it answers (BookKeeper's ``stickyReadsEnabled``),
    #: when its ensemble size equals its write quorum; the next bookie after an error
    #: (pybk.client.sticky).
    sticky_reads: bool = False
    #: chooses the bookies of new ensembles, ensemble changes and re-replication, and the
    #: order reads try replicas in (pybk.client.placement)
    placement: PlacementPolicy = field(default_factory=DefaultPlacementPolicy)
    #: how long a bookie's free-disk report is reused by disk-weighted placement (seconds)
    disk_usage_cache_ttl: float = 30.0
    #: store the keys auto-recovery needs (one-way hashes of the password) in each new
    #: ledger's metadata, so it can re-replicate the ledger without knowing its password;
    #: off: only ledgers whose password the auto-recovery process is given get copied
    recovery_keys_in_metadata: bool = True

    def __post_init__(self) -> None:
        for name in ("add_timeout", "read_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("speculative_read_delay", "explicit_lac_interval", "immediate_lac_delay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("recovery_read_batch_size", "read_batch_size", "connections_per_bookie"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.long_poll_timeout <= 0:
            raise ValueError(f"long_poll_timeout must be > 0, got {self.long_poll_timeout!r}")
        if not isinstance(self.immediate_lac, bool):
            raise TypeError(f"immediate_lac must be a bool, not {self.immediate_lac!r}")
        if not isinstance(self.sticky_reads, bool):
            raise TypeError(f"sticky_reads must be a bool, not {self.sticky_reads!r}")
        if not isinstance(self.long_poll_parallel, bool):
            raise TypeError(f"long_poll_parallel must be a bool, not {self.long_poll_parallel!r}")
        for name in ("max_entry_size", "add_batch_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        n = self.add_batch_max_entries
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BATCH_ENTRIES:
            raise ValueError(f"add_batch_max_entries must be an int in 1..{MAX_BATCH_ENTRIES}, "
                             f"got {n!r}")
        if not (isinstance(self.mutations, frozenset)
                and all(isinstance(m, str) for m in self.mutations)):
            raise TypeError(f"mutations must be a frozenset of switch names, not "
                            f"{self.mutations!r}")
        if not isinstance(self.placement, PlacementPolicy):
            raise TypeError(f"placement must be a PlacementPolicy, not {self.placement!r}")
        if self.disk_usage_cache_ttl < 0:
            raise ValueError(
                f"disk_usage_cache_ttl must be >= 0, got {self.disk_usage_cache_ttl!r}")


@dataclass
class ClientContext:
    store: MetadataStore
    transport: Transport
    config: ClientConfig = field(default_factory=ClientConfig)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    #: bookie id -> rack, as last seen in the registry (placement, local-rack reads)
    topology: dict[str, str] = field(default_factory=dict)
    #: bookie id -> (free bytes, loop time the report expires): disk-weighted placement
    disk_usage: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: what the client records for metrics (None: nothing is timed or counted)
    stats: ClientStats | None = None
    #: who picks new ensembles and replacements (pybk.client.placement): the
    #: client's own (``Client(placement=...)``) or, by default, ``config.placement``
    placement: PlacementPolicy | None = None
    #: namespace -> (its policies, loop time they expire): pybk.client.isolation's cache
    namespace_policies: dict[str, tuple[NamespacePolicies, float]] = field(
        default_factory=dict)

    def __post_init__(self) -> None:
        if self.placement is None:
            self.placement = self.config.placement

    @property
    def policy(self) -> PlacementPolicy:
        """The placement policy in force (typed: never None once made)."""
        assert self.placement is not None
        return self.placement
