# hookserve: `make run` serves the built-in models, `make test` runs the whole suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | md5sum | cut -c1-12)

.PHONY: install run test test-fast lint bench mutate clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

run: $(STAMP)
	$(PY) -m service

REPORT := tests/artifacts/junit.xml

# The whole suite. pytest's exit 5 (no tests collected) is a failure, and so is a run that ends
# without its report: a test that exits the interpreter (os._exit, a signal) would otherwise pass.
test: $(STAMP)
	rm -f $(REPORT); $(PY) -m pytest -q -p no:cacheprovider --junitxml=$(REPORT); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; \
	if [ ! -s $(REPORT) ]; then echo "pytest ended without writing $(REPORT): did a test exit it?" >&2; exit 1; fi; \
	exit $$status

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check service tests bench examples mutation
	$(VENV)/bin/ruff format --check service tests bench examples mutation
	$(VENV)/bin/mypy service bench tests examples mutation

bench: $(STAMP)
	$(PY) -m bench.run

mutate: $(STAMP)  ## mutation testing (not part of test: ~30 min on 2 cores); writes mutation/REPORT.md
	$(PIP) install --quiet -e ".[dev,mutate]"
	$(PY) -m mutation.run $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
