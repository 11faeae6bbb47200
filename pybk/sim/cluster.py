"""A simulated cluster: real Bookies on MemFileSystems, a MemoryMetadataStore, a SimNetwork.

Everything here runs on the :class:`~pybk.sim.loop.SimLoop` and draws randomness from
per-subsystem ``random.Random`` objects derived from one seed (``rng("net")``,
``rng("disk:b1")``...), so adding a random draw in one subsystem does not shift every other
subsystem's sequence.

The cluster is also what the ``sim_cluster`` pytest fixture hands to users: start bookies, get
clients, crash and restart bookies, partition the network, then ``run`` to completion.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from pybk.bookie.state import READ_ONLY, STOPPED, WRITABLE
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.metadata.memory_watches import PolledDelivery
from pybk.sim.follower import CreationLog, FollowerView
from pybk.sim.loop import sleep
from pybk.sim.net import NetConfig, SimNetwork
from pybk.storage.memfs import MemFileSystem

if TYPE_CHECKING:
    from pybk.bookie import Bookie

__all__ = [
    "DATA_DIR",
    "WALL_EPOCH",
    "SimBookie",
    "SimCluster",
    "derive_rng",
]

DATA_DIR = "/bookie"
#: how far behind (loop seconds) the collectors' metadata replica is for new ledgers
FOLLOWER_LAG = 0.5
#: the simulated machines' wall clock at virtual time 0 (as ``SimRun.wall_clock``'s)
WALL_EPOCH = 1_700_000_000.0


def _wall_clock() -> float:
    """The wall clock the metadata store stamps creation times with: the epoch plus the
    running loop's (virtual) time, so a run's metadata is the same on every replay."""
    return WALL_EPOCH + asyncio.get_running_loop().time()


def derive_rng(seed: int, name: str) -> random.Random:
    """A subsystem's generator: a pure function of (seed, name); str seeds hash with SHA-512."""
    return random.Random(f"pybk-sim:{seed}:{name}")


@dataclass
class SimBookie:
    """One bookie identity: its disk outlives its incarnations."""

    bookie_id: str
    fs: MemFileSystem
    bookie: Bookie | None = None
    incarnation: int = 0
    #: "up", "down" (crashed, restartable), "refused" (would not start: e.g. wiped disk)
    status: str = "down"
    damaged: list[str] = field(default_factory=list)  # fault kinds applied to its data
    last_error: str = ""


def _stall_loop(seconds: float) -> None:
    """Block the running simulated loop for ``seconds`` of virtual time (a sync made inline
    on it); on any other loop, nothing (time cannot be made to pass there)."""
    loop = asyncio.get_running_loop()
    stall = getattr(loop, "stall", None)
    if stall is not None:
        stall(seconds)


class SimCluster:
    """Bookies, metadata and network of one simulated run."""

    def __init__(
        self,
        seed: int,
        bookies: int = 3,
        *,
        net: NetConfig | None = None,
        log: Callable[[str], Any] | None = None,
        count: Callable[[str], None] | None = None,
        bookie_config: Any = None,
        client_config: Any = None,
        watch_delivery: PolledDelivery | None = None,
    ) -> None:
        if bookies < 1:
            raise ValueError(f"bookies must be >= 1, not {bookies}")
        self.seed = seed
        self._log = log or (lambda line: None)
        self._count = count or (lambda kind: None)
        self.store = MemoryMetadataStore(before_op=self._before_op, after_op=self._after_op,
                                         clock=_wall_clock, watch_delivery=watch_delivery)
        self.admin = self.store.session()
        self.admin.before_op = None  # the simulator's own bookkeeping is never faulted
        #: called as ``listener(op, key)`` after each metadata operation was applied (the
        #: runner learns of every ledger deletion, whoever made it)
        self.on_meta_applied: list[Callable[[str, object], Awaitable[None] | None]] = []
        #: the collectors read the metadata as a replica this far behind for new ledgers
        #: (pybk.sim.follower): half the simulated bookies' gc_min_ledger_age, so the
        #: collector's age guard is what keeps a ledger its listing does not show yet
        self.gc_metadata_lag = FOLLOWER_LAG
        self.creations = CreationLog(lambda: asyncio.get_running_loop().time())
        self.on_meta_applied.append(self.creations.applied)
        self.network = SimNetwork(self.rng("net"), net, trace=self._log, count=self._count)
        self.bookie_config = bookie_config
        self.client_config = client_config
        self.bookies: dict[str, SimBookie] = {}
        for i in range(bookies):
            bid = f"b{i}"
            self.bookies[bid] = SimBookie(bid, self._new_fs())
        #: Metadata fault state, driven by the fault injector.
        self.meta_stall_until = 0.0
        self.meta_cas_rate = 0.0
        self._meta_rng = self.rng("meta")
        self.clients: dict[str, Any] = {}
        self.on_bookie_started: list[Callable[[SimBookie], Any]] = []
        #: bookie id -> the network location it registers with (rack-aware placement)
        self.racks: dict[str, str] = {}
        #: bookie id -> the isolation group it registers with
        self.groups: dict[str, str] = {}
        #: the placement policy of the clients made from here on (None: the default)
        self.placement: Any = None
        #: called as ``listener(bookie_id, ledger_id)`` when a bookie's garbage collector is
        #: about to delete a ledger
        self.on_gc_collect: list[Callable[[str, int], None]] = []

    def rng(self, name: str) -> random.Random:
        return derive_rng(self.seed, name)

    @staticmethod
    def _new_fs() -> MemFileSystem:
        """A bookie's disk: a sync made inline blocks the loop for the sync's delay (the
        journal's inline-sync mode, as ``pybk bookie`` runs it, on virtual time)."""
        fs = MemFileSystem()
        fs.stall = _stall_loop
        fs.wait = sleep
        return fs

    @property
    def bookie_ids(self) -> list[str]:
        return list(self.bookies)

    def up_bookies(self) -> list[str]:
        return [b for b, sb in self.bookies.items() if sb.status == "up"]

    # -- metadata faults ---------------------------------------------------------------------

    async def _before_op(self, op: str, key: object) -> None:
        if self.meta_stall_until <= 0.0 and not self.meta_cas_rate:
            return  # (no metadata fault armed: the common case, one call per store operation)
        from pybk.errors import MetadataVersionError

        loop = asyncio.get_running_loop()
        wait = self.meta_stall_until - loop.time()
        if wait > 0:
            self._count("meta_stalled_op")
            await asyncio.sleep(wait)
        if op == "write_ledger" and self.meta_cas_rate and (
            self._meta_rng.random() < self.meta_cas_rate
        ):
            self._count("meta_cas_conflict")
            raise MetadataVersionError(f"simulated CAS conflict on ledger {key}")

    async def _after_op(self, op: str, key: object) -> None:
        for listener in self.on_meta_applied:
            done = listener(op, key)
            if done is not None:
                await done

    # -- bookies -----------------------------------------------------------------------------

    async def start_bookie(self, bookie_id: str) -> bool:
        """Start a new incarnation on the bookie's disk; False (and logged) if it refuses."""
        from pybk.bookie import Bookie

        sb = self.bookies[bookie_id]
        if sb.status == "up":
            return True
        sb.incarnation += 1
        cookie_store = self.store.session()
        cookie_store.before_op = None
        kwargs: dict[str, Any] = {"fs": sb.fs, "cookie_store": cookie_store,
                                  "rng": self.rng(f"bookie:{bookie_id}:{sb.incarnation}")}
        if self.bookie_config is not None:
            kwargs["config"] = self.bookie_config
        bookie = Bookie(bookie_id, DATA_DIR, **kwargs)
        try:
            await bookie.start()
        except Exception as exc:
            sb.status = "refused"
            sb.last_error = f"{type(exc).__name__}: {exc}"
            self._log(f"{bookie_id} refused to start: {sb.last_error}")
            self._count("bookie_refused_start")
            return False
        sb.bookie = bookie
        sb.status = "up"
        if bookie.gc is not None:  # the collector asks the metadata as clients do (faults too)
            from pybk.bookie.gc import metadata_liveness

            view = FollowerView(self.store.session(), self.creations, self.gc_metadata_lag)
            bookie.gc.is_live = metadata_liveness(view)
            bookie.gc.list_ledgers = view.list_ledgers
            bookie.gc.on_collect = lambda lid, b=bookie_id: self._gc_collected(b, lid)
        if bookie.scrubber is not None:  # (the production scrubber: seen, then as it is)
            bookie.scrubber.on_damage = partial(self._scrub_damage, bookie_id,
                                                bookie.scrubber.on_damage)
        for hook in self.on_bookie_started:
            await hook(sb)
        bookie.on_state_change = lambda state, b=bookie_id: self._state_changed(b, state)
        self.network.set_bookie(bookie_id, bookie.handle, bookie.add_request, bookie.tenancy)
        read_only = getattr(bookie, "state", WRITABLE) == READ_ONLY
        await self.admin.register_bookie(self.registration(bookie_id, read_only))
        self._log(f"{bookie_id} started (incarnation {sb.incarnation}, state {bookie.state})")
        return True

    def registration(self, bookie_id: str, read_only: bool) -> BookieRegistration:
        """What a bookie registers: in-process (no address), with its rack if it has one."""
        return BookieRegistration(bookie_id, "", read_only, self.racks.get(bookie_id, ""),
                                  self.groups.get(bookie_id, ""))

    def _scrub_damage(self, bookie_id: str, then: Any, ledger_id: int, entry_id: int,
                      what: str) -> None:
        self._log(f"{bookie_id} scrubber: L{ledger_id}:{entry_id} damaged ({what})")
        self._count("scrubber_found_damage")
        if then is not None:
            then(ledger_id, entry_id, what)

    def _gc_collected(self, bookie_id: str, ledger_id: int) -> None:
        for listener in self.on_gc_collect:
            listener(bookie_id, ledger_id)

    def _state_changed(self, bookie_id: str, state: str) -> None:
        self._log(f"{bookie_id} state -> {state}")
        self._count(f"bookie_state_{state}")
        sb = self.bookies[bookie_id]
        if sb.status != "up":
            return
        if state == STOPPED:
            task = self.admin.unregister_bookie(bookie_id)
        else:
            task = self.admin.register_bookie(self.registration(bookie_id, state == READ_ONLY))
        asyncio.get_running_loop().create_task(task)

    async def stop_bookie(self, bookie_id: str) -> None:
        """:class:`pybk.clusters.AsyncCluster`'s crash-stop: :meth:`crash_bookie` losing
        what was not synced."""
        await self.crash_bookie(bookie_id, "drop")

    async def crash_bookie(self, bookie_id: str, mode: str = "drop") -> None:
        """Kill -9 plus power cut: the process dies and unsynced data goes per ``mode``."""
        await self.crash_now(bookie_id, mode)

    def crash_now(self, bookie_id: str, mode: str = "drop") -> asyncio.Task[None]:
        """:meth:`crash_bookie` from a callback (a crash timed inside a write-to-sync window):
        the process dies now; its registration goes in the returned task."""
        self.kill_bookie(bookie_id, mode)
        return asyncio.get_running_loop().create_task(self.lapse_registration(bookie_id))

    def kill_bookie(self, bookie_id: str, mode: str = "drop") -> None:
        """The process dies now (as :meth:`crash_now`) but its registration stays until its
        session lapses: the caller's :meth:`lapse_registration`, some time later."""
        sb = self.bookies[bookie_id]
        if sb.bookie is not None:
            sb.bookie.on_state_change = None
            if sb.bookie.tenancy is not None:  # (its gate's watches die with the process)
                sb.bookie.tenancy.stop()
            sb.bookie.crash()
            sb.bookie = None
        sb.fs.crash(mode, self.rng(f"crash:{bookie_id}:{sb.incarnation}"))
        if sb.status == "up":
            sb.status = "down"
        self.network.set_bookie(bookie_id, None)
        self._log(f"{bookie_id} crashed ({mode})")

    async def lapse_registration(self, bookie_id: str) -> None:
        """A stopped bookie's registration goes (its session lapsed), unless it runs again."""
        if self.bookies[bookie_id].status == "up":
            return  # (restarted meanwhile: its registration is its new incarnation's)
        try:
            await self.admin.unregister_bookie(bookie_id)
        except Exception:  # not registered (e.g. it never started): nothing to undo
            pass

    async def restart_bookie(self, bookie_id: str, *, wipe: bool = False) -> bool:
        sb = self.bookies[bookie_id]
        if sb.status == "up":
            await self.crash_bookie(bookie_id)
        if wipe:
            sb.fs = self._new_fs()
            sb.damaged.append("wipe")
            self._log(f"{bookie_id} disk wiped (same identity)")
        if sb.status == "refused" and not wipe:
            sb.status = "down"
        return await self.start_bookie(bookie_id)

    async def start(self) -> SimCluster:
        for bid in self.bookie_ids:
            await self.start_bookie(bid)
        return self

    # -- clients -----------------------------------------------------------------------------

    def client(self, name: str | None = None, config: Any = None) -> Any:
        """A pybk Client on this cluster, talking through the simulated network as ``name``
        (default: ``client-N``, the next unused N)."""
        if name is None:
            name = f"client-{len(self.clients) + 1}"
            while name in self.clients:
                name += "'"
        from pybk.client import Client

        kwargs: dict[str, Any] = {"transport": self.network.endpoint(name),
                                  "rng": self.rng(f"client:{name}")}
        cfg = config if config is not None else self.client_config
        if cfg is not None:
            kwargs["config"] = cfg
        if self.placement is not None:
            kwargs["placement"] = self.placement
        client = Client(self.store.session(), **kwargs)
        self.clients[name] = client
        return client

    async def close(self) -> None:
        for name in list(self.clients):
            try:
                await self.clients[name].close()
            except Exception:
                pass
        for sb in self.bookies.values():
            if sb.bookie is not None:
                sb.bookie.crash()
                sb.bookie = None
