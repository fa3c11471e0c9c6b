#!/usr/bin/env bash
# RAPID H = 8 against PG (RAPID H = 1) with enough seeds and held-out problems to tell them apart, in the
# regime where RAPID saves wall time on CPU: the paper's small-step regime (+experiment=bench_long: n_step 4,
# n_group 4, ~110-token completions, lr 5e-6), where H = 8 takes ~0.5x PG's training-loop time per sample
# (experiments/results/bench_long_curves_avx2). Each run trains on SAMPLES samples and is evaluated greedily
# on all 200 held-out problems every EVAL_EVERY samples (evaluation is not part of the training-loop time).
#   bash experiments/rapid_vs_pg_power.sh     # (make rapid-vs-pg-power) ~50 minutes per seed pair, one core
#   POWER_SEEDS="0 1 2 3 4" bash experiments/rapid_vs_pg_power.sh   # the seeds (default 0-7), in this order
# One run at a time on one core (CORE, default 1; nice 10; one thread), seed-interleaved (PG s0, RAPID s0,
# PG s1, ...), so that the runs finished at any moment are a balanced, paired comparison. Resumable: a run
# with a summary.json is skipped, a run interrupted after a checkpoint (one every EVAL_EVERY samples)
# continues from it, and any other partial run starts again. The base model's accuracy is measured once,
# by the seed-0 runs (greedy decoding of the same weights: every seed's round-0 evaluation is the same).
# Then tools/stats.py --power writes runs.csv, power.md and power.png into OUT (any time: over the runs
# finished so far).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORE=${CORE:-1}
POWER_SEEDS=${POWER_SEEDS:-0 1 2 3 4 5 6 7}
read -r -a SEEDS <<<"${POWER_SEEDS//,/ }"
RAPID_H=${RAPID_H:-8}
SAMPLES=${SAMPLES:-256}
EVAL_EVERY=${EVAL_EVERY:-64}
OUT=${OUT:-experiments/results/rapid_vs_pg_power}
N_STEP=4 # +experiment=bench_long's algorithm.n_step
export OMP_NUM_THREADS=1

run() { # $1: H, $2: seed
  local h=$1 seed=$2 per_round=$(($1 * N_STEP))
  local dir="$OUT/runs/rapid_h${h}_s$seed"
  if [ -f "$dir/summary.json" ]; then
    echo "$(date -u +%T) done already: $dir"
    return 0
  fi
  local args
  if compgen -G "$dir/checkpoints/round_*/state.pt" >/dev/null; then
    args=(resume="$dir" hydra.run.dir="$dir")
    echo "$(date -u +%T) resuming $dir"
  else
    rm -rf "$dir"
    args=(
      +experiment=bench_long algorithm=rapid "algorithm.H=$h" seed="$seed"
      rounds=$((SAMPLES / per_round)) eval.n=null eval.every=$((EVAL_EVERY / per_round))
      eval.at_start=$([ "$seed" = 0 ] && echo true || echo false)
      ckpt.every=$((EVAL_EVERY / per_round)) ckpt.keep=1 logger.progress=false hydra.run.dir="$dir"
    )
    echo "$(date -u +%T) starting $dir"
  fi
  mkdir -p "$OUT/runs"
  taskset -c "$CORE" nice -n 10 "$PY" -m rapid.train "${args[@]}" >>"$OUT/runs/rapid_h${h}_s$seed.log" 2>&1 ||
    echo "$(date -u +%T) FAILED: $dir (see $OUT/runs/rapid_h${h}_s$seed.log)"
  if [ -f "$dir/summary.json" ]; then
    rm -rf "$dir/checkpoints" # ~1.6 GB; the final model is not needed here
    sed -i "s#$PWD/##g" "$dir"/meta*.json # the entry point's path, relative to the repository
    echo "$(date -u +%T) finished $dir"
  fi
  return 0
}

for seed in "${SEEDS[@]}"; do
  run 1 "$seed"
  run "$RAPID_H" "$seed"
done
echo "$(date -u +%T) runs done"
"$PY" tools/stats.py --power "$OUT" --power-h 1 "$RAPID_H"
