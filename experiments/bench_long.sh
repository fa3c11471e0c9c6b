#!/usr/bin/env bash
# RAPID's speed-up in the paper's small-step regime (its MBPP+ / MiniF2F setting: n_step 4, n_group 4) on
# the long-completion task (task=multistep, ~120-token completions), measured on ONE CPU core with one
# thread (taskset), so that other work on the machine cannot take time from it. Results:
# experiments/results/bench_long_cpu/ (bench_rl.md, runs.csv, cost_model.json, runs/).
#   bash experiments/bench_long.sh            # ~75 minutes on the CPU behind the committed numbers
#   CORE=2 SAMPLES=128 bash experiments/bench_long.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORE=${CORE:-0}
SAMPLES=${SAMPLES:-64}
OUT=${OUT:-experiments/results/bench_long_cpu}
export OMP_NUM_THREADS=1
B=(taskset -c "$CORE" "$PY" tools/bench_rl.py +experiment=bench_long eval.n=16 --samples "$SAMPLES" --out "$OUT" --no-trl)
"${B[@]}" --seeds 0 --h 1 8 16 4 2 --no-grpo                      # every H on seed 0, floors of H = 8
"${B[@]}" --seeds 1 2 --h 1 8 --no-grpo --no-floors --reuse       # PG and H = 8 on two more seeds
"${B[@]}" --seeds 0 1 2 --h 1 8 16 4 2 --no-grpo --no-floors --reuse --report-only   # one table over all runs
