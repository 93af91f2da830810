# Set-up and run targets. `make demo` and `make test` each create .venv and install first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export DAGSTER_HOME ?= $(CURDIR)/data/dagster_home
export MEGACPP_DATA_ROOT ?= $(CURDIR)/data

.PHONY: install sysdeps demo test ui clean bench-peer

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the machines carry this CPU build; an unpinned torch pulls CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[megatron,dev]'
	touch $(STAMP)

# The native tree walk of stage 6 (megacpp_core/native): tswalk.c compiled with the
# tree-sitter core of the installed py-tree-sitter release (its sdist, kept in the venv).
# Without it (no C compiler) the pipeline runs its Python walk, same output; `make test`
# then fails in tests/test_native_walk.py, which requires it.
NATIVE := megacpp_core/native/_tswalk.so
$(NATIVE): $(STAMP) megacpp_core/native/tswalk.c megacpp_core/native/rules.c megacpp_core/native/brace.c megacpp_core/native/build.py
	$(BIN)/python -m megacpp_core.native.build || \
	  echo "warning: the native tree walk was not built; enrichment uses its Python walk (same output, slower)" >&2

install: $(STAMP) $(NATIVE)

demo: install
	$(BIN)/megacpp run --corpus default

# System packages the tests use: Chromium (UI test) and a PostgreSQL server (production storage test).
sysdeps:
	@if [ -x /usr/bin/chromium ] && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; else \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium postgresql >/dev/null; fi

test: install sysdeps
	$(BIN)/lint-imports --no-cache
	@$(BIN)/python -m pytest -q -p no:cacheprovider tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# bench/peer_datatrove.py: datatrove 0.10.1 in a virtualenv of its own (never a dependency of
# the project), pinned in bench/peer-requirements.txt; then the benchmark on CORPUS under the
# data root (a finished `megacpp run --corpus CORPUS`; PEER_ARGS e.g. --repeat 3).
PEER_VENV := bench/.venv-peer
PEER_STAMP := $(PEER_VENV)/.installed-stamp
CORPUS ?= default
PEER_ARGS ?=

$(PEER_STAMP): bench/peer-requirements.txt
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet -r bench/peer-requirements.txt
	touch $(PEER_STAMP)

bench-peer: install $(PEER_STAMP)
	$(BIN)/python bench/peer_datatrove.py --corpus $(CORPUS) --data-root $(MEGACPP_DATA_ROOT) \
	  --peer-python $(PEER_VENV)/bin/python $(PEER_ARGS)

ui: install
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1

clean:
	rm -rf $(VENV) data
