"""The ``pybk bookie`` server process: a bookie behind the TCP server (:mod:`.process`), its
HTTP admin and health endpoints (:mod:`.http`), Prometheus collectors (:mod:`.metrics`), and
optionally an auto-recovery daemon beside it."""
