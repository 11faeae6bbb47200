"""The ``pybk`` command (also ``python -m pybk``), one module per command group.

``common`` holds what the commands share (connection options, exit conventions), ``stdin``
lines of stdin as they arrive, ``log_show`` what `pybk log show` prints, ``processes``
starting and stopping bookie processes; ``bench``, ``bookie``, ``cluster``, ``ledger``,
``log``, ``autorecovery`` and ``simulate`` are the command groups (``admin`` adds the operator
commands to ``bookie`` and ``ledger``). This is the outermost layer: it reads the environment,
signals and files.
"""

from __future__ import annotations

import click

import pybk
from pybk.cli.admin import (
    bookie_decommission,
    bookie_info,
    bookie_recover,
    ledger_under_replicated,
)
from pybk.cli.autorecovery import autorecovery
from pybk.cli.bench import bench
from pybk.cli.bookie import bookie
from pybk.cli.cluster import cluster
from pybk.cli.ledger import ledger
from pybk.cli.log import log
from pybk.cli.log_consume import log_consume  # noqa: F401 - registers `pybk log consume`
from pybk.cli.log_mirror import log_mirror  # noqa: F401 - registers `pybk log mirror`
from pybk.cli.log_offload_service import (  # noqa: F401 - registers `pybk log offload-service`
    log_offload_service,
)
from pybk.cli.log_tier import log_cursors  # noqa: F401 - registers the data-life commands
from pybk.cli.simulate import simulate
from pybk.cli.table import table
from pybk.cli.tenancy import namespace, tenant
from pybk.server.processes import spawn_bookie, stop_pid, wait_ready

__all__ = ["main", "spawn_bookie", "stop_pid", "wait_ready"]


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Example:
  M=$(pybk cluster up --root /tmp/bk --bookies 3)
  L=$(pybk ledger append --metadata $M hello world)
  pybk ledger read --metadata $M $L
  pybk cluster down --root /tmp/bk""",
)
@click.version_option(pybk.__version__, package_name="pybk")
def main() -> None:
    """pybk: Apache BookKeeper's replicated log, in Python.

    Data goes to stdout, progress and errors to stderr. Exit status: 0 done, 1 the
    operation failed (one line naming the cause), 2 bad usage.
    """



main.add_command(bench)
main.add_command(bookie)
bookie.add_command(bookie_info)
bookie.add_command(bookie_decommission)
bookie.add_command(bookie_recover)
ledger.add_command(ledger_under_replicated)
main.add_command(autorecovery)
main.add_command(cluster)
main.add_command(ledger)
main.add_command(table)
main.add_command(tenant)
main.add_command(namespace)
main.add_command(log)
main.add_command(simulate)
