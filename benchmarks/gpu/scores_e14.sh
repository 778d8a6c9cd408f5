#!/usr/bin/env bash
# Issue 14 item 4 / issue 18 (e14): Vegas' score emission and selection, <= 3 minutes on one H200.
#   bash benchmarks/gpu/scores_e14.sh            # GPU; everything under $OUT; needs /tmp/m/smol.gguf for the e2e part
#   bash benchmarks/gpu/scores_e14.sh --smoke    # CPU (Triton interpreter / reference backend), ~2 minutes
# 0. the new kernel paths compiled for real (SCORE_MODE 4 logits / sink_softmax, bf16 score and raw buffers,
#    graph capture with sink_softmax)  -> $OUT/pytest_gpu.txt
# 1. scores_e14.py: one layer's verify (5 rows) without scores vs each score variant, SmolLM2 B 64/16/1 x 8k and
#    8B B 16 x 32k, B 1 x 128k (+ launch sweeps), FlashInfer's verify when installed, the embedded model end to end
#    (dense and Vegas with each score variant at B = 64), Vegas' selection  -> $OUT/scores_e14.{json,md,log}
set -u
OUT=${OUT:-/tmp/scores_e14_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--smoke" ]; then
  timeout 170 python3 benchmarks/gpu/scores_e14.py --smoke --out "$OUT"
  exit $?
fi
SPECDEC_TEST_DEVICE=cuda timeout 35 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py \
  -k "onepass_scores_sparse or sink_softmax_is or bf16_score or graph_capture or (onepass_scores_match and 5-rows0 and dtype1)" \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest exit $?: $(tail -n 1 "$OUT/pytest_gpu.txt")"
timeout 140 python3 benchmarks/gpu/scores_e14.py --out "$OUT" --budget-s 125 > "$OUT/run.log" 2>&1
echo "scores_e14.py exit $?"
tail -n 80 "$OUT/scores_e14.md"
