# metricsd: `make run` and `make test` do all set-up on a fresh machine with Python >= 3.11.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: setup run test test-fast lint proto bench bench-quick bench-store browser-deps prometheus-deps victoria-metrics-deps spark-deps clean

include web/dashboard.mk

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP) dashboard-assets

# Headless Chromium from Debian for the dashboard's browser test (driven by the playwright
# package with executable_path, so no browser download). Installed when missing and root.
CHROMIUM := /usr/bin/chromium
browser-deps:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "browser-deps: $(CHROMIUM) is missing: run 'sudo apt-get install chromium'" >&2; exit 1; \
		fi; \
	fi

# Debian's Prometheus (2.42) for the remote-write test with a real sender
# (tests/http/test_http_remote_write_prometheus.py). Installed when missing and root.
prometheus-deps:
	@if ! command -v prometheus >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
		else \
			echo "prometheus-deps: prometheus is missing: run 'sudo apt-get install prometheus'" >&2; exit 1; \
		fi; \
	fi

# Debian's VictoriaMetrics (1.79) for the onward tests with a real receiver (remote write out,
# export/import round trip: tests/onward/). Installed when missing and root.
victoria-metrics-deps:
	@if ! command -v victoria-metrics >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics >/dev/null; \
		else \
			echo "victoria-metrics-deps: victoria-metrics is missing: run 'sudo apt-get install victoria-metrics'" >&2; exit 1; \
		fi; \
	fi

# Spark for the hourly Parquet's reading test (tests/onward/test_onward_parquet_engines.py):
# Debian's Java runtime (17; Spark 4 needs 17 or newer) when missing and root, and pyspark into
# .venv (the `spark` extra: a 460 MB wheel, 490 MB installed, half again the rest of .venv, so
# not in every dev install). The stamp follows pyproject.toml, as setup's does.
SPARK_STAMP := $(VENV)/.spark-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
spark-deps: $(SPARK_STAMP)
	@if [ "$$(java -version 2>&1 | sed -nE '1s/.*version "(1\.)?([0-9]+).*/\2/p')" -lt 17 ] 2>/dev/null \
			|| ! command -v java >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends default-jre-headless >/dev/null; \
		else \
			echo "spark-deps: Java 17 or newer is missing: run 'sudo apt-get install default-jre-headless'" >&2; exit 1; \
		fi; \
	fi
$(SPARK_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	rm -f $(VENV)/.spark-*
	touch $(SPARK_STAMP)

run: setup  ## set up, then start the embedded default (a store fed by a simulated cluster)
	$(BIN)/metricsd up

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup lint browser-deps prometheus-deps victoria-metrics-deps spark-deps  ## set up, then run every check and test (what CI runs)
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: setup  ## the fast tests only, for the edit loop
	$(BIN)/pytest -q -m 'not slow'

proto: setup  ## regenerate metricsd/proto/ from proto/metricsd.proto
	$(BIN)/python -m metricsd.proto.generate

bench: setup  ## metricsd side by side with Prometheus 2.42 and VictoriaMetrics 1.79 (apt-get installs them as root); ~10 min
	$(BIN)/python perf/compare.py $(BENCH_ARGS)

bench-quick: setup  ## the same with a fifth of the pods and 60 queries; ~1.5 min
	$(BIN)/python perf/compare.py --quick $(BENCH_ARGS)

bench-store: setup
	$(BIN)/python perf/bench_store.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
