# omniwatch — the commands a user and CI type. `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
OW := $(VENV)/bin/omniwatch
PIP_FLAGS ?= -q
CONSTRAINTS := $(wildcard constraints.txt)

.PHONY: help install deps up down status demo test test-quick test-unit test-long test-ray bench generate check dashboards compose docs rules backtest report scorecard scorecard-corpus clean

help:
	@echo "make demo        native stack + simulated FlowGRPO runs that trip every core alert"
	@echo "make test        unit tests, promtool rule checks/tests, drift check, integration tests on loopback"
	@echo "make test-quick  the edit loop (< 2 min): unit tests + promtool rule checks/tests, no live stack"
	@echo "make test-ray    install Ray + TransferQueue (CPU torch) into .venv and run the tests that need them"
	@echo "make up|down|status   the monitoring stack (docker compose if an engine answers, else native)"
	@echo "make generate    regenerate every generated file (rules + their tests, dashboards, docs, compose, k8s, benchmark figures)"
	@echo "make check       fail on any drift between the generated files and their sources (make test runs it)"
	@echo "make backtest RUN=path/to/run.jsonl   which alerts would have fired, at which steps"
	@echo "make report RUN=run.jsonl|LOG_ROOT [OUT=run.html]   a shareable HTML report (GPU-hours ledger, verdict, charts)"
	@echo "make bench       benchmarks (ratios against baselines in the same run)"
	@echo "make scorecard   detection scorecard: backtest the public corpus, write benchmarks/scorecard.json + docs/scorecard.md"
	@echo "make scorecard-corpus   rewrite the scorecard corpus through verl's Tracking (needs verl: make test-ray installs it)"

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/pip install $(PIP_FLAGS) $(if $(CONSTRAINTS),-c constraints.txt) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Prometheus + Alertmanager binaries (Debian/Ubuntu packages). Installed on demand when missing and
# apt-get can run (root); otherwise the exact command is printed.
deps:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && \
	    { command -v alertmanager >/dev/null || command -v prometheus-alertmanager >/dev/null; }; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing prometheus + prometheus-alertmanager (apt)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	else \
		echo "missing prometheus/alertmanager: sudo apt-get install -y prometheus prometheus-alertmanager"; exit 1; \
	fi

# `make up` beside a run: WATCH=<VERL_FILE_LOGGER_ROOT, a file or a glob> (repeatable via spaces; each passed quoted,
# so a glob reaches omniwatch whole and matches files created later);
# TRAINER_CONFIG=<the runs' resolved configs: a Hydra outputs dir, a .hydra/config.yaml, a console log with
# VeRL-Omni's config print, or a directory holding any of them> (repeatable via spaces): finishes are told from hangs;
# SLACK_URL=<incoming webhook> or RECEIVERS=<relay receivers file> to get the alerts there.
WATCH ?=
TRAINER_CONFIG ?=
SLACK_URL ?=
RECEIVERS ?=
up: install deps
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		echo "Docker engine found: docker compose up -d"; $(OW) compose secrets && \
			$(if $(TRAINER_CONFIG),echo "TRAINER_CONFIG is read by the native stack (omniwatch up); the compose exporter does not get it" &&) \
			$(if $(WATCH),WATCH='$(firstword $(WATCH))') $(if $(SLACK_URL),OMNIWATCH_SLACK_URL='$(SLACK_URL)') \
			$(if $(RECEIVERS),RECEIVERS='$(abspath $(RECEIVERS))') docker compose up -d --build; \
	else \
		$(if $(SLACK_URL),OMNIWATCH_SLACK_URL='$(SLACK_URL)') $(OW) up $(foreach w,$(WATCH),--watch '$(w)') \
			$(foreach c,$(TRAINER_CONFIG),--trainer-config '$(c)') $(if $(RECEIVERS),--receivers '$(RECEIVERS)'); \
	fi

down: install
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 && [ -n "$$(docker compose ps -q 2>/dev/null)" ]; then \
		docker compose down; fi
	$(OW) down

status: install
	$(OW) status

demo: install deps
	$(OW) demo

# Six pytest workers (pytest-xdist) on 2 cores: four take any test (the slow ones wait on live stacks and Ray
# scenarios, so more workers than cores overlap them), two are batch workers at nice 19 that take only tests with no
# live stack and no Ray (promtool and backtest runs, unit tests) and use the CPU the waiting ones leave
# (tests/conftest.py: LIVE_WORKERS, OMNIWATCH_LIVE_WORKERS). Six equal workers broke the scenarios' timing bounds;
# OMNIWATCH_TEST_TIMELINE=FILE + tests/timeline.py show where the wall time goes. The scheduler keeps the tests that
# share a module fixture on one worker and starts the longest first. `make check` and `omniwatch rules check` run
# once, as tests of the suite (tests/test_generated.py::test_the_checkout_has_no_drift,
# tests/test_rules.py::test_rules_check_command_passes).
TEST_WORKERS ?= 6
# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set (as on our CI machines): without them every
# pytest worker re-compiles every test module (pytest's assertion rewriting, ~10 s of a core each) and every
# exporter / CLI subprocess re-compiles the package, and the suite is CPU-bound on 2 cores.
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
test: install deps
	$(PYTEST) -q -m "not long" -n $(TEST_WORKERS) --durations=20 $(PYTEST_ARGS)

# The edit loop: every test that starts no live stack (no Prometheus/Alertmanager/exporter process on loopback),
# the promtool rule checks and unit tests included.
test-quick: install deps
	$(PYTEST) -q -m "not integration and not long and not slow" -n 2 --durations=10 $(PYTEST_ARGS)

# Every generated file, from its one source: alerts/ and its tests + the thresholds table of docs/alerts.md
# (exporter/omniwatch/alerting/), dashboards/*.json, docs/metrics.md, deploy/compose/, deploy/k8s/, the benchmark
# figures of docs/ (benchmarks/results.json): omniwatch/generated.py lists them.
generate: install
	$(OW) generate

check: install
	$(OW) generate --check

test-unit: install
	$(PYTEST) -q -m "not integration and not long" $(PYTEST_ARGS)

# Ray / TransferQueue are heavy (CPU torch ~0.7 GB): `make test` skips their tests, naming this target.
test-ray: install deps
	bash .ci/install-ray-tq.sh $(VENV)
	OMNIWATCH_REQUIRE_RAY=1 $(PYTEST) -q -m "ray and not long" $(PYTEST_ARGS)

test-long: install
	$(PYTEST) -q -m long $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/run.py

dashboards compose docs rules: generate

backtest: install deps
	@test -n "$(RUN)" || { echo "usage: make backtest RUN=path/to/run.jsonl"; exit 2; }
	$(OW) backtest $(RUN)

report: install deps
	@test -n "$(RUN)" || { echo "usage: make report RUN=path/to/run.jsonl|VERL_FILE_LOGGER_ROOT [OUT=run.html]"; exit 2; }
	$(OW) report $(RUN) $(if $(OUT),-o $(OUT))

# The detection scorecard (docs/scorecard.md): the corpus backtested in one pass, alerts/alertmanager.yml applied; writes
# the baseline benchmarks/scorecard.json (tests/test_scorecard.py fails when a figure gets worse) and the page.
scorecard: install deps
	$(OW) scorecard --write

# The corpus itself, written through verl's own Tracking logger (verl is a heavy optional dependency: make test-ray
# installs it), with its SHA256SUMS lines; then re-baseline with `make scorecard`.
scorecard-corpus: install
	$(PY) -m omniwatch.scorecard.corpus tests/fixtures --sums tests/fixtures/SHA256SUMS

clean:
	rm -rf $(VENV) .omniwatch .pytest_cache

# The test scheduler's shipped durations (tests/conftest.py): the last `make test` run's measured seconds per test
durations:
	cp .durations.json tests/durations.json
