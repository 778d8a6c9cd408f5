#!/usr/bin/env bash
# r14 (issue 14): the split down GEMM at the Llama-3.1-8B shape, the 8B replay, the GEMM split at the embedded shape.
#   bash benchmarks/gpu/r14.sh            # one H200, <= 4.5 minutes (hard timeouts per part); /tmp/m/smol.gguf for part 3
#   bash benchmarks/gpu/r14.sh --smoke    # CPU (Triton interpreter / reference backend), < 2 minutes
# 1. 8B steps (B 16 x 32k, graph-replayed, same run): dense / verify / sparse 5 % for fused_kernels_split2 (today's
#    default) vs fused_kernels_split2_down2 / _down4 (the down GEMM's partials added by the next layer's norm)
#    -> $OUT/steps/issue14.{md,json}
# 2. the 8B replay (replay_8b.sh's rows: dense, magicdec, vegas; today's default, two-slice o_proj/qkv)
#    -> $OUT/replay/replay_8b.{md,json}
# 3. embedded model B 64 x 8k end to end, interleaved: GEMM splits 1 vs 2 vs 2 + down 2, dense and vegas, with
#    Vegas' selection share -> $OUT/e2e/r14_e2e.{md,json}
# Everything is tarred into $OUT/r14.tgz at the end (and the parts' files stay under $OUT).
set -u
OUT=${OUT:-/tmp/r14_out}
mkdir -p "$OUT/steps" "$OUT/replay" "$OUT/e2e"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
T=benchmarks/results/traces
V=fused_kernels_split2,fused_kernels_split2_down2,fused_kernels_split2_down4
if [ "${1:-}" = "--smoke" ]; then
  export TRITON_INTERPRET=1
  timeout 60 $PY benchmarks/gpu/issue14.py --smoke --parts steps --variants $V --no-vegas-costs --out "$OUT/steps" \
    > "$OUT/steps/run.log" 2>&1; echo "steps exit $?"
  timeout 40 $PY benchmarks/gpu/issue14.py --smoke --parts replay --out "$OUT/replay" \
    --traces "magicdec=$T/smollm2_8k_magicdec_trace_2026-12-01.json,vegas=$T/smollm2_8k_vegas_trace_2026-12-01.json" \
    > "$OUT/replay/run.log" 2>&1; echo "replay exit $?"
  timeout 75 $PY benchmarks/gpu/r14_e2e.py --smoke --rounds 1 --out "$OUT/e2e" > "$OUT/e2e/run.log" 2>&1
  echo "e2e exit $?"
else
  timeout 75 $PY benchmarks/gpu/issue14.py --parts steps --step-shapes llama-3.1-8b --variants $V --no-vegas-costs \
    --budget-s 55 --out "$OUT/steps" > "$OUT/steps/run.log" 2>&1; echo "steps exit $?"
  timeout 110 $PY benchmarks/gpu/issue14.py --parts replay --budget-s 10 --out "$OUT/replay" \
    --traces "magicdec=$T/smollm2_8k_magicdec_trace_2026-12-01.json,vegas=$T/smollm2_8k_vegas_trace_2026-12-01.json" \
    > "$OUT/replay/run.log" 2>&1; echo "replay exit $?"
  timeout 80 $PY benchmarks/gpu/r14_e2e.py --budget-s 50 --rounds 3 --out "$OUT/e2e" > "$OUT/e2e/run.log" 2>&1
  echo "e2e exit $?"
fi
tar czf "$OUT/r14.tgz" -C "$OUT" steps replay e2e
for f in "$OUT/steps/issue14.md" "$OUT/replay/replay_8b.md" "$OUT/e2e/r14_e2e.md"; do
  [ -f "$f" ] && { echo "== $f"; head -c 5000 "$f"; }
done
exit 0
