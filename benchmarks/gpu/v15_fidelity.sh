#!/usr/bin/env bash
# Dustin's sparse verification vs dense at 8k on one GPU (≈ 6 min at most, ≈ 3 with PARTS=12; each part time-boxed):
#   OUT=$OUT bash benchmarks/gpu/v15_fidelity.sh [--smoke]
# 1. retrieval at 8,000 tokens, budget 2048 (25 %): passkey, single and multi-key needle, 2 samples each,
#    every answer and whether the output is identical to dense;
# 2. agreement at 8,000 tokens, 5 held-out documents x 128 tokens, budget 25 %: teacher-forced and
#    free-running agreement, TV, τ, KV read, tokens/s (reference backend, float32, B = 1);
# 3. 1024 of 4,096 tokens (25 %) on the same 5 documents x 128 tokens, and the trade-off curve there:
#    budgets 12.5 %, 50 %, 6.25 % (each document runs every budget; the time box may cut documents);
# 4. the oracle ceiling of one shared set vs per-layer sets at 4k (≈ 1 min).
# Every part has its own time budget and writes $OUT/<part>/fidelity.{json,md} as it goes.
set -uo pipefail
OUT=${OUT:-/tmp/v15_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec_cache}
M=/tmp/m/smol.gguf; [ -f "$M" ] || M=smollm2-135m
DEV=cuda; EXTRA=""
if [ "${1:-}" = "--smoke" ]; then DEV=cpu; EXTRA="--smoke"; fi
DOCS=${DOCS:-stdlib:dataclasses,stdlib:calendar,stdlib:textwrap,pydoc:1/4,pydoc:3/4}  # or files (comma-separated)
OPTS=${OPTS:-'{"draft": "skip"}'}  # the skip-layer draft of the CPU numbers; OPTS='{}' for the default (EAGLE) draft
PARTS=${PARTS:-1234}  # e.g. PARTS=12 runs only parts 1 and 2
[[ $PARTS == *1* ]] && { timeout 150 python3 benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 8000 --budgets 0.25 \
  --documents '' --tasks passkey,niah_single,niah_multikey --samples 2 --options "$OPTS" --budget-s 120 \
  --out "$OUT/retrieval_8k" > "$OUT/retrieval_8k.log" 2>&1 || echo "retrieval_8k: rc $?" | tee -a "$OUT/failures.txt"; }
[[ $PARTS == *2* ]] && { timeout 200 python3 benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 8000 --budgets 0.25 \
  --documents $DOCS --new-tokens 128 --options "$OPTS" --budget-s 170 \
  --out "$OUT/agreement_8k" > "$OUT/agreement_8k.log" 2>&1 || echo "agreement_8k: rc $?" | tee -a "$OUT/failures.txt"; }
[[ $PARTS == *3* ]] && { timeout 240 python3 benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 4096 \
  --budgets 0.25,0.125,0.5,0.0625 --documents $DOCS --new-tokens 128 \
  --options "$OPTS" --budget-s 200 --out "$OUT/curve_4k" > "$OUT/curve_4k.log" 2>&1 || echo "curve_4k: rc $?" | tee -a "$OUT/failures.txt"; }
# 4. the ceiling of one shared verification set: oracle sets (this pass's own dense attention) shared by all layers
#    vs per layer and KV head, 4k, budget 25 %, 2 documents x 48 tokens (teacher-forced agreement, TV)
if [ -z "$EXTRA" ] && [[ $PARTS == *4* ]]; then
  DEVICE=cuda MODEL="$M" timeout 120 python3 benchmarks/dustin_oracle_cpu.py 4096 48 stdlib:calendar,pydoc:1/4 shared,per 0.25 \
    > "$OUT/oracle_4k.log" 2>&1 || echo "oracle_4k: rc $?" | tee -a "$OUT/failures.txt"
  grep -v Warn "$OUT/oracle_4k.log" | tail -n 6
fi
tail -n 30 "$OUT"/*/fidelity.md
