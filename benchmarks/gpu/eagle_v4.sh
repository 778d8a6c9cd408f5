#!/usr/bin/env bash
# EAGLE recipe v4 (the target's own greedy continuations in the training rows) against a v3 control, trained side
# by side on one GPU (each run is launch-bound, not compute-bound: three share an H200 without slowing much).
#   GGUF=/tmp/m/smol.gguf MINUTES=8 bash benchmarks/gpu/eagle_v4.sh      # heads + logs under $OUT
# Variants: "NAME RECIPE SELFGEN" (SELFGEN "-": the recipe's own).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GGUF:?path of the embedded model GGUF file}" "${OUT:?an output folder}"
MINUTES=${MINUTES:-8}
VARIANTS=${VARIANTS:-"a:v4:512,64 b:v4:256,64 c:v3:-"}
pids=()
for v in $VARIANTS; do
  IFS=: read -r name recipe sg <<<"$v"
  extra=()
  [ "$sg" != "-" ] && extra=(--selfgen "$sg")
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
