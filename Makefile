# Two entry points (see README): `make run` trains on the embedded default, `make test` runs the
# suite (CI: .ci/run), the walk of the pages included; `make test-fast` its fast tier, the rule
# in tests/conftest.py; `make test-docs` the walk of the pages alone (tests/test_docs_walk.py,
# marked walk). All build
# .venv from nothing when it is missing or requirements changed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast test-docs lint venv clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	# torchrec's metadata asks for the CUDA fbgemm-gpu wheel; its real needs are in requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps torchrec==1.8.0
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m dlrm.train $(ARGS)

# the tests in two processes (pytest-xdist) of one OpenMP thread each, a core each (two teams of
# two threads on two cores spin-wait on each other's descheduled thread), then the walk alone:
# it runs two pages at a time, a core each (docs/measurements/walk.md: the suite's time)
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 -m "not walk" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m walk $(PYTEST_ARGS)

test-docs: $(STAMP)
	$(PY) -m pytest -q -m walk $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not walk" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check hybrid_dlrm dlrm embeddings data_pipeline perfmodel scripts tests
	$(PY) -m ruff format --check hybrid_dlrm dlrm embeddings data_pipeline perfmodel scripts tests

clean:
	rm -rf $(VENV)
