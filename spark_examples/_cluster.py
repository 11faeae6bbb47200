"""What every Spark example shares: bookies to write to (``--metadata URI`` of a running
cluster, or three ``pybk bookie`` processes started here with ``pybk cluster up`` and stopped
with ``pybk cluster down``) and a local SparkSession with the ``pybk`` data source."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def arguments(doc: str | None, **extra: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--metadata", help="metadata URI of running bookies (sqlite:///... or "
                                           "zk://...); default: start 3 here")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    for name, (kind, default, text) in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                            help=text)
    return parser.parse_args()


def _pybk(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"pybk {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout.strip()


@contextmanager
def bookies(metadata: str | None) -> Iterator[str]:
    """The metadata URI to use: the given one, or that of 3 bookie processes started here."""
    if metadata:
        yield metadata
        return
    root = tempfile.mkdtemp(prefix="pybk-spark-example-")
    uri = _pybk("cluster", "up", "--root", root, "--bookies", "3").splitlines()[-1]
    print(f"started 3 bookies with `pybk cluster up --root {root}` (metadata {uri})")
    try:
        yield uri
    finally:
        _pybk("cluster", "down", "--root", root)
        shutil.rmtree(root, ignore_errors=True)
        print("stopped them with `pybk cluster down`")


def session(master: str, name: str) -> Any:
    import pybk.spark

    return pybk.spark.local_session(master, name)


def check(condition: bool, what: str) -> None:
    """Print what was verified, or stop with what was not."""
    if not condition:
        raise SystemExit(f"NOT VERIFIED: {what}")
    print(f"verified: {what}")
