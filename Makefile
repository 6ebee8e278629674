# Two entry points, each self-sufficient on a fresh machine:
#   make demo   creates .venv, installs xlm_jax, trains on the embedded demo corpus
#   make test   creates .venv, installs xlm_jax, runs the test suite
# Both share ONE .venv, the tpu environment (our choice): `.[data,test,gcs,tpu]` installed with
# the exact pins of constraints/tpu.txt. libtpu is there so that the suite compiles for TPU
# topologies on the CPU; on a machine without TPU chips the CLIs run on the CPU and say
# nothing of it (xlm_jax/__init__.py). `make pins` regenerates the pins (docs/environments.md).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build of PyTorch, installed before `transformers` so that pip does not pull the CUDA build.
TORCH  ?= torch==2.13.0
PINS   := constraints/tpu.txt

.PHONY: demo test test-slow test-isolation install pins compile-runs clean

# Bytecode: the Python processes these recipes start write the bytecode of what they import
# (an empty PYTHONDONTWRITEBYTECODE is unset, whatever the shell exports), so each module is
# compiled once, by the first process that imports it, and not again by each of the suite's
# few hundred processes (each CLI process compiles ~0.3 s of xlm_jax alone otherwise).
export PYTHONDONTWRITEBYTECODE :=

# pip byte-compiles every file it installs on one core (22,000 files here); the install
# instead imports every module of xlm_jax once (WARM_BYTECODE), which compiles exactly what the
# package uses (about 6,100 files: TensorFlow, jax, torch, transformers, beam ... as imported)
# in under half the time `compileall` takes for all of them on both cores (issue 56), so that
# the CLIs start compiled even for a user whose shell sets PYTHONDONTWRITEBYTECODE. The
# stamp depends on the pins too, so a moved pin reinstalls; `pip check` then checks the
# installed environment as a whole.
define WARM_BYTECODE
import contextlib, importlib, io, pkgutil, xlm_jax
for m in pkgutil.walk_packages(xlm_jax.__path__, "xlm_jax.", onerror=lambda name: None):
    if not m.name.endswith("__main__"):
        with contextlib.suppress(BaseException), contextlib.redirect_stderr(io.StringIO()):
            importlib.import_module(m.name)
endef
export WARM_BYTECODE

$(VENV)/.installed: setup.py $(PINS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-compile -c $(PINS) "$(TORCH)"
	$(PIP) install -q --no-compile -c $(PINS) -e ".[data,test,gcs,tpu]"
	$(PIP) check
	$(PY) -c "$$WARM_BYTECODE" >/dev/null 2>&1
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m xlm_jax.demo --model_dir=demo_output

# Two workers (pytest-xdist), each test file on one worker so its module fixtures are built
# once: XLA compiles on one thread, so a second worker fills the second core while the first
# compiles (measured back to back on the 2-core machine: 27.5 min against 38.6 min serial,
# docs/NOTES.md). The files go out in a random order that keeps the long ones early, drawn
# from a seed printed at the start and the end of the run (tests/conftest.py; `--no-loadscope-
# reorder` keeps it; tests/testlib/schedule.py says why); TEST_ORDER_SEED=N draws one order
# again. Every test and test module fails if it leaves the process changed
# (tests/testlib/leak_check.py). TEST_WORKERS=0 runs the suite in one process. The tests'
# `python -m xlm_jax...` commands fork from a server that imported TensorFlow, seqio, jax and
# flax once per worker (tests/testlib/fork_server.py: ~a quarter less time for the files that
# run commands); TEST_FORK_SERVER=0 starts each as a plain process. `--durations`
# lists the slowest tests at the end, so every CI log says where the suite's time goes.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

TEST_ORDER_SEED ?=
ORDER_SEED := $(if $(TEST_ORDER_SEED),--file-order-seed=$(TEST_ORDER_SEED))

test: $(VENV)/.installed
	$(PY) -m pytest -q $(XDIST) --durations=15 $(ORDER_SEED)

# Order cannot matter: the whole suite with its files in a uniformly shuffled order (the seed
# printed; TEST_ORDER_SEED=N repeats one), then every test file alone in a process of its own,
# TEST_WORKERS at a time (tests/testlib/each_file.py). About an hour on 2 cores.
test-isolation: $(VENV)/.installed
	$(PY) -m pytest -q $(XDIST) --file-order=shuffle $(ORDER_SEED)
	$(PY) -m tests.testlib.each_file --jobs $(if $(filter 0,$(TEST_WORKERS)),1,$(TEST_WORKERS))

# The CUDA plugin alone (jax-cuda12-plugin + jax-cuda12-pjrt at the cuda12 pins: 180 MB, no
# CUDA libraries, no libcuda) gives compile-only GPUs to `python -m xlm_jax.accelerator.compile --target
# h100:1x1x8`. It lives beside .venv, not in it (a plugin in .venv makes every jax process look
# for a GPU), and goes on PYTHONPATH where wanted: PYTHONPATH=$(CUDA_COMPILE).
CUDA_COMPILE := $(VENV)/cuda_compile
$(CUDA_COMPILE)/.installed: constraints/cuda12.txt $(VENV)/.installed
	$(PIP) install -q --no-deps --target $(CUDA_COMPILE) \
	  $$(grep -E '^jax-cuda12-(plugin|pjrt)==' constraints/cuda12.txt)
	touch $@

# Only the tests marked slow (base-size shapes, training from an installed wheel, compiling
# for GPU nodes with the CUDA plugin), which `make test` skips.
test-slow: $(VENV)/.installed $(CUDA_COMPILE)/.installed
	XLM_JAX_SLOW_TESTS=1 XLM_JAX_CUDA_COMPILE=$(CUDA_COMPILE) $(PY) -m pytest -q $(XDIST) -m slow

# Every run file compiled for the target its header names, at its own batch and length
# (docs/performance.md, "Compiled for the targets", has the table and the wall time).
compile-runs: $(VENV)/.installed
	$(PY) -m xlm_jax.accelerator.compile.run_table --jobs 2 --out compile_runs.md

# Regenerates constraints/{cpu,tpu,cuda12}.txt and constraints/metadata.json with pip's
# dry-run resolver (no install, no large download): PINS_ARGS=--upgrade moves every pin to the
# newest release that resolves, PINS_ARGS='--upgrade NAME ...' only those. Then `make test`.
PINS_ARGS ?=
pins:
	$(PYTHON) constraints/generate.py $(PINS_ARGS)

clean:
	rm -rf $(VENV) demo_output
