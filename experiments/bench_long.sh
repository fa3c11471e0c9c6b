#!/usr/bin/env bash
# RAPID's speed-up in the paper's small-step regime (its MBPP+ / MiniF2F setting: n_step 4, n_group 4) on
# the long-completion task (+experiment=bench_long: task=multistep, ~110-token completions), measured on
# ONE CPU core with one thread (taskset), so that other work on the machine cannot take time from it.
#   bash experiments/bench_long.sh                 # ~70 minutes on the CPU behind the committed numbers
#   CORE=3 bash experiments/bench_long.sh          # another core
# Results (each folder: bench_rl.md, runs.csv, runs/<method>_s<seed>/):
#   experiments/results/bench_long_cpu/            throughput: every H on seed 0 (+ floors of H = 8 and the
#                                                  cost model), PG and H = 8 on seeds 1 and 2; 64 samples each
#   experiments/results/bench_long_cpu_nstep8/     the same at n_step 8 (PG and H = 8, seed 0)
#   experiments/results/bench_long_cpu_curves/     learning: PG and H = 8 to 384 samples, evaluated every 128
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORE=${CORE:-0}
export OMP_NUM_THREADS=1
BENCH=(taskset -c "$CORE" "$PY" tools/bench_rl.py +experiment=bench_long --no-trl --reuse)
# Throughput: 64 samples per run (16 PG steps), 16 held-out problems before and after. These runs used
# the default run's lr 2e-5 (it breaks the model here within ~10 steps; the time per sample does not
# depend on it beyond the completion lengths, which each run's prediction takes into account).
T=(eval.n=16 optim.lr=2e-5 --samples 64 --out experiments/results/bench_long_cpu)
"${BENCH[@]}" "${T[@]}" --seeds 0 --h 1 8 16 4 2 --no-grpo
"${BENCH[@]}" "${T[@]}" --seeds 1 2 --h 1 8 --no-floors --no-grpo
"${BENCH[@]}" "${T[@]}" --seeds 0 --h 1 --no-floors                  # GRPO (beside PG) on seed 0
"${BENCH[@]}" eval.n=16 optim.lr=2e-5 algorithm.n_step=8 --samples 64 --seeds 0 --h 1 8 --no-floors --no-grpo \
    --out experiments/results/bench_long_cpu_nstep8 --cost-model experiments/results/bench_long_cpu/cost_model.json
# Learning: lr 5e-6 (the experiment's), 384 samples, 64 held-out problems every 128 samples.
"${BENCH[@]}" --samples 384 --eval-every-samples 128 --seeds 0 --h 1 8 --no-floors --no-grpo --no-cost-model \
    --out experiments/results/bench_long_cpu_curves
# One table over all the throughput runs.
"${BENCH[@]}" "${T[@]}" --seeds 0 1 2 --h 1 8 16 4 2 --no-floors --report-only
