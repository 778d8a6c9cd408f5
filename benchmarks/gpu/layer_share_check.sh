#!/usr/bin/env bash
# Per-layer sets (layer_share 0.5) re-measured after a change to how they are picked: teacher-forced agreement and KV
# read at 4k (budget 1024) and 8k (25 %), two runs side by side on one GPU (float32, torch backend, 128 tokens per
# document), <= 5 min on an H200:
#   DOCS4=... DOCS8=... OUT=$OUT bash benchmarks/gpu/layer_share_check.sh
# Writes $OUT/lsc/<run>/{fidelity.json,fidelity.md} and $OUT/lsc/<run>.log, then $OUT/lsc.tgz.
# Smoke (CPU): PY=.venv/bin/python DOCS4=pydoc DOCS8=pydoc OUT=/tmp/lsc bash benchmarks/gpu/layer_share_check.sh --smoke
set -uo pipefail
TF_DIR=lsc; source "$(dirname "$0")/tf_runs.sh" "$@"
: "${DOCS4:?}" "${DOCS8:?}"
run half4k 4096 1024 "$DOCS4" '{"layer_share": 0.5}' 0.5,1 &
run half8k 8000 0.25 "$DOCS8" '{"layer_share": 0.5}' 0.5,1 &
wait
tf_finish "^\\| (0\\.25|1024) \\|"
