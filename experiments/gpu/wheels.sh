#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels experiments/gpu/requirements.txt lists for the lent GPU machine
# (CPython 3.12, manylinux x86_64; that machine reaches no registry), then pack them into chunks small
# enough for one device call each (the working tree that travels with a call is at most 64 MiB, the
# repository ~10 MiB of it).
#   bash experiments/gpu/wheels.sh            # -> .whl/*.whl, .whl/chunks/wheels.tar.00, .01, ... (git-ignored)
#   CHUNK_MB=40 bash experiments/gpu/wheels.sh
# Then, one device call per chunk, each carrying `.whl/chunks/wheels.tar.NN` (experiments/gpu/setup.sh
# says how), and a last call that installs them: `bash experiments/gpu/setup.sh install`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
OUT=.whl
CHUNK_MB=${CHUNK_MB:-45}
mkdir -p "$OUT"
grep -q '^/.whl/$' .git/info/exclude 2> /dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
while read -r req; do
  [[ -z "$req" || "$req" == \#* ]] && continue
  name=${req%%==*}
  if ls "$OUT" | grep -qi "^$(echo "$name" | tr '-' '_')-${req##*==}-"; then continue; fi
  # a binary wheel for CPython 3.12 on manylinux x86_64, else (a pure-Python sdist) a wheel built here
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d "$OUT" "$req" 2> /dev/null ||
    "$PY" -m pip wheel -q --no-deps -w "$OUT" "$req"
done < experiments/gpu/requirements.txt
rm -rf "$OUT/chunks" && mkdir -p "$OUT/chunks"
tar -C "$OUT" -cf - $(cd "$OUT" && ls *.whl) | split -b "${CHUNK_MB}M" -d - "$OUT/chunks/wheels.tar."
(cd "$OUT/chunks" && sha256sum wheels.tar.* > SHA256SUMS)
ls -la "$OUT/chunks"
echo "$(ls "$OUT"/*.whl | wc -l) wheels, $(du -ch "$OUT"/*.whl | tail -1 | cut -f1) in $(ls "$OUT"/chunks/wheels.tar.* | wc -l) chunks of <= ${CHUNK_MB} MB"
