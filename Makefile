# One command each: `make demo` and `make test` install first when needed.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install chromium demo test test-fast lint bench clean

install: $(STAMP) chromium

# Headless Chromium for the report.html / sweep.html browser test (skipped without it): Debian's
# package, installed only where it is missing and apt-get runs as root; elsewhere nothing happens.
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
	    || echo "chromium could not be installed: the browser test will be skipped"; \
	fi

# torch==2.13.0 goes FIRST: it takes the CPU build; an unpinned torch pulls a multi-GB CUDA one.
$(STAMP): setup.cfg constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[all,dev]'
	touch $(STAMP)

demo: install
	$(PY) -m compressor.demo

# Two workers (pytest-xdist), a test file each at a time: most tests leave one of the two cores
# idle (converters and tiny models run one thread), so the suite takes ~2/3 of its serial time.
TEST_WORKERS ?= 2

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

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
