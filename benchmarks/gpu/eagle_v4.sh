#!/usr/bin/env bash
# EAGLE training recipes on the GPU (v4: the target's own greedy continuations in the training rows; v5: fused
# features of several target layers), one head per variant.
#   GGUF=/tmp/m/smol.gguf MINUTES=8 bash benchmarks/gpu/eagle_v4.sh      # heads + logs under $OUT
# Variants: "NAME:RECIPE:SELFGEN[:INIT]" (SELFGEN "-": the recipe's own; INIT: an EAGLE artifact or "shipped" to
# start from, e.g. "w:v5:-:shipped"). Run one variant per call on one GPU: side by side each runs ~3.4x slower.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GGUF:?path of the embedded model GGUF file}" "${OUT:?an output folder}"
MINUTES=${MINUTES:-8}
VARIANTS=${VARIANTS:-"a:v4:512,64 b:v4:256,64 c:v3:-"}
pids=()
for v in $VARIANTS; do
  IFS=: read -r name recipe sg init <<<"$v"
  extra=()
  [ "$sg" != "-" ] && extra=(--selfgen "$sg")
  [ -n "${init:-}" ] && extra+=(--init "$init")
  mkdir -p "/tmp/eagle_v4/$name"
  python3 benchmarks/gpu/dustin_eagle.py --gguf "$GGUF" --out "/tmp/eagle_v4/$name" --budget-s $(( ${MINUTES%.*} * 60 + 60 )) \
    --train-minutes "$MINUTES" --train-tokens 8000000 --recipe "$recipe" "${extra[@]}" --parts train \
    >"/tmp/eagle_v4/$name/log.txt" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for v in $VARIANTS; do
  name=${v%%:*}
  cp "/tmp/eagle_v4/$name/smollm2-135m-eagle-gpu.safetensors" "$OUT/$name.safetensors" 2>/dev/null || echo "no head for $name"
  tar -C "/tmp/eagle_v4/$name" -czf "$OUT/$name.tgz" --exclude='*.safetensors' .
  grep -E "selfgen|collected|epoch" "/tmp/eagle_v4/$name/log.txt" | tail -4
done
exit $rc
