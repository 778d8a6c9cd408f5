#!/usr/bin/env bash
# Issue 15, item 4 (+ the 4k/8k retrieval check of item 2) on one H200 — run from the repository root:
#   OUT=$OUT bash benchmarks/gpu/dustin_trained.sh        (≈ 15 min; results → $OUT, copy them to benchmarks/results/)
# 1. end to end at 8k, B = 64: dense vs dustin (shipped trained draft, captured with the target's graphs),
#    budgets 5 % and 25 % of the context; rows give tok/s, τ, phase seconds (draft step vs dense step),
#    token agreement with dense.
# 2. `specdec eval` at 4k (budget 1024) and 8k (budget 2048): RULER-style tasks incl. passkey/needles,
#    agreement + TV on 5 documents × 128 tokens, paired with dense.
set -euo pipefail
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
D=$(date -u +%F)
export PYTHONPATH=$PWD
GGUF=$(python -c "from specdec.models import embedded_model_path as p; print(p('smollm2-135m'))")
python -c "from specdec import SpecdecModel; from specdec.train_draft import shipped_draft; m = SpecdecModel.from_pretrained('smollm2-135m'); p = shipped_draft(m); assert p, 'no shipped draft matches'; print('draft', p)"
for R in 0.05 0.25; do
  timeout 420 python benchmarks/e2e_gpu.py --gguf "$GGUF" --context 8192 --batches 64 --methods dense,dustin \
    --backend triton --graphs 1 --compile 1 --fuse 1 --new 96 --hf 0 --budget-ratio $R \
    --out "$OUT/gpu_dustin_trained_8k_B64_r${R}_$D.json" || echo "e2e at ratio $R failed: rc $?"
done
for C in 4096:1024 8192:2048; do
  CTX=${C%%:*}; B=${C##*:}
  timeout 480 python -m specdec.cli eval --device cuda --methods dustin,vegas --context-tokens $CTX --budget $B \
    --samples 3 --doc-tokens 128 --documents pydoc,stdlib:argparse,stdlib:typing,stdlib:inspect,stdlib:tarfile \
    --output-json "$OUT/gpu_eval_${CTX}_$D.json" --output-md "$OUT/gpu_eval_${CTX}_$D.md" \
    --output-plot "$OUT/gpu_eval_${CTX}_$D.png" || echo "eval at $CTX failed: rc $?"
done
ls -la "$OUT"
