# The two commands of the README: `make demo` (set up, then run the demo) and `make test`.
PYTHON ?= python3
# what the checks that use .venv ask for first (`make test` makes it once, before them)
SETUP ?= setup
PACKAGES := $(shell $(PYTHON) tools/venvs.py list)

.PHONY: setup demo test checks lint test-packages test-cross test-cross-compat test-cross-rest \
	test-slow release docs fuzz bench clean \
	$(addprefix test-,$(PACKAGES))

setup:
	$(PYTHON) tools/venvs.py full

demo: setup
	.venv/bin/mega demo --output build/demo

# Each package's own tests run in a venv holding only that package and what it declares, so a
# dependency missing from a pyproject.toml fails here. Then the cross-package and compatibility
# tests run in the full venv, the four packages are built and installed as a user installs them
# (release), and the docs are built. pytest's exit status 5 (no tests collected) fails the
# target. Every check runs even when an earlier one failed (--keep-going); any failure fails
# `make test`. Two checks run at a time (the cross-package tests, in two halves of about equal
# length, start first), each one's output printed whole when it ends, with its slowest tests.
TEST_JOBS ?= 2
test: setup
	$(MAKE) --keep-going --jobs=$(TEST_JOBS) --output-sync=target checks SETUP=

checks: test-cross-compat test-cross-rest lint test-packages release docs

lint: $(SETUP)
	.venv/bin/ruff check packages tests tools testing
	.venv/bin/ruff format --check packages tests tools testing

test-packages: $(addprefix test-,$(PACKAGES))

$(addprefix test-,$(PACKAGES)): test-%:
	$(PYTHON) tools/venvs.py package $*
	.venvs/$*/bin/python tools/check_isolation.py $*
	.venvs/$*/bin/python -m pytest --durations=15 packages/$*/tests

test-cross: test-cross-compat test-cross-rest

# the comparisons with the seed commit and megatron-core (tests/compat), and the rest
test-cross-compat: $(SETUP)
	.venv/bin/python -m pytest --durations=25 -m "not slow" tests/compat

test-cross-rest: $(SETUP)
	.venv/bin/python -m pytest --durations=25 -m "not slow" tests --ignore=tests/compat

# The tests `make test` leaves out to stay within CI's 30 minutes: the switched seed checkout's
# other whole jobs (CP, FIM, SFT, phases, a tokenizer without a pad token, more seeded random
# cases; minutes each) and the benchmark runs. Run them before a release and after touching the
# switch or the data path it replaces.
test-slow: setup
	.venv/bin/python -m pytest --durations=25 -m slow tests

# sdists and wheels of the four packages, built the standard way, installed into fresh venvs
# (megafmt alone, without torch; all four) and smoke-tested there
release: $(SETUP)
	.venv/bin/python tools/release_check.py

# the documentation site (mkdocs-material, the API reference from the docstrings) in build/site;
# a warning fails it
docs: $(SETUP)
	.venv/bin/python -m pip install --quiet -c requirements/constraints.txt -r requirements/docs.txt
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict

# The dataset fuzz test, larger: FUZZ_COUNT cases from seed FUZZ_START, each built by megaindex,
# megatron-core 0.16.1 and the seed commit (CI runs 24 from 0, and the regression seeds).
FUZZ_COUNT ?= 500
FUZZ_START ?= 0
fuzz: setup
	FUZZ_COUNT=$(FUZZ_COUNT) FUZZ_START=$(FUZZ_START) .venv/bin/python -m pytest \
		tests/compat/test_dataset_fuzz.py -q

# Every benchmark of tools/bench/ against megatron-core and the seed commit, one table in
# docs/benchmarks.md (24 minutes on 2 busy cores); BENCH_FLAGS=--quick for a smoke test.
BENCH_FLAGS ?=
bench: setup
	.venv/bin/python tools/bench/run_all.py $(BENCH_FLAGS)

clean:
	rm -rf .venv .venvs build packages/*/build
