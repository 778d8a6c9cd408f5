#!/usr/bin/env bash
# Dustin vs dense at 1024 of 4,096 tokens (25 %) on one GPU, ONE process (the model is loaded once; every time
# budget starts after the load), whole script <= 3.5 min on an H200:
#   OUT=$OUT bash benchmarks/gpu/f15_fidelity.sh [--smoke]
# (a) teacher-forced agreement + KV read, 5 held-out documents x 128 tokens: Dustin's default, with the confidence
#     valve replayed at every margin of MARGINS from the logged per-pass margins (<= 50 s);
# (b) free-running greedy agreement on the same documents for each variant of VARIANTS (<= 35 s);
# (c) specdec eval's six tasks at 4,096 tokens, budget 1024, SAMPLES per task, dense vs each variant (paired sign
#     test + bootstrap interval; samples in the outer loop so a time box keeps every task), the rest of the budget.
# float32; backend picked by timing reference vs torch dense decoding at 4,096 (same tokens required; recorded).
# Writes $OUT/f15/{fidelity.json,fidelity.md,curve.png,tasks.json,tasks.md,run.log} as it goes, then $OUT/f15.tgz.
# Smoke (CPU, tiny random model, < 1 min): PY=.venv/bin/python OUT=/tmp/f15_smoke bash benchmarks/gpu/f15_fidelity.sh --smoke
set -uo pipefail
OUT=${OUT:-/tmp/f15_out}
mkdir -p "$OUT/f15"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec_cache}  # keep /tmp/site
M=/tmp/m/smol.gguf; [ -f "$M" ] || M=smollm2-135m
DEV=cuda; EXTRA="--backend auto"; PY=${PY:-python3}; HARD=200
if [ "${1:-}" = "--smoke" ]; then DEV=cpu; EXTRA="--smoke"; HARD=110; fi
DOCS=${DOCS:-stdlib:dataclasses,stdlib:calendar,stdlib:textwrap,pydoc:1/4,pydoc:3/4}  # or files (comma-separated)
MARGINS=${MARGINS:-0.25,0.5,1,1.5,2,3}
VARIANTS=${VARIANTS:-'{"dustin": {}, "valve1": {"margin": 1.0}}'}
TASKS=passkey,niah_single,niah_multikey,niah_multivalue,variable_tracking,common_words
SAMPLES=${SAMPLES:-8}
start=$(date +%s)
timeout -k 5 $HARD $PY benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context 4096 --budgets 1024 \
  --documents $DOCS --new-tokens 128 --margins $MARGINS --variants "$VARIANTS" \
  --tasks $TASKS --samples $SAMPLES --task-context 4096 --task-budget 1024 \
  --tf-budget-s 50 --free-budget-s 35 --budget-s 160 --out "$OUT/f15" > "$OUT/f15/run.log" 2>&1 \
  || echo "f15: rc $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/f15/failures.txt"
echo "wall $(( $(date +%s) - start )) s" >> "$OUT/f15/run.log"
tail -n 40 "$OUT/f15/fidelity.md" "$OUT/f15/tasks.md" 2>/dev/null
tar -czf "$OUT/f15.tgz" -C "$OUT" f15
