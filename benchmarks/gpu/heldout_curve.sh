#!/usr/bin/env bash
# Dustin's teacher-forced agreement vs KV read on documents of your choice, four runs side by side on one GPU
# (each its own process, float32, torch backend, 128 tokens per document), whole script <= 5 min on an H200:
#   DOCS4=a.txt,b.py,... DOCS8=c.txt,d.py,... OUT=$OUT bash benchmarks/gpu/heldout_curve.sh
# (1) 4k, budgets 1024 and 2048 of 4,096, default options, valve margins replayed (the curve);
# (2) 4k, budget 1024, the confidence valve really on (margin=1.0; the replay is optimistic);
# (3) 4k, budget 1024, per-layer sets on half the slots (layer_share=0.5), margins replayed;
# (4) 8k, budget 25 % of 8,000, default options, margins replayed.
# Writes $OUT/hc/<run>/{fidelity.json,fidelity.md} and $OUT/hc/<run>.log, then $OUT/hc.tgz.
# Smoke (CPU, tiny random model): PY=.venv/bin/python DOCS4=pydoc DOCS8=pydoc OUT=/tmp/hc bash benchmarks/gpu/heldout_curve.sh --smoke
set -uo pipefail
TF_DIR=hc; source "$(dirname "$0")/tf_runs.sh" "$@"
C4=4096; C8=8000; B4=1024; B4b=2048
: "${DOCS4:?DOCS4=comma-separated files (4k runs)}" "${DOCS8:?DOCS8=comma-separated files (8k runs)}"
run curve4k $C4 "$B4,$B4b" "$DOCS4" '{}' 0.25,0.5,1,1.5 &
run valve4k $C4 $B4 "$DOCS4" '{"margin": 1.0}' &
run layers4k $C4 $B4 "$DOCS4" '{"layer_share": 0.5}' 0.5,1 &
run curve8k $C8 0.25 "$DOCS8" '{}' 0.25,0.5,1 &
wait
tf_finish "^\\| (0\\.25|$B4|$B4b|[0-9.]+ \\|)"
