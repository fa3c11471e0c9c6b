#!/usr/bin/env bash
# The cost model of the small-step benchmark (experiments/bench_long.sh: task=multistep, n_step 4, n_group 4,
# SmolLM2-135M fp32, one CPU core, one thread): measured once with ~120-token completions (the runs' mean),
# timed by this process's CPU time so that other work on a shared machine does not inflate it; then the
# predicted seconds per 1,000 samples for n_step 4 and 8 and two hypothetical profiles (training 2x faster,
# e.g. bf16; a flat decoding step up to 256 sequences, the memory-bound shape of a GPU's curve).
# Results: experiments/results/cost_model_bench_long_cpu/ (cost_model.json, predicted*.md / .json).
#   bash experiments/cost_model_bench_long.sh          # ~10 minutes on an idle core
#   CORE=1 bash experiments/cost_model_bench_long.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORE=${CORE:-0}
OUT=${OUT:-experiments/results/cost_model_bench_long_cpu}
export OMP_NUM_THREADS=1
CM="$OUT/cost_model.json"
[ -f "$CM" ] || taskset -c "$CORE" "$PY" tools/cost_model.py +experiment=bench_long --completion-len 120 \
    --sizes 1 2 4 8 16 32 64 --h 1 2 4 8 16 --clock cpu --out "$CM"
P=("$PY" tools/cost_model.py --predict "$CM" --n-step 4 8 --h 1 2 4 8 16)
"${P[@]}" --out "$OUT/predicted.json"
"${P[@]}" --train-scale 0.5 --out "$OUT/predicted_train_x0.5.json"
# a flat decoding step at the measured cost of one sequence's step (step_s at 1 sequence in cost_model.json)
STEP=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['generation']['step_s'][0])" "$CM")
"${P[@]}" --decode-step-s "$STEP" --decode-saturation 256 --out "$OUT/predicted_flat_decode.json"
