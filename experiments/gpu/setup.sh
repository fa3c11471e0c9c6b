#!/usr/bin/env bash
# Set up rapid on the lent GPU machine (Python 3.12 with torch 2.11.0+cu130 and transformers in its image,
# no registry reachable) from the wheel chunks experiments/gpu/wheels.sh made here. The machine stays
# warm between calls for a short while, so the chunks arrive one call each and wait in $STAGE:
#
#   bash experiments/gpu/setup.sh stage            # in every call: copy the carried chunks to $STAGE
#   bash experiments/gpu/setup.sh install          # once all are there: check, unpack, pip install
#   source experiments/gpu/setup.sh env            # in each later call: PYTHONPATH and the checks' settings
#
# A call carries `.whl/chunks/wheels.tar.NN` (one or two of them: 64 MiB a call with the repository) and
# `.whl/chunks/SHA256SUMS`. `install` verifies the chunks against SHA256SUMS, installs every wheel with
# --no-deps into $SITE, installs rapid itself (editable, no dependencies), and prints what imports.
set -uo pipefail
STAGE=${STAGE:-/tmp/rapid-wheels}
SITE=${SITE:-/tmp/rapid-site}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY=${PY:-python3}

case "${1:-}" in
stage)
  mkdir -p "$STAGE"
  cp -v "$ROOT"/.whl/chunks/wheels.tar.* "$ROOT"/.whl/chunks/SHA256SUMS "$STAGE"/ 2> /dev/null
  echo "staged: $(ls "$STAGE" | tr '\n' ' ')"
  ;;
install)
  cd "$STAGE" || exit 1
  sha256sum -c SHA256SUMS || { echo "a chunk is missing or damaged: stage it again"; exit 1; }
  mkdir -p wheels && cat wheels.tar.* | tar -x -C wheels || exit 1
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" wheels/*.whl || exit 1
  export PYTHONPATH="$SITE:$ROOT"
  "$PY" - << 'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for name in ("vllm", "hydra", "omegaconf", "math_verify", "rapid.train", "rapid.sampler"):
    try:
        m = importlib.import_module(name)
        print("ok     ", name, getattr(m, "__version__", ""))
    except Exception as e:  # what is missing is what the next wheel set must add
        print("FAILED ", name, type(e).__name__, e)
EOF
  ;;
env)
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  ;;
*)
  echo "usage: experiments/gpu/setup.sh stage | install | env (see its header)"
  exit 2
  ;;
esac
