#!/usr/bin/env bash
# Dustin's verification variants vs dense on one GPU (≤ 2 min; each part time-boxed, results written as they come):
#   OUT=$OUT bash benchmarks/gpu/f15_fidelity.sh [--smoke]
# 1. 1024 of 4,096 tokens (25 %), held-out documents x 128 tokens, teacher-forced: per-layer sets (OPTS) with the
#    confidence valve replayed at several margins (agreement and KV read per margin);
# 2. retrieval at 8,000 tokens, budget 25 %, OPTS: passkey and single needle, 2 samples each, identical to dense?
# 3. the same as 1 with Dustin's one shared set (the paper), for the comparison.
# Reference backend, float32, B = 1 (fidelity, not speed). Smoke: a tiny random model on the CPU, seconds.
set -uo pipefail
OUT=${OUT:-/tmp/f15_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec_cache}
M=/tmp/m/smol.gguf; [ -f "$M" ] || M=smollm2-135m
DEV=cuda; EXTRA=""; PY=${PY:-python3}; SLACK=1  # smoke here: PY=.venv/bin/python
if [ "${1:-}" = "--smoke" ]; then DEV=cpu; EXTRA="--smoke"; SLACK=10; fi  # the busy CPU: longer time boxes
DOCS=stdlib:dataclasses,stdlib:calendar,stdlib:textwrap,pydoc:1/4,pydoc:3/4
OPTS=${OPTS:-'{"layer_share": 1.0}'}
MARGINS=0.1,0.25,0.5,1,2
run() {  # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$((t * SLACK))" $PY benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" "$@" --out "$OUT/$name" \
    > "$OUT/$name.log" 2>&1 || echo "$name: rc $?" | tee -a "$OUT/failures.txt"
}
run layer_4k 50 --context 4096 --budgets 1024 --documents $DOCS --new-tokens 128 --tf-only --margins $MARGINS \
  --options "$OPTS" --budget-s 40
run retrieval_8k 35 --context 8000 --budgets 0.25 --documents '' --tasks passkey,niah_single --samples 2 \
  --options "$OPTS" --budget-s 28
run shared_4k 35 --context 4096 --budgets 1024 --documents $DOCS --new-tokens 128 --tf-only --margins $MARGINS \
  --options '{}' --budget-s 25
tail -n 25 "$OUT"/*/fidelity.md
