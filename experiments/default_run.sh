#!/usr/bin/env bash
# The README's "default run" numbers: `python -m rapid.train` with no arguments (RAPID, H = 8, on
# held-out-split arithmetic with SmolLM2-135M-Instruct, CPU, offline), seeds given as arguments.
# Writes experiments/results/default_run/seed<k>/{config.yaml,meta.json,metrics.jsonl,summary.json}.
# OVERRIDES="optim.schedule=constant" runs a variant into experiments/results/default_run_<overrides>/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
for seed in "${@:-0}"; do
  run=outputs/default_run_seed${seed}
  rm -rf "$run"
  $PY -m rapid.train seed="$seed" logger.progress=false hydra.run.dir="$run" ${OVERRIDES:-}
  out=experiments/results/default_run${OVERRIDES:+_${OVERRIDES//[^a-zA-Z0-9]/_}}/seed${seed}
  mkdir -p "$out"
  cp "$run"/config.yaml "$run"/meta.json "$run"/metrics.jsonl "$run"/summary.json "$out"/
done
results=experiments/results/default_run${OVERRIDES:+_${OVERRIDES//[^a-zA-Z0-9]/_}}
$PY tools/summarize.py "$results"/seed* --keys seed algorithm.H optim.schedule | tee "$results"/table.md
