"""``python -m pybk``: the same command as ``pybk`` (see :mod:`pybk.cli`)."""

from pybk.cli import main

if __name__ == "__main__":
    main(prog_name="pybk")
