#!/usr/bin/env bash
# Fixed H in {1, 2, 4, 8, 16} and GRPO against algorithm.H=auto in the paper's small-step regime
# (+experiment=bench_long: n_step 4, n_group 4, ~110-token completions, lr 5e-6), 128 samples per run,
# 3 seeds, on ONE core with one thread; 64 held-out problems evaluated after training (the base model:
# 0.31). Results: experiments/results/auto_h_bench_long/ (bench_rl.md: wall time per sample with the cost
# model's prediction from bench_long_cpu/cost_model.json; auto_h.md and auto_h.png: the verdict and the H
# chosen over training). ~35 minutes per seed on the CPU behind the committed numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORE=${CORE:-0}
export OMP_NUM_THREADS=1
OUT=experiments/results/auto_h_bench_long
ARGS=(+experiment=bench_long eval.at_start=false --samples 128 --h 1 8 auto 4 16 2 --no-trl --no-floors
      --reuse --cost-model experiments/results/bench_long_cpu/cost_model.json
      --lengths-from experiments/results/bench_long_cpu/runs/rapid_h8_s0 --out "$OUT")
for seed in 0 1 2; do   # one seed at a time, so that a stopped benchmark leaves whole seeds
  taskset -c "$CORE" "$PY" tools/bench_rl.py "${ARGS[@]}" --seeds "$seed"
done
"$PY" tools/bench_rl.py "${ARGS[@]}" --seeds 0 1 2 --report-only
"$PY" tools/auto_h_report.py "$OUT"
# the H sweep's statistics over seeds and Table 4's correlations, and the figures (stats/)
"$PY" tools/stats.py "$OUT" --out "$OUT/stats"
"$PY" tools/figures.py "$OUT" --out "$OUT/stats"
