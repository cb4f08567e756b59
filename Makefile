# The two commands a newcomer needs: `make demo` and `make test`. Both build .venv from this
# repository's own files, so a fresh machine needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint imports typecheck pytest pytest-pure compiled pure clean system node

# Debian packages the project uses beside its Python ones: the JDBC drivers Spark reads the
# services' tables with, Java for Spark, Chromium for the tests that look at pages, and etcd,
# the coordination store of broker groups (docs/cluster.md; tests start their own), and iptables,
# which cuts links between the partition tests' hosts (txbroker/chaos/netns.py).
DEBS := libpostgresql-jdbc-java libxerial-sqlite-jdbc-java chromium chromium-driver prometheus docker-compose etcd-server curl jq iptables

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: system $(STAMP) compiled
	$(BIN)/python -m examples.demo

test: system $(STAMP) node lint imports typecheck compiled pytest pytest-pure

# The compiled hot path (docs/operations.md, "The compiled hot path"): mypyc compiles the modules
# txbroker/runtime/build.py lists into extension modules beside their .py files, which Python
# then imports instead. `make pure` removes them (the same .py files run as Python).
COMPILED := $(VENV)/.compiled
HOTPATH_SOURCES := $(shell find txbroker sdk/txbroker_sdk -name '*.py' 2>/dev/null)

compiled: $(COMPILED)

$(COMPILED): $(STAMP) setup.py $(HOTPATH_SOURCES)
	TXB_COMPILE=1 $(BIN)/python setup.py --quiet build_ext --inplace >/dev/null
	@# An extension the build found up to date keeps its time; it is as new as its source now.
	find txbroker sdk/txbroker_sdk -name '*.so' -exec touch {} +
	touch $(COMPILED)

pure:
	find txbroker sdk/txbroker_sdk -name '*.so' -delete
	rm -f $(COMPILED)

# The Node.js orders service of tests/http/test_node_service.py: its packages, exactly as locked.
# Without npm the test skips (and fails under CI=true, which must run it).
NODE_SERVICE := tests/http/node
NODE_STAMP := $(NODE_SERVICE)/node_modules/.package-lock.json

node: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_SERVICE)/package.json $(NODE_SERVICE)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(NODE_SERVICE) --no-audit --no-fund; \
	else \
		echo "npm is not installed: the Node.js service test will skip"; \
	fi

# Installs what is missing (as root, or through sudo); says how when it cannot.
system:
	@missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
		($$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
		|| echo "could not install them: run apt-get install" $$missing; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The layers of docs/layout.md: imports run downward only (contracts in pyproject.toml).
imports: $(STAMP)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The tests mostly wait on the processes they start (brokers, etcd, Spark, PostgreSQL), so four
# workers keep two cores busy; tests that share a worker are grouped in tests/conftest.py.
# PYTEST_WORKERS=0 runs them in this process, one at a time.
PYTEST_WORKERS ?= 4

# TXB_EXPECT_BUILD: tests/runtime/test_build.py fails unless the modules loaded are that build's.
pytest: $(STAMP) compiled
	TXB_EXPECT_BUILD=compiled $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

# The store, protocol and crash tests again on the pure-Python build: a copy of the sources
# without the extension modules, first on the path of the tests and of the brokers they start.
PURE := build/pure
PURE_TESTS := tests/store tests/protocol tests/server/test_crash_under_load.py \
	tests/runtime/test_build.py
PURE_PATH := $(subst $(eval) ,:,$(addprefix $(CURDIR)/$(PURE)/,. sdk checkback outbox migrations spark_reconcile))

pytest-pure: $(STAMP)
	rm -rf $(PURE) && mkdir -p $(PURE)
	tar -c --exclude='*.so' --exclude='__pycache__' --exclude='node_modules' txbroker sdk checkback outbox migrations \
		spark_reconcile tests pyproject.toml | tar -x -C $(PURE)
	cd $(PURE) && TXB_EXPECT_BUILD=pure PYTHONPATH=$(PURE_PATH) \
		$(CURDIR)/$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup -p no:cacheprovider \
		$(PURE_TESTS)

clean: pure
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache $(NODE_SERVICE)/node_modules
