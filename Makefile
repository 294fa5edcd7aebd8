# The two commands a newcomer needs (see README.md):
#   make render   install fabrique, render the default site into manifests/, validate it
#   make test     install fabrique, its test tools and servers, build the live tier's
#                 peers (Go), run lint, types and tests
# And for a person who wants the tests' control plane:
#   make up       start it, the default site's event path and a real Gitea on loopback
#                 (prints `export KUBECONFIG=...`, where the EventSource takes pushes,
#                 Gitea's URL, admin and token file, and how to clone and push the code
#                 repository, whose webhook feeds the EventSource); again: no change
#   make down     stop them
#   make scenario run scenario 34 against them, STRICT
# And the documentation site (mkdocs.yml, the pages of docs/):
#   make docs        build it into site/, strictly (as make test does)
#   make docs-serve  serve it on http://127.0.0.1:8000, rebuilt as its pages change
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SYSTEM_PACKAGES := docker-registry skopeo umoci git runc uidmap busybox-static containernetworking-plugins iptables nftables iproute2 util-linux redis-server mmdebstrap libcap2-bin
# Rootless BuildKit (tests/live/test_build.py) runs as a user with subordinate ids, as the
# rootless image's `user` does: the tests' own user, given a range here if it has none;
# as root, this one, made here.
BUILD_USER := fabrique-builder
BUILD_SUBIDS := 524288-589823

.PHONY: render test system-deps lint peers up down scenario docs docs-serve

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

$(VENV)/.docs: pyproject.toml $(VENV)/.base
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

render: $(VENV)/.base
	$(BIN)/fabrique render --out manifests
	$(BIN)/fabrique validate manifests

# The loopback servers and image tools the tests run for real: runc for BuildKit's OCI
# worker and the real node's containers, newuidmap (uidmap) for rootless BuildKit,
# busybox for the base image its RUN steps are tested on; for the real node, the CNI
# plugins, iptables/nftables (kube-proxy), iproute2 and util-linux (its namespaces),
# redis (Argo CD's cache), mmdebstrap and setcap (its images, from Debian packages).
# The tools of /usr/sbin are checked by path: a user's PATH may not hold it.
system-deps:
	@for tool in docker-registry skopeo umoci git /usr/sbin/runc newuidmap busybox /usr/lib/cni/bridge /usr/sbin/iptables /usr/sbin/nft /usr/sbin/ip nsenter unshare redis-server mmdebstrap /usr/sbin/setcap; do \
	  command -v $$tool >/dev/null || missing=1; \
	done; \
	if [ -n "$$missing" ]; then \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi
	@if [ "$$(id -u)" = 0 ]; then \
	  id $(BUILD_USER) >/dev/null 2>&1 || { \
	    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin $(BUILD_USER) && \
	    usermod --add-subuids $(BUILD_SUBIDS) --add-subgids $(BUILD_SUBIDS) $(BUILD_USER); }; \
	elif ! grep -q "^$$(id -un):" /etc/subuid 2>/dev/null || \
	     ! grep -q "^$$(id -un):" /etc/subgid 2>/dev/null; then \
	  $(SUDO) usermod --add-subuids $(BUILD_SUBIDS) --add-subgids $(BUILD_SUBIDS) "$$(id -un)"; \
	fi

lint: $(VENV)/.test
	$(BIN)/ruff check fabrique pipelines eventsources netpol tests bench docs
	$(BIN)/ruff format --check fabrique pipelines eventsources netpol tests bench docs
	$(BIN)/mypy
	$(BIN)/fabrique vendor --check

# The live tier's real programs, built from the wrapper modules of tests/peers/ into
# ~/.cache/fabrique/peers (again only when a go.mod changed); without Go, a notice.
peers:
	$(PYTHON) tests/peers/build.py --if-go

# stdout is what a shell may eval (export KUBECONFIG=..., comments): the rest to stderr,
# the venv's making too (a prerequisite's recipe lines would go to stdout, and be run
# again by the shell's eval)
up:
	@$(MAKE) --no-print-directory -s $(VENV)/.test >&2
	@$(PYTHON) tests/peers/build.py >&2
	@$(BIN)/python -m tests.live.controlplane up

down: $(VENV)/.test
	$(BIN)/python -m tests.live.controlplane down

# scenario 34 (bench/scenarios/build-gitops-digest.sh, STRICT) against make up's plane
scenario: $(VENV)/.test
	$(BIN)/python -m tests.live.controlplane scenario

test: system-deps lint peers
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=15
