# The two commands a newcomer needs (see README.md):
#   make render   install fabrique, render the default site into manifests/, validate it
#   make test     install fabrique, its test tools and servers, run lint, types and tests
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SYSTEM_PACKAGES := docker-registry skopeo umoci git

.PHONY: render test system-deps lint

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(BIN)/pip install -q -e '.[test]'
	touch $@

render: $(VENV)/.base
	$(BIN)/fabrique render --out manifests
	$(BIN)/fabrique validate manifests

# The loopback servers and image tools the tests run for real.
system-deps:
	@for tool in docker-registry skopeo umoci git; do \
	  command -v $$tool >/dev/null || missing=1; \
	done; \
	if [ -n "$$missing" ]; then \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi

lint: $(VENV)/.test
	$(BIN)/ruff check fabrique pipelines eventsources netpol tests bench
	$(BIN)/ruff format --check fabrique pipelines eventsources netpol tests bench
	$(BIN)/mypy
	$(BIN)/fabrique vendor --check

test: system-deps lint
	$(BIN)/python -m pytest
