"""How a request reaches a bookie: in process, over TCP (+TLS, token auth), and the codec.

:mod:`.base` is the seam the client uses (``Transport.add``, the typed add path every
transport offers, and ``send``); :mod:`.deadlines` the one timeout mechanism they share;
:mod:`.local` calls bookie objects in this process, :mod:`.tcp` and :mod:`.server` are the two
ends of the wire, :mod:`.messages` (how each message is laid out, on :mod:`.wireformat`'s
header, flags and caps, the write path's in :mod:`.fastpath`) and :mod:`.codec` (the
connection's framing state machine) the sans-IO encoder/decoder both ends share. The
simulator's network (``pybk.sim.net``) implements the same seam.
"""

__all__: list[str] = []
