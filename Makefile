# The two commands a newcomer needs: `make demo` and `make test`. Both build .venv from this
# repository's own files, so a fresh machine needs nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint imports typecheck pytest clean system node

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

demo: system $(STAMP)
	$(BIN)/python -m examples.demo

test: system $(STAMP) node lint imports typecheck pytest

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

pytest: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(NODE_SERVICE)/node_modules
