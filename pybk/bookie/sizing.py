"""What a read's answer will cost, from the index alone (no disk access): the TCP server
admits reads against its byte budgets with it (``Bookie.response_size_hint``)."""

from __future__ import annotations

from typing import Final

from pybk.storage.engine import LedgerStorage
from pybk.storage.reads import READ_MAX_ABSENT
from pybk.wire import ReadBatchRequest, ReadLacRequest, ReadRequest, Request

__all__ = ["READ_BATCH_MAX_BYTES", "READ_ENTRY_COST", "answer_size"]

#: a batched read's answer stops once its entries add up to this many bytes (it must fit one
#: frame: 5 MiB by default, answers get 64 KiB of slack; at least one entry is answered)
READ_BATCH_MAX_BYTES: Final = 4 << 20
#: bytes a batched read's answer costs per entry besides its body (its tuple, status and id,
#: on the wire and in memory): an answer of absent ids is charged to the budgets too
READ_ENTRY_COST: Final = 64


def answer_size(store: LedgerStorage, request: Request) -> int | None:
    """Bytes of entry data the answer to ``request`` will carry: 0 for an entry the store
    lacks, None for a request it does not size. A batched read's answer stops at
    READ_BATCH_MAX_BYTES or READ_MAX_ABSENT ids not held; every id answered costs
    READ_ENTRY_COST besides its bytes (an absent one too)."""
    if isinstance(request, ReadBatchRequest):
        lid = request.ledger_id
        if store.find(lid) is None:
            return 0
        total = absent = 0
        size_of = store.entry_size
        for eid in request.entry_ids:
            size = size_of(lid, eid)
            if size is None:
                total += READ_ENTRY_COST
                absent += 1
                if absent >= READ_MAX_ABSENT:
                    break
            else:
                total += READ_ENTRY_COST + size
            if total >= READ_BATCH_MAX_BYTES:
                return READ_BATCH_MAX_BYTES
        return total
    if isinstance(request, ReadRequest):
        entry_id = request.entry_id
    elif isinstance(request, ReadLacRequest):
        entry_id = -1
    else:
        return None
    st = store.find(request.ledger_id)
    if st is None:
        return 0
    if entry_id == -1:
        entry_id = st.last_entry
    held = store.entry_size(request.ledger_id, entry_id)
    size = 0 if held is None else held
    if isinstance(request, ReadLacRequest) and st.explicit_lac_body:
        size += len(st.explicit_lac_body)
    return size
