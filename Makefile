# Two entry points, both self-contained on a fresh machine:
#   make demo  - runs the quickstart on an embedded in-process cluster, then the WAL demo
#                (a child appending through pybk.WAL is killed with kill -9; the replay)
#   make test  - installs everything (venv, Python packages with the spark extra, Debian's
#                zookeeper and Java 17) and runs ruff, mypy and the whole test suite
# The interpreter the venv is made from: the distribution's CPython 3.11 when it is there and
# can make a venv, else python3. Measured on this kind of machine (docs/performance.md,
# "The interpreter"): Debian's /usr/bin/python3.11 (libpython linked into the executable)
# runs pybk's write path in about 0.8x the CPU, and simulated seeds in 0.88x, of the pyenv
# build found first on PATH (--enable-shared: every call into libpython through the PLT).
# PYTHON=... chooses another.
PYTHON ?= $(shell if /usr/bin/python3.11 -c 'import sys, venv, ensurepip; \
            sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; \
            then echo /usr/bin/python3.11; else echo python3; fi)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest venv system-deps bench clean

# The editable install puts the checkout on sys.path through a plain .pth file (setuptools'
# "compat" mode): type checkers (mypy, pyright) follow it, where the default mode's import
# hook leaves them with "Cannot find implementation or library stub for module named pybk".
$(STAMP): setup.cfg pyproject.toml Makefile
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,speed,spark]" --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

# ZooKeeper (Java) from Debian, for the tests that run a real ZooKeeper server.
# Java 17 from Debian, for the Spark tests (PySpark runs a JVM).
system-deps:
	@if [ ! -f /usr/share/java/zookeeper.jar ]; then \
	  echo "installing Debian's zookeeper package"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends zookeeper >/dev/null; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "installing Debian's chromium (the simulator's reports are rendered in tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	fi
	@if ! command -v java >/dev/null 2>&1; then \
	  echo "installing Debian's openjdk-17-jre-headless (Java for Spark)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null; \
	fi

demo: $(STAMP)
	$(PY) examples/quickstart.py
	$(PY) examples/wal_crash.py

lint: $(STAMP)
	$(VENV)/bin/ruff check pybk tests $(wildcard benchmarks examples spark_examples)

typecheck: $(STAMP)
	$(VENV)/bin/mypy pybk

pytest: $(STAMP) system-deps
	$(VENV)/bin/pytest -q -p no:cacheprovider

test: lint typecheck pytest

# every benchmark, each quick by default (see its --help for longer runs)
bench: $(STAMP)
	$(PY) benchmarks/targets.py
	$(PY) benchmarks/add_profile.py
	$(PY) benchmarks/add_cpu.py
	$(PY) benchmarks/add_layers.py
	$(PY) benchmarks/bookie_append.py
	$(PY) benchmarks/ledger_append.py
	$(PY) benchmarks/tcp_append.py
	$(PY) benchmarks/checkpoint.py
	$(PY) benchmarks/wal_append.py
	$(PY) benchmarks/lone_commit.py
	$(PY) benchmarks/metrics_overhead.py
	$(PY) benchmarks/spark_write.py --rows 200000 --rounds 2 --seeds 20 --duration 5
	$(PY) benchmarks/abuse.py
	$(PY) benchmarks/sim_seeds.py
	$(VENV)/bin/pybk bench

clean:
	rm -rf $(VENV) build *.egg-info
