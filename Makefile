# Two entry points, both self-contained on a fresh machine:
#   make demo  - runs the quickstart on an embedded in-process cluster, then the WAL demo
#                (a child appending through pybk.WAL is killed with kill -9; the replay)
#   make test  - installs everything (venv, Python packages with the spark extra, Debian's
#                zookeeper and Java 17) and runs ruff, mypy, the whole test suite against the
#                built wheel (installed in a venv of its own), the documentation site's strict
#                build, and a subset of the suite on every other supported CPython found
#                (make test-matrix; docs/pythons.md)
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
UV     := $(VENV)/bin/uv
STAMP  := $(VENV)/.installed
# The venv the suite runs in: only the wheel and its dependencies, never the source tree.
WHEEL_VENV  := .venv-wheel
WHEEL_STAMP := $(WHEEL_VENV)/.installed
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' pybk/__init__.py)
WHEEL   = dist/pybk-$(VERSION)-py3-none-any.whl
SDIST   = dist/pybk-$(VERSION).tar.gz
# The other supported interpreters (.ci/pythons: PATH and pyenv), each with a venv of its own
# under $(MATRIX_DIR); MATRIX_PYTHONS=... chooses them (empty: none).
MATRIX_PYTHONS ?= $(shell .ci/pythons $(PYTHON))
# The suite runs in two processes (pytest-xdist), a test file to each at a time (module
# fixtures such as a ZooKeeper server or a Spark session are made once); PARALLEL= runs it in
# one. Most tests wait on processes, disks and timers, so two share the 2 cores well.
PARALLEL ?= -n 2 --dist loadgroup
MATRIX_DIR     ?= .venvs
# What the other interpreters run (docs/pythons.md says why each is in): every area whose
# behaviour changed between 3.11 and 3.13 (asyncio's gather, wait_for and task factories,
# gc's freeze count, the simulator's traces), the package as installed, a real ZooKeeper and
# a Spark job. The whole suite runs on the default interpreter.
MATRIX_TESTS := tests/test_package.py tests/test_public_api.py tests/test_eventloop_gather.py \
	tests/test_eventloop_wait.py tests/test_gctune.py tests/test_sync_and_plugin.py \
	tests/sim/test_loop.py tests/sim/test_within.py tests/sim/test_determinism.py \
	tests/sim/test_plugin.py tests/client/test_driver_order.py tests/client/test_write_path.py \
	tests/client/test_recovery.py tests/metadata tests/logs/test_reader.py \
	tests/zk/test_zookeeper_store.py tests/spark/test_api.py
# Left out there: twenty seeds run twice in one process. tests/sim/test_across_pythons.py runs
# 200 seeds on each of these interpreters and requires the default one's traces, seed by seed.
MATRIX_DESELECT := tests/sim/test_determinism.py::test_twenty_seeds_run_twice_give_identical_traces

.PHONY: demo test lint typecheck pytest pytest-wheel venv system-deps bench bench-deps clean dist \
	test-matrix matrix-wheel docs

# The editable install puts the checkout on sys.path through a plain .pth file (setuptools'
# "compat" mode): type checkers (mypy, pyright) follow it, where the default mode's import
# hook leaves them with "Cannot find implementation or library stub for module named pybk".
# The venvs are filled by uv (installed into the first one by pip): about 40 s a venv where
# pip took 140 s with a warm cache, and make test builds four of them. uv keeps every build
# of pyspark's source archive (about 0.5 GB each) in its cache: `uv cache prune` after each
# install drops the unused ones (59 GB of them had filled this machine's disk past a bookie's
# 95% read-only watermark).
$(STAMP): setup.cfg pyproject.toml Makefile
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	$(UV) pip install -q --python $(PY) -e ".[test,speed,spark,docs]" -C editable_mode=compat
	$(UV) cache prune -q
	touch $(STAMP)

venv: $(STAMP)

# ZooKeeper (Java) from Debian, for the tests that run a real ZooKeeper server.
# Java 17 from Debian, for the Spark tests (PySpark runs a JVM).
# etcd from Debian, for the tests of the etcd metadata store (tests/etcd/).
# Chromium from Debian, for the tests that render the simulator's reports.
# Whatever is missing is installed by one apt-get (one index update, not one per package).
system-deps:
	@missing=""; \
	[ -f /usr/share/java/zookeeper.jar ] || missing="$$missing zookeeper"; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian's$$missing (ZooKeeper and etcd for the metadata tests, Chromium for the simulator's reports, Java for Spark)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# etcd from Debian: benchmarks/tail_latency.py's peer (the benchmark says so when it is absent)
bench-deps:
	@if ! command -v etcd >/dev/null 2>&1; then \
	  echo "installing Debian's etcd-server (the tail-latency benchmark's peer)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; \
	fi

demo: $(STAMP)
	$(PY) examples/quickstart.py
	$(PY) examples/wal_crash.py

lint: $(STAMP)
	$(VENV)/bin/ruff check pybk tests $(wildcard benchmarks examples spark_examples)

typecheck: $(STAMP)
	$(VENV)/bin/mypy pybk

# sdist and wheel, the wheel built from the sdist (what `python -m build` does), so a file
# the sdist leaves out is missing from the wheel too (tests/test_package.py)
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist . >/dev/null
	@ls dist

$(WHEEL_STAMP): setup.cfg pyproject.toml Makefile $(STAMP)
	@test -f $(WHEEL) || $(MAKE) dist
	$(UV) venv -q --clear --python $(PYTHON) $(WHEEL_VENV)
	$(UV) pip install -q --python $(WHEEL_VENV)/bin/python "$(WHEEL)[test,speed,spark]"
	$(UV) cache prune -q
	touch $(WHEEL_STAMP)

# Each run's temporary files under the checkout (--basetemp): pytest prunes all but the last
# three runs' directories under /tmp/pytest-of-USER, so another pytest run on the same machine
# could delete a long suite's files while it uses them.
# The suite against the installed wheel. The venv is made once (dependencies from the wheel's
# metadata); this checkout's wheel is reinstalled into it on every run. The pytest script (not
# python -m pytest) keeps the checkout off sys.path: `import pybk` finds the wheel's
# (tests/test_package.py checks).
pytest: dist
	$(MAKE) pytest-wheel

pytest-wheel: $(WHEEL_STAMP) system-deps
	$(UV) pip install -q --python $(WHEEL_VENV)/bin/python --reinstall --no-deps "$(WHEEL)"
	mkdir -p .pytest-tmp
	PYBK_WHEEL=$(WHEEL) PYBK_SDIST=$(SDIST) $(WHEEL_VENV)/bin/pytest -q -p no:cacheprovider \
	  --basetemp=$(CURDIR)/.pytest-tmp/wheel $(PARALLEL) --durations=25

# MATRIX_TESTS on each of MATRIX_PYTHONS, against the same wheel (a venv per interpreter,
# made again when setup.cfg changes). The interpreters' runs go at once, each output printed
# whole when all are done: alone, one used about half of the 2 cores (its tests mostly wait
# on ZooKeeper, SQLite and timers).
test-matrix: dist
	$(MAKE) matrix-wheel

matrix-wheel: system-deps $(STAMP)
	@set -e; if [ -z "$(strip $(MATRIX_PYTHONS))" ]; then \
	  echo "test-matrix: no other supported Python found"; fi; \
	mkdir -p .pytest-tmp; rm -f .pytest-tmp/py*.rc; runs=""; \
	for py in $(MATRIX_PYTHONS); do \
	  v=$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  venv=$(MATRIX_DIR)/py$$v; \
	  echo "== Python $$v ($$py): $$venv"; \
	  if [ ! -f $$venv/.installed ] || [ setup.cfg -nt $$venv/.installed ]; then \
	    $(UV) venv -q --clear --python $$py $$venv; \
	    $(UV) pip install -q --python $$venv/bin/python "$(WHEEL)[test,speed,spark]"; \
	    $(UV) cache prune -q; \
	    touch $$venv/.installed; \
	  fi; \
	  $(UV) pip install -q --python $$venv/bin/python --reinstall --no-deps "$(WHEEL)"; \
	  runs="$$runs $$v"; \
	done; \
	for v in $$runs; do \
	  ( PYBK_WHEEL=$(WHEEL) PYBK_SDIST=$(SDIST) $(MATRIX_DIR)/py$$v/bin/pytest -q \
	      -p no:cacheprovider --basetemp=$(CURDIR)/.pytest-tmp/py$$v $(PARALLEL) \
	      $(MATRIX_TESTS) $(addprefix --deselect ,$(MATRIX_DESELECT)) \
	      > .pytest-tmp/py$$v.log 2>&1 && rc=0 || rc=$$?; echo $$rc > .pytest-tmp/py$$v.rc ) & \
	done; \
	wait; failed=""; \
	for v in $$runs; do \
	  echo "== Python $$v: the subset"; cat .pytest-tmp/py$$v.log; \
	  [ "$$(cat .pytest-tmp/py$$v.rc 2>/dev/null)" = 0 ] || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-matrix: failed on Python$$failed"; exit 1; fi

# the documentation site (mkdocs.yml; docs/site.md) into site/: every warning an error
# (a broken link or anchor, a module path that moved, a docstring griffe cannot read)
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# One wheel for every run: ruff, mypy, the documentation and the other interpreters' subset
# first, side by side (each target's output printed whole when it ends), then the whole suite
# on the default one, whose cross-version trace comparison (tests/sim/test_across_pythons.py)
# runs the other interpreters from their venvs.
test: dist
	$(MAKE) -j4 --output-sync=target lint typecheck docs matrix-wheel
	PYBK_OTHER_PYTHONS="$(foreach py,$(MATRIX_PYTHONS),$(MATRIX_DIR)/py$(shell $(py) -c 'import sys; print("%d.%d" % sys.version_info[:2])')/bin/python)" \
	  $(MAKE) pytest-wheel

# every benchmark, each quick by default (see its --help for longer runs)
bench: $(STAMP) bench-deps
	$(PY) benchmarks/targets.py
	$(PY) benchmarks/add_profile.py
	$(PY) benchmarks/add_cpu.py
	$(PY) benchmarks/add_layers.py
	$(PY) benchmarks/bookie_append.py
	$(PY) benchmarks/ledger_append.py
	$(PY) benchmarks/tcp_append.py
	$(PY) benchmarks/checkpoint.py
	$(PY) benchmarks/wal_append.py
	$(PY) benchmarks/table_ops.py
	$(PY) benchmarks/tail_latency.py
	$(PY) benchmarks/lone_commit.py
	$(PY) benchmarks/lone_cpu.py
	$(PY) benchmarks/deferred_sync.py
	$(PY) benchmarks/metrics_overhead.py
	$(PY) benchmarks/spark_write.py --rows 200000 --rounds 2 --seeds 20 --duration 5
	$(PY) benchmarks/abuse.py
	$(PY) benchmarks/tiered_read.py --mb 1024
	$(PY) benchmarks/sim_seeds.py
	$(PY) benchmarks/gc_soak.py
	$(PY) benchmarks/gc_cost.py
	$(PY) benchmarks/metadata_ops.py
	$(PY) benchmarks/storage_scale.py
	$(PY) benchmarks/noisy_neighbour.py
	$(VENV)/bin/pybk bench

clean:
	rm -rf $(VENV) $(WHEEL_VENV) $(MATRIX_DIR) build dist site *.egg-info
