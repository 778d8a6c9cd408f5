#!/usr/bin/env bash
# Replayed rows at the Llama-3.1-8B shape (random weights, B 16 x 32k, CUDA graphs, fused kernels): dense, and
# magicdec / vegas replaying the acceptance their runs recorded on the embedded model (8k of pydoc, gamma 4, 5 %
# budget; benchmarks/results/traces/, committed) -- no GGUF needed. <= 4 minutes on an H200.
# Writes $OUT/replay_8b.{md,json} (the table: tok/s, min-max of 3 runs, x dense, labelled replayed),
# $OUT/issue14.{md,json} (parts' status, tracebacks) and $OUT/replay.log. CPU smoke: bash benchmarks/gpu/replay_8b.sh --smoke
set -u
OUT=${OUT:-/tmp/replay_8b}
T=benchmarks/results/traces
mkdir -p "$OUT"
ARGS=(--parts replay --budget-s 200 --out "$OUT"
      --traces "magicdec=$T/smollm2_8k_magicdec_trace_2026-12-01.json,vegas=$T/smollm2_8k_vegas_trace_2026-12-01.json")
if [ "${1:-}" = "--smoke" ]; then ARGS+=(--smoke); fi
timeout 235 "${PYTHON:-python3}" benchmarks/gpu/issue14.py "${ARGS[@]}" 2>&1 | tee "$OUT/replay.log"
exit "${PIPESTATUS[0]}"
