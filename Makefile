# One command each: `make demo` and `make test` install first when needed.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast lint bench clean

install: $(STAMP)

# torch==2.13.0 goes FIRST: it takes the CPU build; an unpinned torch pulls a multi-GB CUDA one.
$(STAMP): setup.cfg constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[all,dev]'
	touch $(STAMP)

demo: install
	$(PY) -m compressor.demo

test: install
	$(PY) -m pytest -q

# The quick suite (under a minute): unit tests of the pure modules and the framework-free checks.
FAST_TESTS := tests/unit tests/test_architecture.py tests/test_lean_import.py tests/test_recipe.py \
              tests/test_workers.py tests/test_workspace.py

test-fast: install
	$(PY) -m pytest -q $(FAST_TESTS)

lint: install
	$(VENV)/bin/ruff check compressor tests bench

bench: install
	$(PY) -m bench.run

clean:
	rm -rf build dist *.egg-info demo-out
