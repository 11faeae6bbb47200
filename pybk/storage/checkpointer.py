"""Checkpoint scheduling: when an index checkpoint is a base or a delta, and the chain's state.

A checkpoint is the index at the journal position it names (file format:
:mod:`pybk.storage.checkpoint`). After a *base* (``index.ckpt``, the whole index) come *deltas*
(what changed since the file before), until the deltas add up to ``checkpoint_delta_ratio`` of
the base or number ``checkpoint_max_deltas``; then a new base, of a higher generation, and
the older generation's deltas are deleted. :class:`Checkpointer` keeps that chain's state (its
generation, the deltas written on it, their sizes, the ledger metadata last written) and
writes the next file; the store owns *when* (its lock: one checkpoint at a time, and
compaction holds it across its two checkpoints).

A checkpoint whose file was not written (ENOSPC, EIO) makes the next one a base: its snapshot
had already counted the changes as checkpointed.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from typing import Final

from pybk.storage.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointEncoder,
    delta_checkpoint_name,
    delta_checkpoints,
    ledger_metas,
    load_checkpoint_chain,
    stale_checkpoint_files,
)
from pybk.storage.config import StoreConfig
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, Position

__all__ = ["DELTA_SKIPS_LEDGER_STATE", "Checkpointer"]

log = logging.getLogger(__name__)

#: mutation switch (a name in ``StoreConfig.mutations``; registry: ``pybk.testing.mutations``):
#: a delta index checkpoint leaves out the ledgers whose state changed without new entries
#: (a fence, an explicit LAC): the chain then forgets them once the journal moves past
DELTA_SKIPS_LEDGER_STATE: Final = "delta_skips_ledger_state"


class Checkpointer:
    """The checkpoint chain of one data directory (see the module docstring)."""

    def __init__(self, fs: FileSystem, data_dir: str) -> None:
        self.fs = fs
        self.data_dir = data_dir
        self.path = posixpath.join(data_dir, CHECKPOINT_FILE)
        #: one checkpoint at a time (compaction holds it across its two)
        self.lock = asyncio.Lock()
        #: the journal position the last durable checkpoint covers
        self.pos: Position | None = None
        #: the base checkpoint new deltas extend: its generation, the deltas written on it,
        #: its size and theirs, the ledger metas last written
        self._gen = 0
        self._seq = 0
        self._base_bytes = 0
        self._delta_bytes = 0
        self._metas: dict[int, bytes] = {}
        #: the next checkpoint must be a base (none yet, or the last one was not written)
        self._base_next = True
        #: the highest generation of any checkpoint file seen (a new base goes above it)
        self._gen_seen = 0
        self.stats = {"bases": 0, "deltas": 0, "base_bytes": 0, "delta_bytes": 0}

    def scan(self) -> bool:
        """Note the generations of the files present; True when a base checkpoint exists."""
        self._gen_seen = max([gen for gen, _seq in delta_checkpoints(self.fs, self.data_dir)],
                             default=0)
        return self.fs.exists(self.path)

    def load(self) -> tuple[Index, Position, list[int], int]:
        """The index, position and dead segments of the base checkpoint and its chain of
        deltas, and how many deltas were applied (``load_checkpoint_chain``: damage raises,
        the caller rebuilds). Once loaded, the next checkpoint extends this chain (a delta of
        what replay adds)."""
        chain = load_checkpoint_chain(self.fs, self.data_dir)
        gen = chain.base.generation
        self._gen_seen = max(self._gen_seen, gen)
        self._gen, self._seq = gen, chain.last.seq
        self._base_bytes, self._delta_bytes = chain.base_bytes, chain.delta_bytes
        self._metas = ledger_metas(chain.index)
        self._base_next = False
        self._drop_old_deltas(gen)  # older bases' and half-written ones
        return chain.index, chain.last.position, chain.last.dead, chain.deltas

    async def write(self, index: Index, pos: Position, dead: list[int],
                    cfg: StoreConfig) -> Position:
        """Write the checkpoint of ``index`` at journal position ``pos`` (a base or a delta,
        as ``cfg`` says). The caller holds :attr:`lock` and took ``pos`` in the same
        synchronous step as the index state it describes."""
        base = (self._base_next or self._seq >= cfg.checkpoint_max_deltas
                or self._delta_bytes > cfg.checkpoint_delta_ratio * self._base_bytes)
        gen = self._gen_seen + 1 if base else self._gen
        seq = 0 if base else self._seq + 1
        # the snapshot is taken here, synchronously: the file is the index at ``pos``; from
        # here on the index counts as checkpointed, so if the file is not written the next
        # checkpoint must be a base
        encoder = CheckpointEncoder(index, pos, generation=gen, seq=seq, dead=dead,
                                    written=None if base else self._metas,
                                    skip_state_only=DELTA_SKIPS_LEDGER_STATE in cfg.mutations)
        self._base_next = True
        for _ in encoder.steps():
            await asyncio.sleep(0)  # a big index is encoded in steps: keep serving between
        data = encoder.result()
        if base:
            self._gen_seen = gen
            await self.fs.write_file_atomic(self.path, data)
            self._gen, self._seq = gen, 0
            self._base_bytes, self._delta_bytes = len(data), 0
            self._drop_old_deltas(gen)
        else:
            await self.fs.write_file_atomic(
                posixpath.join(self.data_dir, delta_checkpoint_name(gen, seq)), data)
            self._seq = seq
            self._delta_bytes += len(data)
        kind = "base" if base else "delta"
        self.stats[kind + "s"] += 1
        self.stats[kind + "_bytes"] += len(data)
        self._metas = encoder.metas
        self._base_next = False
        self.pos = pos
        return pos

    def _drop_old_deltas(self, generation: int) -> None:
        """Delete the delta files of older bases and half-written ones. Best effort: a
        leftover delta names an older generation, so it is never applied, and the next base
        tries again."""
        for name in stale_checkpoint_files(self.fs, self.data_dir, generation):
            try:
                self.fs.delete(posixpath.join(self.data_dir, name))
            except OSError as exc:
                log.warning("could not delete old index checkpoint %s: %s", name, exc)
