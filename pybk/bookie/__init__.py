"""The bookie: request handling over the storage engine, and the process that serves it.

* ``bookie``    :class:`Bookie`: add / read / fence / LAC / long poll over a LedgerStore (its
                reads and long polls in ``reads``, its upkeep on request in ``maintenance``)
* ``config``    :class:`BookieConfig`: the storage knobs plus the bookie's own
* ``state``     writable / read-only / stopped
* ``cookie``    identity of a data directory (rule R4)
* ``longpoll``  readers parked until a ledger's LAC moves
* ``inspect``   ``pybk bookie inspect``: verify a stopped bookie's data directory
* ``process``   ``pybk bookie``: a Bookie behind a TCP server, registered in the metadata store
"""

from pybk.bookie.bookie import Bookie
from pybk.bookie.config import BookieConfig
from pybk.bookie.cookie import COOKIE_FILE, decode_cookie, encode_cookie
from pybk.bookie.state import READ_ONLY, STOPPED, WRITABLE, BookieState

__all__ = [
    "COOKIE_FILE",
    "READ_ONLY",
    "STOPPED",
    "WRITABLE",
    "Bookie",
    "BookieConfig",
    "BookieState",
    "decode_cookie",
    "encode_cookie",
]
