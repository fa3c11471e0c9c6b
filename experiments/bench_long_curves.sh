#!/usr/bin/env bash
# RAPID against PG and GRPO in the paper's small-step regime (+experiment=bench_long: n_step 4, n_group 4,
# ~110-token completions, lr 5e-6) on three seeds: held-out accuracy every 64 samples to 256, so that
# accuracy can be read against training-loop wall time; plus TRL's GRPOTrainer beside PG (one seed, 64
# samples: TRL is slow here) and PG / RAPID H = 8 at n_step 8 (three seeds, 64 samples).
#   bash experiments/bench_long_curves.sh          # ~80 minutes on the CPU behind the committed numbers
# Two single-thread workers, one pinned to each core (CORES="0 1"), take the runs from one queue, so
# every run shares the machine with one other run for the whole benchmark (ratios are measured under the
# same load; absolute times are those of a loaded machine). Results, each folder with bench_rl.md,
# runs.csv and runs/<method>_s<seed>/:
#   experiments/results/bench_long_curves/         PG, RAPID H = 8, GRPO: seeds 0-2, 256 samples, figures
#   experiments/results/bench_long_trl/            PG and TRL GRPOTrainer: seed 0, 64 samples
#   experiments/results/bench_long_nstep8/         PG and RAPID H = 8 at n_step 8: seeds 0-2, 64 samples
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
read -r -a CORES <<<"${CORES:-0 1}"
export OMP_NUM_THREADS=1
R=experiments/results
LENGTHS=(--lengths-from "$R/bench_long_cpu/runs/rapid_h8_s0")  # the completion lengths the cost model draws
CURVES=(+experiment=bench_long --samples 256 --eval-every-samples 64 --out "$R/bench_long_curves")
TRL=(+experiment=bench_long --samples 64 --out "$R/bench_long_trl")
NSTEP8=(+experiment=bench_long algorithm.n_step=8 eval.n=16 --samples 64 --out "$R/bench_long_nstep8")
COMMON=(--no-trl --no-grpo --no-floors --reuse)

QUEUE=$(mktemp)
trap 'rm -f "$QUEUE" "$QUEUE.lock"' EXIT
{   # longest first, one run (method, seed) per line
  for seed in 0 1 2; do
    echo "${CURVES[*]} --h --seeds $seed --no-trl --no-floors --reuse --no-cost-model"   # GRPO
    echo "${CURVES[*]} --h 1 --seeds $seed ${COMMON[*]} --no-cost-model"
    echo "${CURVES[*]} --h 8 --seeds $seed ${COMMON[*]} --no-cost-model"
  done
  # the cost model measured under the runs' load, at seed 0's completion lengths (<out>/cost_model.json)
  echo "${CURVES[*]} --h 1 8 --seeds 0 ${COMMON[*]} --report-only"
  echo "${TRL[*]} --h --seeds 0 --no-grpo --no-floors --reuse --no-cost-model"            # TRL
  echo "${TRL[*]} --h 1 --seeds 0 ${COMMON[*]} --no-cost-model"
  for seed in 0 1 2; do
    echo "${NSTEP8[*]} --h 1 --seeds $seed ${COMMON[*]} --no-cost-model"
    echo "${NSTEP8[*]} --h 8 --seeds $seed ${COMMON[*]} --no-cost-model"
  done
} >"$QUEUE"

worker() {  # $1: the core; takes the queue's first line until it is empty
  local job
  while true; do
    job=$(flock "$QUEUE.lock" sh -c 'head -n 1 "$1" && sed -i 1d "$1"' _ "$QUEUE")
    [ -n "$job" ] || return 0
    echo "[core $1] $(date +%T) $job"
    # shellcheck disable=SC2086  # the job line is a list of words
    taskset -c "$1" "$PY" tools/bench_rl.py $job >/dev/null || echo "[core $1] FAILED: $job"
  done
}
for core in "${CORES[@]}"; do worker "$core" & done
wait

# The tables over every seed, with the cost model's predictions, and the figures.
CM=(--cost-model "$R/bench_long_curves/cost_model.json" "${LENGTHS[@]}")
"$PY" tools/bench_rl.py "${CURVES[@]}" --h 1 8 --seeds 0 1 2 --no-trl --no-floors --report-only "${CM[@]}"
"$PY" tools/bench_rl.py "${TRL[@]}" --h 1 --seeds 0 --no-grpo --no-floors --report-only "${CM[@]}"
"$PY" tools/bench_rl.py "${NSTEP8[@]}" --h 1 8 --seeds 0 1 2 "${COMMON[@]}" --report-only "${CM[@]}"
"$PY" tools/figures.py "$R/bench_long_curves" --out "$R/bench_long_curves"
