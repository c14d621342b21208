# The two commands a newcomer runs on a fresh clone:
#   make demo   - install into .venv, then run `fastload demo`
#   make test   - install into .venv, then run ruff, mypy and the test suite
# Also: make test-fast (no S3 server, no other processes: the edit-test loop),
#       make docs (the site with the API reference, warnings as errors).
# Everything is installed by `make setup` from this repository's own files.

VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.fastload-installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint typecheck pytest docs fuzz bench-hot clean

setup: $(STAMP)

# torch first, pinned to the CPU wheel this machine carries: a bare `torch`
# requirement would pull a multi-GB CUDA build. The project's own range admits it.
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard csrc/*.cc csrc/*.h)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q scikit-build-core nanobind
	$(PIP) install -q --no-build-isolation -e '.[all]'
	touch $@

demo: setup
	$(VENV)/bin/fastload demo

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks fuzz
	$(VENV)/bin/ruff format --check src tests benchmarks fuzz

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test: lint typecheck docs pytest

# The fast tier: every test that needs neither the SeaweedFS server (marker s3) nor
# other processes (marker proc, set by tests/conftest.py), nor is marked slow.
test-fast: setup
	$(VENV)/bin/ruff check src tests benchmarks fuzz
	$(VENV)/bin/pytest -q -m "not s3 and not proc and not slow" $(PYTEST_ARGS)

# The documentation site, API reference included (docs/api/ from docs/gen_api.py) and
# the argument table (docs/arguments.md from docs/gen_args.py), built with warnings as
# errors.
docs: setup
	$(PY) docs/gen_api.py --check
	$(PY) docs/gen_args.py --check
	$(VENV)/bin/mkdocs build --strict --quiet

fuzz: setup
	bash fuzz/run.sh 30

# the pytest-benchmark suite of the hot paths (not part of `make test`)
bench-hot: setup
	$(VENV)/bin/pytest benchmarks/test_hot_paths.py --benchmark-only --benchmark-group-by=group

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache
