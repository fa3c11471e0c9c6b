#!/usr/bin/env bash
# Each off-policy estimator of rapid/estimators.py at RAPID's H = 8 in the real loop, on the setting of the
# committed CPU ablations (experiments/ablations_cpu.sh, experiments/results/ablations_cpu/): held-out
# arithmetic, SmolLM2-135M-Instruct, n_step 32, n_group 8, lr 2e-5, 1,024 samples per run, evaluated once
# after training on the 200 held-out problems, seeds 0 1 2 (SEEDS="0 1 2 3 4" where differences are near
# the noise). RAPID H = 8 runs again here, on the same core, so that the time per sample is comparable.
#   bash experiments/estimators_cpu.sh                 # ~5-8 minutes per run on one core of an AVX-512 EPYC
#   CORE=1 bash experiments/estimators_cpu.sh & CORE=0 ORDER=reverse bash experiments/estimators_cpu.sh
#   SEEDS="3 4" bash experiments/estimators_cpu.sh     # more seeds later; finished runs are kept
#   DIAGNOSTICS=1 CORE=0 bash experiments/estimators_cpu.sh   # CISPO at H = 1 and with its weight capped at 1
#   SEEDS="3 4" ONLY="rapid rapid_mask dr_grpo" bash experiments/estimators_cpu.sh   # only these algorithms
#   EXTRA="+experiment=smoke samples=128 sampler=hf" OUT=/tmp/est/runs bash experiments/estimators_cpu.sh  # a dry run
# Resumable: a run's directory is its lock and its record; a run that finished (summary.json) is skipped,
# one that was interrupted (a directory without summary.json and no live worker) is started again with
# RERUN_UNFINISHED=1. Runs land in $OUT/<override>,seed=<s>; then runs.csv + stats.md (95% bootstrap
# intervals over seeds, paired tests against RAPID with Holm's correction, tools/stats.py) and estimators.md
# (clip / mask / taper fractions, optimizer steps, time per sample). Every run generates 1,024 samples
# (DAPO's dynamic sampling included: its extra draws stop at the budget).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CORE=${CORE:-0}
ORDER=${ORDER:-forward}
SEEDS=${SEEDS:-0 1 2}
OUT=${OUT:-experiments/results/estimators_cpu/runs}
export OMP_NUM_THREADS=1
CONFIGS=(
  "algorithm=rapid"                              # RAPID H = 8 (IW-GRPG, eta 2)
  "algorithm=rapid_mask"                         # masked instead of truncated IS
  "algorithm=cispo"
  "algorithm=gspo"
  "algorithm=dr_grpo"
  "algorithm=topr"
  "algorithm=grpo_multistep"                     # GRPO at H = 8, KL 0.04 (as in the ablations)
  "algorithm=dapo algorithm.H=8"                 # DAPO at H = 8 (dynamic sampling, overlong penalty)
)
# DIAGNOSTICS=1: instead, the runs behind the README's reading of CISPO at H = 8 (seed 0): CISPO on-policy
# (H = 1), and at H = 8 with its weight capped at 1 (no token is up-weighted)
if [ "${DIAGNOSTICS:-0}" = 1 ]; then
  CONFIGS=("algorithm=cispo algorithm.H=1" "algorithm=cispo algorithm.eps_high=0.000001")
  SEEDS=0
fi
if [ -n "${ONLY:-}" ]; then # keep the configurations whose algorithm= is one of ONLY's names
  KEEP=()
  for c in "${CONFIGS[@]}"; do
    a=${c%% *} && [[ " $ONLY " == *" ${a#algorithm=} "* ]] && KEEP+=("$c")
  done
  CONFIGS=("${KEEP[@]}")
fi
Q=()
for s in $SEEDS; do
  for c in "${CONFIGS[@]}"; do Q+=("$s|${c// /,}|$c"); done
done
if [ "$ORDER" = reverse ]; then R=(); for ((i = ${#Q[@]} - 1; i >= 0; i--)); do R+=("${Q[$i]}"); done; Q=("${R[@]}"); fi
mkdir -p "$OUT"
for item in "${Q[@]}"; do
  IFS='|' read -r s name overrides <<< "$item"
  d="$OUT/$name,seed=$s"
  [ -f "$d/summary.json" ] && continue                                  # finished
  if ! mkdir "$d" 2> /dev/null; then                                    # taken by a worker, or interrupted
    [ "${RERUN_UNFINISHED:-0}" = 1 ] || continue
    rm -rf "$d" && mkdir "$d" || continue
  fi
  # shellcheck disable=SC2086
  taskset -c "$CORE" "$PY" -m rapid.train samples=1024 eval.every=0 eval.at_start=false logger.progress=false \
    ckpt.every=0 seed="$s" $overrides ${EXTRA:-} "hydra.run.dir='$d'" > "$d.log" 2>&1
  rm -rf "$d/checkpoints"   # the final checkpoint (~1.6 GB) is not needed for the table
done
"$PY" tools/stats.py "$OUT" --out "$OUT/.." --versus algorithm=rapid
# per configuration: the fraction of records or tokens each estimator clips, masks or tapers, the optimizer
# steps taken (summary.json; a fixed-H run without it: rounds x H x num_iterations) and the wall time per
# generated sample (the sum of time/round_s over 1,024 samples), mean over its seeds
"$PY" - "$OUT" > "$OUT/../estimators.md" << 'PYEOF'
import json, statistics, sys
from pathlib import Path

import yaml

from rapid.logger import read_metrics  # today's names, whichever a run was written with

runs = {}
for d in sorted(Path(sys.argv[1]).glob("*,seed=*")):
    rows = read_metrics(d) if (d / "metrics.jsonl").exists() else []
    train = [r for r in rows if "time/round_s" in r]
    if not (d / "summary.json").exists() or not train:
        continue
    frac = [r.get("iw/clip_frac", r.get("loss/clip_frac", r.get("loss/trunc_frac"))) for r in train]
    frac = [f for f in frac if f is not None]
    a = yaml.safe_load((d / "config.yaml").read_text())["algorithm"]
    steps = json.loads((d / "summary.json").read_text()).get("optimizer_steps") or len(train) * a["H"] * a["num_iterations"]
    runs.setdefault(d.name.rsplit(",seed=", 1)[0], []).append(
        (statistics.mean(frac) if frac else float("nan"), steps, sum(r["time/round_s"] for r in train) / train[-1]["progress/samples"])
    )
print("| configuration | seeds | clip / mask / taper fraction | optimizer steps | wall s per sample |")
print("|---|---:|---:|---:|---:|")
for name, xs in sorted(runs.items()):
    m = [statistics.mean(x[i] for x in xs) for i in range(3)]
    print(f"| {name} | {len(xs)} | {m[0]:.3f} | {m[1]:.1f} | {m[2]:.3f} |")
PYEOF
