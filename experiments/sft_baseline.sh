#!/usr/bin/env bash
# The SFT baseline as one command: distil the teacher's accepted completions, then fine-tune the
# student on them. Extra arguments are Hydra overrides given to both steps (task=..., model=...).
#   experiments/sft_baseline.sh qwen2.5_1.5b task=math model=qwen2.5_0.5b
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
teacher=${1:?usage: experiments/sft_baseline.sh TEACHER [hydra overrides...]}
shift
out=${OUT:-outputs/sft_$(date +%Y-%m-%d_%H-%M-%S)}
$PY -m rapid.distill distill.teacher="$teacher" hydra.run.dir="$out/distill" "$@"
$PY -m rapid.sft distill.data="$out/distill/distill.jsonl" hydra.run.dir="$out/sft" "$@"
echo "SFT baseline: $out/distill (teacher samples) and $out/sft (student run, summary.json)"
