#!/usr/bin/env bash
# r14 (issue 14): the split down GEMM at the Llama-3.1-8B shape, Vegas' selection in one Triton launch, the GEMM
# split at the embedded shape, the 8B replay. ONE H200, <= 4.5 minutes (hard total: 265 s; each part its own
# timeout, the replay gets what is left); needs /tmp/m/smol.gguf for part 3 only.
#   bash benchmarks/gpu/r14.sh            # GPU
#   bash benchmarks/gpu/r14.sh --smoke    # CPU (Triton interpreter / reference backend), < 2 minutes
# 1. 8B steps (B 16 x 32k, graph-replayed, same run): dense / verify / sparse 5 % for fused_kernels_split2 (today's
#    default) vs fused_kernels_split2_down2 / _down4 (the down GEMM's partials added by the next layer's norm)
#    -> $OUT/steps/issue14.{md,json}                                                                  (~30 s)
# 2. selection at B 64 x 8k (30 layers): torch.topk plan vs TRITON_SELECT, + the index-set parity at that shape
#    -> $OUT/select/r14_select.json                                                                    (~10 s)
# 3. embedded model B 64 x 8k end to end, interleaved rounds: GEMM splits 1 / 2 / 2 + down 2 / 2 + Triton select,
#    dense and vegas, tau, Vegas' selection share, lossless check -> $OUT/e2e/r14_e2e.{md,json}       (~80 s)
# 4. the 8B replay (replay_8b.sh's rows: dense, magicdec, vegas; today's default) -> $OUT/replay/replay_8b.{md,json}
# Everything is tarred into $OUT/r14.tgz at the end (the parts' files also stay under $OUT).
set -u
OUT=${OUT:-/tmp/r14_out}
mkdir -p "$OUT/steps" "$OUT/select" "$OUT/e2e" "$OUT/replay"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
T=benchmarks/results/traces
TRACES="magicdec=$T/smollm2_8k_magicdec_trace_2026-12-01.json,vegas=$T/smollm2_8k_vegas_trace_2026-12-01.json"
V=fused_kernels_split2,fused_kernels_split2_down2,fused_kernels_split2_down4
TOTAL=${TOTAL:-265}
left() { echo $(( TOTAL - SECONDS > 5 ? TOTAL - SECONDS : 5 )); }
if [ "${1:-}" = "--smoke" ]; then
  export TRITON_INTERPRET=1
  timeout 45 $PY benchmarks/gpu/issue14.py --smoke --parts steps --variants $V --no-vegas-costs --out "$OUT/steps" \
    > "$OUT/steps/run.log" 2>&1; echo "steps exit $?"
  timeout 20 $PY benchmarks/gpu/r14_select.py --smoke --out "$OUT/select" > "$OUT/select/run.log" 2>&1
  echo "select exit $?"
  timeout 50 $PY benchmarks/gpu/r14_e2e.py --smoke --rounds 1 --out "$OUT/e2e" > "$OUT/e2e/run.log" 2>&1
  echo "e2e exit $?"
  timeout 30 $PY benchmarks/gpu/issue14.py --smoke --parts replay --out "$OUT/replay" --traces "$TRACES" \
    > "$OUT/replay/run.log" 2>&1; echo "replay exit $?"
else
  timeout 70 $PY benchmarks/gpu/issue14.py --parts steps --step-shapes llama-3.1-8b --variants $V --no-vegas-costs \
    --budget-s 50 --out "$OUT/steps" > "$OUT/steps/run.log" 2>&1; echo "steps exit $? at ${SECONDS}s"
  timeout 25 $PY benchmarks/gpu/r14_select.py --out "$OUT/select" > "$OUT/select/run.log" 2>&1
  echo "select exit $? at ${SECONDS}s"
  timeout 85 $PY benchmarks/gpu/r14_e2e.py --budget-s 45 --rounds 3 --out "$OUT/e2e" > "$OUT/e2e/run.log" 2>&1
  echo "e2e exit $? at ${SECONDS}s"
  timeout "$(left)" $PY benchmarks/gpu/issue14.py --parts replay --budget-s 10 --out "$OUT/replay" --traces "$TRACES" \
    > "$OUT/replay/run.log" 2>&1; echo "replay exit $? at ${SECONDS}s"
fi
tar czf "$OUT/r14.tgz" -C "$OUT" steps select e2e replay
for f in "$OUT/steps/issue14.md" "$OUT/select/r14_select.json" "$OUT/e2e/r14_e2e.md" "$OUT/replay/replay_8b.md"; do
  [ -f "$f" ] && { echo "== $f"; head -c 4000 "$f"; }
done
exit 0
