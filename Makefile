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

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check compressor tests

bench: install
	$(PY) -m bench.run

clean:
	rm -rf build dist *.egg-info demo-out
