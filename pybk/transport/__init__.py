"""How a request reaches a bookie: in process, over TCP (+TLS, token auth), and the codec.

:mod:`.base` is the seam the client uses; :mod:`.local` calls bookie objects in this
process, :mod:`.tcp` and :mod:`.server` are the two ends of the wire, :mod:`.codec` the
sans-IO frame encoder/decoder both ends share. The simulator's network (``pybk.sim.net``)
implements the same seam.
"""

__all__: list[str] = []
