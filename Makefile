# The two commands a user needs:  make demo  (the main job)  and  make test  (the whole test suite).
# Each does all the setup it needs, idempotently; a second run only rebuilds what changed.
#
#   REMAT_VENV     virtual environment (default ~/.cache/remat/venv, created by scripts/setup.sh)
#   BUILD_DIR      CMake build directory (default build)
#   CMAKE_ARGS     extra CMake arguments, e.g. -DREMAT_SANITIZE=ON

REMAT_VENV ?= $(HOME)/.cache/remat/venv
BUILD_DIR ?= build
CMAKE_ARGS ?=
export REMAT_VENV
# ccache: hash paths relative to the checkout, so a fresh clone elsewhere (CI) reuses earlier compilations.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

PYTHON := $(REMAT_VENV)/bin/python

.PHONY: all setup configure build test demo zoo ecosystem sanitize clean

all: build

setup:
	@scripts/setup.sh

configure: setup
	@scripts/configure.sh "$(BUILD_DIR)" $(CMAKE_ARGS)

build: configure
	@cmake --build "$(BUILD_DIR)"

test: build
	@scripts/run_tests.sh "$(BUILD_DIR)"

demo: build
	@scripts/demo.sh "$(BUILD_DIR)"

# The whole model zoo (tests/python/test_zoo.py with REMAT_ZOO=all; make test runs its quick subset); the table of
# results goes to $(BUILD_DIR)/zoo.md (or REMAT_ZOO_MARKDOWN). About 40 minutes on 2 idle cores.
zoo: build
	@scripts/run_zoo.sh "$(BUILD_DIR)"

# The ecosystem probe, every program (tests/python/test_ecosystem.py; make test runs all but the slow ones): training
# programs from outside the test matrix, byte-compared; the table of results goes to $(BUILD_DIR)/ecosystem.md.
# About 15 minutes.
ecosystem: build
	@REMAT_BUILD_DIR="$(abspath $(BUILD_DIR))" REMAT_ECOSYSTEM=all \
	  REMAT_ECOSYSTEM_MARKDOWN="$${REMAT_ECOSYSTEM_MARKDOWN:-$(abspath $(BUILD_DIR))/ecosystem.md}" \
	  "$(PYTHON)" -m pytest -q -s -rfEw tests/python/test_ecosystem.py

# The core under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build directory.
sanitize: setup
	@scripts/configure.sh build-sanitize -DREMAT_SANITIZE=ON -DREMAT_BUILD_BENCHMARKS=OFF
	@cmake --build build-sanitize
	@ctest --test-dir build-sanitize --output-on-failure

clean:
	rm -rf "$(BUILD_DIR)" build-sanitize
