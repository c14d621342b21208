# The two commands a newcomer runs on a fresh clone:
#   make demo   - install into .venv, then run `fastload demo`
#   make test   - install into .venv, then run ruff, mypy and the test suite
# Also: make test-fast (no S3 server, no other processes: the edit-test loop),
#       make test-py310 (CI's second leg: Python 3.10 without torch and DALI),
#       make docs (the site with the API reference, warnings as errors).
# Everything is installed by `make setup` (and `make setup-py310`) from this
# repository's own files.

VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.fastload-installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint typecheck pytest docs fuzz bench-hot clean
.PHONY: setup-py310 test-py310

setup: $(STAMP)

# torch first, pinned to the CPU wheel this machine carries: a bare `torch`
# requirement would pull a multi-GB CUDA build. The project's own range admits it, and
# constraints.txt keeps it (torchvision's newest release would upgrade torch).
$(STAMP): pyproject.toml CMakeLists.txt $(wildcard csrc/*.cc csrc/*.h)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q scikit-build-core nanobind
	$(PIP) install -q --no-build-isolation -c constraints.txt -e '.[all]'
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

# CI's second leg: the lowest supported Python (requires-python), without torch and
# DALI, in its own venv. The core must import and work there (docs/design.md); the
# tests that need torch or DALI are left out and counted in the closing summary
# (tests/conftest.py), all but the slow ones run. Python 3.10 is found on PATH or in
# pyenv's versions; PYTHON310=/path/to/python3.10 names another.
VENV310  ?= .venv310
PY310    := $(VENV310)/bin/python
STAMP310 := $(VENV310)/.fastload-installed
PYTHON310 ?= $(shell for p in python3.10 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.10*/bin/python3.10; \
	do $$p -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && { echo $$p; break; }; \
	done)

setup-py310: $(STAMP310)

# The extras that install without torch: test-core is the test suite's less torchdata.
$(STAMP310): pyproject.toml CMakeLists.txt $(wildcard csrc/*.cc csrc/*.h)
	@test -n "$(PYTHON310)" || { echo "no Python 3.10 found: make test-py310 PYTHON310=..." >&2; exit 1; }
	test -x $(PY310) || $(PYTHON310) -m venv $(VENV310)
	$(PY310) -m pip install -q --upgrade pip
	$(PY310) -m pip install -q scikit-build-core nanobind
	$(PY310) -m pip install -q --no-build-isolation -e '.[s3,image,coco,seaweedfs,text,test-core]'
	touch $@

test-py310: setup-py310
	$(PY310) -c "import importlib.util as u, sys, fastload, fastload._native; \
	assert sys.version_info[:2] == (3, 10) and not u.find_spec('torch'), 'not the 3.10 leg'; \
	print('fastload imports on Python', sys.version.split()[0], 'without torch')"
	$(VENV310)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

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
