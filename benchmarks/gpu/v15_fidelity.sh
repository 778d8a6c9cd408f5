#!/usr/bin/env bash
# Dustin's sparse verification vs dense at 8k on one GPU (≈ 2 min; the CPU cannot finish 8k):
#   OUT=$OUT bash benchmarks/gpu/v15_fidelity.sh [--smoke]
# 1. retrieval at 8,000 tokens, budget 2048 (25 %): passkey, single and multi-key needle, 2 samples each,
#    every answer and whether the output is identical to dense;
# 2. agreement at 8,000 tokens, 5 held-out documents x 128 tokens, budgets 25 % and 1024: teacher-forced and
#    free-running agreement, TV, τ, KV read, tokens/s (reference backend, float32, B = 1);
# 3. the trade-off curve at 4,096 tokens: budgets 6.25 %, 12.5 %, 25 %, 50 % on 3 documents x 64 tokens.
# Every part has its own time budget and writes $OUT/<part>/fidelity.{json,md} as it goes.
set -uo pipefail
OUT=${OUT:-/tmp/v15_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec_cache}
M=/tmp/m/smol.gguf; [ -f "$M" ] || M=smollm2-135m
DEV=cuda; EXTRA=""
if [ "${1:-}" = "--smoke" ]; then DEV=cpu; EXTRA="--smoke"; fi
DOCS=stdlib:dataclasses,stdlib:calendar,stdlib:textwrap,pydoc:1/4,pydoc:3/4
OPTS=${OPTS:-'{}'}
timeout 150 python3 benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 8000 --budgets 0.25 \
  --documents '' --tasks passkey,niah_single,niah_multikey --samples 2 --options "$OPTS" --budget-s 120 \
  --out "$OUT/retrieval_8k" > "$OUT/retrieval_8k.log" 2>&1 || echo "retrieval_8k: rc $?" | tee -a "$OUT/failures.txt"
timeout 200 python3 benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 8000 --budgets 0.25,1024 \
  --documents $DOCS --new-tokens 128 --options "$OPTS" --budget-s 170 \
  --out "$OUT/agreement_8k" > "$OUT/agreement_8k.log" 2>&1 || echo "agreement_8k: rc $?" | tee -a "$OUT/failures.txt"
timeout 150 python3 benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 4096 \
  --budgets 0.0625,0.125,0.25,0.5 --documents stdlib:dataclasses,stdlib:calendar,pydoc:1/4 --new-tokens 64 \
  --options "$OPTS" --budget-s 120 --out "$OUT/curve_4k" > "$OUT/curve_4k.log" 2>&1 || echo "curve_4k: rc $?" | tee -a "$OUT/failures.txt"
tail -n 30 "$OUT"/*/fidelity.md
