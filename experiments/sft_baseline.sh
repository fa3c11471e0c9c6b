#!/usr/bin/env bash
# The SFT baseline as one command: `rapid.train algorithm=sft` distils the teacher's accepted completions
# (<run>/distill), then fine-tunes the student on them (<run>/sft). Extra arguments are Hydra overrides.
#   experiments/sft_baseline.sh qwen2.5_1.5b +experiment=math_h8 model=qwen2.5_0.5b
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
teacher=${1:?usage: experiments/sft_baseline.sh TEACHER [hydra overrides...]}
shift
exec $PY -m rapid.train algorithm=sft algorithm.distill.teacher="$teacher" "$@"
