# `make smoke` sets up and runs a real FP8 training job on this CPU machine; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS := torchao,deepspeed,hf,serve,bench,accelerate,tensorboard,wandb,mlflow,data,dev

# pytest keeps the test modules it rewrites for its asserts as bytecode, but only where Python may write bytecode: with
# PYTHONDONTWRITEBYTECODE set (as on these machines) every pytest worker rewrites all of them at each collection
# (benchmarks/results/tooling_notes.md). The caches go to __pycache__ (ignored).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup lint test test-fast test-slow test-matrix test-compat smoke plan-check support-matrix dist bench clean

# Each phase prints "ci-phase: NAME SECONDS" (.ci/phase; with CI_TIMES=FILE also a JSON line there).
PHASE := .ci/phase

setup: $(VENV)/.installed

# torch==2.13.0 first: an unpinned torch would pull the newest CUDA build (GBs) from the registry. --no-compile: pip
# byte-compiles every module it installs (torch, transformers, mlflow, ...), most of them never imported. One process then
# imports what the tests' processes import, which byte-compiles those once (make leaves PYTHONDONTWRITEBYTECODE unset,
# above), so the test workers do not compile the same modules side by side (benchmarks/results/tooling_notes.md).
PIP := $(BIN)/pip install -q --disable-pip-version-check --no-compile
IMPORTED := torch.distributed.checkpoint, torch.distributed.fsdp, torch._inductor.compile_fx, torchao.float8, deepspeed, \
            transformers, launcher.train.main, pytest, xdist, jsonschema, jinja2
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PHASE) setup sh -c '$(PYTHON) -m venv $(VENV) && $(PIP) torch==2.13.0 && $(PIP) -c constraints.txt -e ".[$(EXTRAS)]" \
	  && $(BIN)/python -W ignore -c "import $(IMPORTED)"'
	touch $@

# pyflakes, pycodestyle (lines up to 140) and import order: [tool.ruff] in pyproject.toml.
lint: setup
	$(PHASE) lint $(BIN)/ruff check --no-cache .

# The in-process tests (test-fast), then the multi-process ones, the support matrix's runs apart so that their time shows
# apart. Two multi-process tests side by side (-n 2): each leaves a core half idle while its processes start, import and
# join (6 eager matrix rows: 40.6 s one at a time, 33.3 s two at a time on 2 cores); the SLURM tests share one worker
# (one cluster). --durations: where the time went, in CI's log.
test: test-fast test-slow test-matrix

test-slow: setup
	$(PHASE) slow $(BIN)/python -m pytest -q -m slow --ignore tests/e2e/test_support_matrix.py -n 2 --dist loadgroup --durations=25

test-matrix: setup
	$(PHASE) matrix $(BIN)/python -m pytest -q -m slow tests/e2e/test_support_matrix.py -n 2 --dist loadgroup --durations=25

# Two workers (pytest-xdist): the in-process tests are independent; tests marked with one xdist_group (the support matrix's
# generation, ~15 s a process) run on one worker.
test-fast: setup
	$(PHASE) fast $(BIN)/python -m pytest -q -m "not slow" -n 2 --dist loadgroup --durations=15

# Another torch, in its own venv (.venv-compat-TORCH, made once; constraints.txt less its torch pin), outside CI's
# budget: `make test-compat TORCH=2.11.0` runs the fast tier; E2E=1 adds the e2e runs below (FSDP2 with the float8
# all-gather, DDP and FSDP2 with FP8 gradient reduction, compiled FSDP2); RECORD=1 records the floor's API manifest
# (benchmarks/torch_api.py). A torch newer than the machine's pip cap (/etc/xdg/pip): PIP_CONFIG_FILE=/dev/null make ...
# Results: docs/compatibility.md.
COMPAT_VENV := .venv-compat-$(TORCH)
COMPAT_E2E  := tests/e2e/test_resume.py::test_fsdp2_torchao_fp8_resume_is_bit_identical_and_exports_with_the_documented_one_liner \
               tests/e2e/test_levels.py::test_ddp_fp8_states_and_fp8_reduce_against_fp32_states_and_bf16_reduce \
               tests/e2e/test_levels.py::test_msamp_o3_natively_on_fsdp2_trains_resumes_bit_identically_and_exports_as_trained \
               tests/e2e/test_resume.py::test_a_precision_schedule_resumes_bit_identically_between_two_switches
test-compat:
	@test -n "$(TORCH)" || { echo "error: TORCH is not set; fix: make test-compat TORCH=2.11.0"; exit 2; }
	test -x $(COMPAT_VENV)/bin/fp8launch || { $(PYTHON) -m venv $(COMPAT_VENV) && $(COMPAT_VENV)/bin/pip install -q \
	  --disable-pip-version-check --no-compile torch==$(TORCH) && sed '/^torch==/d' constraints.txt > $(COMPAT_VENV)/constraints.txt \
	  && $(COMPAT_VENV)/bin/pip install -q --disable-pip-version-check --no-compile -c $(COMPAT_VENV)/constraints.txt -e ".[$(EXTRAS)]"; }
	$(COMPAT_VENV)/bin/python -c "import torch, torchao, deepspeed, sys; print('test-compat: torch', torch.__version__, 'torchao', \
	  torchao.__version__, 'deepspeed', deepspeed.__version__, 'python', sys.version.split()[0])"
	$(PHASE) compat-fast $(COMPAT_VENV)/bin/python -m pytest -q -m "not slow" -n 2 --dist loadgroup -p no:cacheprovider
	$(if $(E2E),$(PHASE) compat-e2e $(COMPAT_VENV)/bin/python -m pytest -q -m slow -n 2 --dist loadgroup -p no:cacheprovider $(COMPAT_E2E))
	$(if $(RECORD),$(COMPAT_VENV)/bin/python benchmarks/torch_api.py --record)

smoke: setup
	$(BIN)/fp8launch run specs/cpu-smoke.toml

# docs/support-matrix.md from the schema and the rule table (CI checks it is current).
support-matrix: setup
	$(BIN)/python -m tools.support_matrix --write

plan-check: setup
	$(BIN)/fp8launch plan --check --out specs/generated specs/*.toml

# The wheel to install where there is no clone (a container image, a CI job): fp8launch is on no package index.
dist:
	rm -rf dist build
	$(PYTHON) -m pip wheel -q --disable-pip-version-check --no-deps -w dist .

bench: setup
	$(BIN)/python benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) generated runs .pytest_cache .ruff_cache dist build
