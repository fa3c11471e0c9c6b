#!/usr/bin/env bash
# RAPID against PG and GRPO in the paper's small-step regime (+experiment=bench_long: n_step 4, n_group 4,
# ~110-token completions, lr 5e-6) on three seeds: held-out accuracy every 64 samples to 256, so that
# accuracy can be read against training-loop wall time; plus TRL's GRPOTrainer beside PG (one seed, 64
# samples: TRL is slow here) and PG / RAPID H = 8 at n_step 8 (three seeds, 64 samples).
#   bash experiments/bench_long_curves.sh          # ~80 minutes on the AVX-512 CPU behind bench_long_cpu
#   PARTS=curves GRPO=0 TAG=_avx2 bash experiments/bench_long_curves.sh
#                                                  # PG and RAPID H = 8 curves only, into *_avx2 folders
#                                                  # (~100 minutes on an AVX2-only EPYC)
# PARTS: any of "curves trl nstep8" (default: all three); GRPO=0 leaves GRPO out of the curves; TAG is
# appended to every output folder (results of CPUs with other vector extensions kept apart).
# Two single-thread workers, one pinned to each core (CORES="0 1"), take the runs from one queue, so
# every run shares the machine with one other run for the whole benchmark (ratios are measured under the
# same load; absolute times are those of a loaded machine). Results, each folder with bench_rl.md,
# runs.csv and runs/<method>_s<seed>/:
#   experiments/results/bench_long_curves$TAG/     PG, RAPID H = 8, GRPO: seeds 0-2, 256 samples, figures,
#                                                  and the cost model measured under the same load
#   experiments/results/bench_long_trl$TAG/        PG and TRL GRPOTrainer: seed 0, 64 samples
#   experiments/results/bench_long_nstep8$TAG/     PG and RAPID H = 8 at n_step 8: seeds 0-2, 64 samples
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
read -r -a CORES <<<"${CORES:-0 1}"
PARTS=${PARTS:-curves trl nstep8}
GRPO=${GRPO:-1}
TAG=${TAG:-}
export OMP_NUM_THREADS=1
R=experiments/results
part() { [[ " $PARTS " == *" $1 "* ]]; }
CURVES=(+experiment=bench_long --samples 256 --eval-every-samples 64 --out "$R/bench_long_curves$TAG")
TRL=(+experiment=bench_long --samples 64 --out "$R/bench_long_trl$TAG")
NSTEP8=(+experiment=bench_long algorithm.n_step=8 eval.n=16 --samples 64 --out "$R/bench_long_nstep8$TAG")
COMMON=(--no-trl --no-grpo --no-floors --reuse)
# the completion lengths the cost model draws (a run that logged its rollouts: its floors were measured)
LENGTHS=(--lengths-from "$R/bench_long_cpu/runs/rapid_h8_s0")
CM=(--cost-model "$R/bench_long_curves$TAG/cost_model.json" "${LENGTHS[@]}")

QUEUE=$(mktemp)
trap 'rm -f "$QUEUE" "$QUEUE.lock"' EXIT
{   # longest first, one run (method, seed) per line
  if part curves; then
    for seed in 0 1 2; do
      [ "$GRPO" = 1 ] && echo "${CURVES[*]} --h --seeds $seed --no-trl --no-floors --reuse --no-cost-model"
      echo "${CURVES[*]} --h 1 --seeds $seed ${COMMON[*]} --no-cost-model"
    done
    for seed in 0 1 2; do echo "${CURVES[*]} --h 8 --seeds $seed ${COMMON[*]} --no-cost-model"; done
    # the cost model measured under the runs' load, at seed 0's completion lengths (<out>/cost_model.json)
    echo "${CURVES[*]} --h 1 8 --seeds 0 ${COMMON[*]} --report-only"
  fi
  if part trl; then
    echo "${TRL[*]} --h --seeds 0 --no-grpo --no-floors --reuse --no-cost-model"            # TRL
    echo "${TRL[*]} --h 1 --seeds 0 ${COMMON[*]} --no-cost-model"
  fi
  if part nstep8; then
    for seed in 0 1 2; do
      echo "${NSTEP8[*]} --h 1 --seeds $seed ${COMMON[*]} --no-cost-model"
      echo "${NSTEP8[*]} --h 8 --seeds $seed ${COMMON[*]} --no-cost-model"
    done
  fi
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
echo "$(date +%T) runs done"

# The tables over every seed, with the cost model's predictions, and the figures.
if part curves; then
  H=(--h 1 8); [ "$GRPO" = 1 ] || H+=(--no-grpo)
  "$PY" tools/bench_rl.py "${CURVES[@]}" "${H[@]}" --seeds 0 1 2 --no-trl --no-floors --report-only "${CM[@]}"
  "$PY" tools/figures.py "$R/bench_long_curves$TAG" --out "$R/bench_long_curves$TAG"
fi
if part trl; then
  "$PY" tools/bench_rl.py "${TRL[@]}" --h 1 --seeds 0 --no-grpo --no-floors --report-only "${CM[@]}"
fi
if part nstep8; then
  "$PY" tools/bench_rl.py "${NSTEP8[@]}" --h 1 8 --seeds 0 1 2 "${COMMON[@]}" --report-only "${CM[@]}"
fi
