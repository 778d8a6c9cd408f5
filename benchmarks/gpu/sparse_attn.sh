#!/usr/bin/env bash
# Issue 14 item 4, the sparse-attention kernel (k14a): <= 3.5 minutes on one H200, no model file needed.
#   bash benchmarks/gpu/sparse_attn.sh            # GPU; everything under $OUT
#   bash benchmarks/gpu/sparse_attn.sh --smoke    # CPU (Triton interpreter / reference backend), ~1 minute
# 1. sparse_attn.py: one layer's sparse attention at the Llama-3.1-8B shape (B=16 x 32k, B=1 x 128k) and the
#    embedded shape (B=64 x 8k), 5 % budget: legacy launch vs LAUNCH_TABLE vs a sweep, graph-replayed, against a
#    copy_ of the same bytes; gather vs window; suggested table rows.  -> $OUT/sparse_attn.{json,md,log}
# 2. issue14.py --parts steps: the whole sparse 5 % draft step at the 8B shape (B=16, 32k, CUDA graphs, fused
#    kernels) vs its roofline, with the table's and with the legacy sparse launch; kernel tables.  -> $OUT/steps/
set -u
OUT=${OUT:-/tmp/sparse_attn_out}
mkdir -p "$OUT/steps"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--smoke" ]; then
  export TRITON_INTERPRET=1
  timeout 170 python3 benchmarks/gpu/sparse_attn.py --smoke --out "$OUT"
  timeout 170 python3 benchmarks/gpu/issue14.py --smoke --parts steps --variants fused_kernels,fused_kernels_legacy_sparse \
    --no-vegas-costs --out "$OUT/steps"
  exit 0
fi
# 0. the new paths compiled for real: the table's sparse row at head dim 128, fused_combine (incl. graph replays)
SPECDEC_TEST_DEVICE=cuda timeout 45 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py \
  -k "fused_combine or table_default" > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest exit $?: $(tail -n 1 "$OUT/pytest_gpu.txt")"
timeout 100 python3 benchmarks/gpu/sparse_attn.py --out "$OUT" --budget-s 80 2>&1 | tail -n 60
echo "sparse_attn.py exit ${PIPESTATUS[0]}"
timeout 60 python3 benchmarks/gpu/issue14.py --parts steps --step-shapes llama-3.1-8b \
  --variants fused_kernels,fused_kernels_legacy_sparse --no-vegas-costs --budget-s 40 --out "$OUT/steps" \
  > "$OUT/steps.log" 2>&1
echo "issue14.py steps exit $?"
grep -v '^\s*$' "$OUT/steps.log" | cut -c1-400 | tail -n 12
