# Set-up is part of every target: a fresh clone needs only `make train` or
# `make test` (Python 3.10+ with venv; root with apt-get for the data).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# JAX, for the benchmark's baselines, lives in a venv of its own, unless
# $XLA_MNIST_JAX_PYTHON names another interpreter.
JAX_VENV := .venv-jax
JAX_REQUIREMENTS := benchmarks/requirements-jax.txt
ifeq ($(XLA_MNIST_JAX_PYTHON),)
export XLA_MNIST_JAX_PYTHON := $(CURDIR)/$(JAX_VENV)/bin/python
JAX_SETUP := $(JAX_VENV)/.installed
endif
# Debian's Fashion-MNIST folder, as xla_mnist/runtime/layout.py names it.
FASHION_DIR := $(shell sed -n "s/^DEBIAN_FASHION_MNIST = '\(.*\)'/\1/p" xla_mnist/runtime/layout.py)

.PHONY: setup jax data browser toolchain train test bench compare lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

jax: $(JAX_VENV)/.installed

$(JAX_VENV)/.installed: $(JAX_REQUIREMENTS)
	test -x $(JAX_VENV)/bin/python || $(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet -r $(JAX_REQUIREMENTS)
	touch $@

# Debian's Fashion-MNIST: the real data that trains offline.
data:
	@if [ -f $(FASHION_DIR)/train-images-idx3-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  sh scripts/apt_install.sh dataset-fashion-mnist; \
	else \
	  echo "Fashion-MNIST is not in $(FASHION_DIR): run 'sudo apt-get install dataset-fashion-mnist'" >&2; \
	  exit 1; \
	fi

# Debian's headless Chromium and its driver, for the browser tests.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  sh scripts/apt_install.sh chromium chromium-driver; \
	else \
	  echo "Chromium is missing: run 'sudo apt-get install chromium chromium-driver'" >&2; \
	  exit 1; \
	fi

# Debian's C++ compiler, cmake and zlib, for python -m xla_mnist.aot.
toolchain:
	@if command -v g++ >/dev/null && command -v cmake >/dev/null \
	  && [ -f /usr/include/zlib.h ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  sh scripts/apt_install.sh g++ cmake zlib1g-dev; \
	else \
	  echo "g++, cmake or zlib.h is missing: run 'sudo apt-get install g++ cmake zlib1g-dev'" >&2; \
	  exit 1; \
	fi

# Trains the TF1 recipe on Fashion-MNIST; pass more flags with ARGS='...'.
train: setup data
	$(BIN)/python -m xla_mnist.train --config=fashion_mnist $(ARGS)

# The whole suite, slow tests included; then the tests marked `kernels`
# again, with TF's oneDNN kernels the other way from this CPU's default
# (scripts/onednn_flipped.py), so that either kind of CPU checks both.
# pytest exits 5 when it collects nothing: a failure here too.
# Most tests wait on a one-thread TF process: $(TEST_WORKERS) workers
# (pytest-xdist) run a test file each at a time, so that a file's tests
# share its module's set-up; the session's set-up is built once for all
# workers (tests/support/shared.py). Files go out in the order
# tests/conftest.py gives. The kernels tests go out one at a time: most of
# them are the Keras panel's, in one file (a module's set-up may then be
# built on each worker).
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS)
test: setup $(JAX_SETUP) data browser toolchain
	$(PYTEST) --dist=loadfile --no-loadscope-reorder $(ARGS); rc=$$?; \
	if [ $$rc = 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	[ $$rc = 0 ] || exit $$rc; \
	flipped=$$($(BIN)/python scripts/onednn_flipped.py) || exit 1; \
	echo "make test: the kernels tests again, TF_ENABLE_ONEDNN_OPTS=$$flipped"; \
	TF_ENABLE_ONEDNN_OPTS=$$flipped $(PYTEST) --dist=load -m kernels $(ARGS); \
	rc=$$?; \
	if [ $$rc = 5 ]; then echo "make test: no test is marked kernels" >&2; fi; \
	exit $$rc

# Every way to run the step, and the baselines, in one process; whole
# processes; the inference of a run it exports (hence the toolchain): tables,
# logs/bench.json and docs/results.md. JAX runs in $(JAX_VENV), or in
# $XLA_MNIST_JAX_PYTHON when set.
bench: setup $(JAX_SETUP) data toolchain
	$(BIN)/python -m benchmarks.bench $(ARGS)

# The recipe as off, on (per step), auto and fused, side by side, and why:
# each mode timed and profiled, and timed again at other batch sizes; it
# regenerates docs/why.md and docs/why.png from this machine. Each other
# model is compared too, every mode timed and profiled (docs/models.md).
# COMPARE_CONFIG=cifar10 ARGS='--config.image_dir=DIR --page=PAGE': the
# colour recipe on a folder of images (docs/models.md).
COMPARE_CONFIG ?= fashion_mnist
COMPARE_SWEEP ?= batch_size=10,100,1000,10000
COMPARE_MODELS ?= softmax,mlp,cnn
compare: setup data
	$(BIN)/python -m xla_mnist.compare --config=$(COMPARE_CONFIG) \
	  --sweep=$(COMPARE_SWEEP) --sweep=model=$(COMPARE_MODELS) \
	  --page=docs/why.md $(ARGS)

lint: setup
	$(BIN)/ruff check xla_mnist configs tests benchmarks scripts notebooks
	$(BIN)/ruff format --check xla_mnist configs tests benchmarks scripts notebooks

clean:
	rm -rf $(VENV) $(JAX_VENV) data logs
