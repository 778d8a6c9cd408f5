#!/usr/bin/env bash
# Per-layer sets (layer_share) against Dustin's one shared set: teacher-forced agreement vs KV read, six runs side by
# side on one GPU (float32, torch backend, 128 tokens per document), whole script <= 5 min on an H200:
#   DEV4=... DOCS4=... DOCS8=... OUT=$OUT bash benchmarks/gpu/layer_share_sweep.sh
# DEV4: documents to choose a setting on (4k, budget 1024: shared, layer_share 0.5 and 1.0);
# DOCS4 / DOCS8: documents to check it on (4k: layer_share 1.0, and 0.5 with the valve really on at margin 0.5;
# 8k, budget 25 %: layer_share 0.5). Margins are replayed from each run's logged margins.
# Writes $OUT/ls/<run>/{fidelity.json,fidelity.md} and $OUT/ls/<run>.log, then $OUT/ls.tgz.
# Smoke (CPU): PY=.venv/bin/python DEV4=pydoc DOCS4=pydoc DOCS8=pydoc OUT=/tmp/ls bash benchmarks/gpu/layer_share_sweep.sh --smoke
set -uo pipefail
TF_DIR=ls; source "$(dirname "$0")/tf_runs.sh" "$@"
: "${DEV4:?}" "${DOCS4:?}" "${DOCS8:?}"
run dev_shared 4096 1024 "$DEV4" '{}' 0.5,1 &
run dev_half 4096 1024 "$DEV4" '{"layer_share": 0.5}' 0.5,1 &
run dev_all 4096 1024 "$DEV4" '{"layer_share": 1.0}' 0.5,1 &
run eval_all4k 4096 1024 "$DOCS4" '{"layer_share": 1.0}' 0.5,1 &
run eval_half_valve4k 4096 1024 "$DOCS4" '{"layer_share": 0.5, "margin": 0.5}' &
run eval_half8k 8000 0.25 "$DOCS8" '{"layer_share": 0.5}' 0.5,1 &
wait
tf_finish "^\\| (0\\.25|1024) \\|"
