#!/usr/bin/env bash
# Issue 14 items 2 and 3 at the Llama-3.1-8B shape (B 16 x 32k), one command, <= 5 minutes on an H200:
#   1. traces  - magicdec / vegas acceptance traces on the embedded model (8k of pydoc, B 4, gamma 4, 5 %)
#   2. steps   - dense / 5 % sparse draft / verify (5 rows) steps, CUDA graphs, fused kernels, in 5 variants:
#                fused_kernels (today: 12 launches per layer), fused_kernels_r0 (as of 2026-12-01b: 13),
#                fused_kernels_split2/4 (o_proj and qkv split by hand: no cuBLAS split-K reduce), and
#                fused_kernels_fused_combine (sparse step, combine inside the attention kernel); kernel table each
#   3. replay  - specdec bench at the 8B shape: dense, magicdec and vegas replaying part 1's traces (labelled replayed)
# Writes $OUT/issue14.json, $OUT/issue14.md (step table, kernel tables, replayed rows), $OUT/replay_8b.{json,md},
# $OUT/trace_*.json and $OUT/issue14.log as it goes. Smoke on the CPU: bash benchmarks/gpu/issue14_8b.sh --smoke
set -u
OUT=${OUT:-/tmp/issue14_8b}
GGUF=${GGUF:-/tmp/m/smol.gguf}
mkdir -p "$OUT"
ARGS=(--parts traces,steps,replay --step-shapes llama-3.1-8b
      --variants fused_kernels,fused_kernels_r0,fused_kernels_split2,fused_kernels_split4,fused_kernels_fused_combine
      --no-vegas-costs --budget-s 230 --out "$OUT")
if [ "${1:-}" = "--smoke" ]; then
  ARGS=(--smoke --parts traces,steps,replay --step-shapes tiny
        --variants fused_kernels,fused_kernels_r0,fused_kernels_split2,fused_kernels_fused_combine
        --no-vegas-costs --budget-s 100 --out "$OUT")
fi
timeout 295 "${PYTHON:-python3}" benchmarks/gpu/issue14.py --gguf "$GGUF" "${ARGS[@]}" 2>&1 | tee "$OUT/issue14.log"
exit "${PIPESTATUS[0]}"
