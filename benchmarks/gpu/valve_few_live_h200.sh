# Dustin's confidence valve with the few-live launch (2026-12-06 evening): the re-run of the fired sequences runs
# attention programs for those sequences alone, split for a few (KVCache.few_live, splitk_attention(live_order=...)),
# against the full batch's launch (specdec.verifiers.VALVE_FEW_LIVE = False), A/B in turns. Four calls:
#   STAGE=1 (carry .whl .model/a): wheels, model part a; the few-live tests compiled for the GPU; the re-run's
#                                  timing and kernels (random weights, B 64 x 8k)
#   STAGE=2 (carry .model/b):      model part b
#   STAGE=3 (carry .model/c .heldout): `specdec bench` at 8k x B 64 on click core.py (8 windows), few-live then
#                                  the full batch's launch, dense interleaved in each process
#   STAGE=4 (carry .heldout):      the same on GPL-3 + LGPL-2.1 (4 windows)
#   STAGE=5 (carry .model/c .heldout, after STAGE=1 with CHECKS=0 and STAGE=2): click, the keys plan skipping the
#                                  finished sequences (ranking, selection, picks) or not
# UPTO: specdec.verifiers.VALVE_FEW_LIVE_UPTO (the share of the batch up to which the re-run takes the few-live launch);
# METHODS: the bench's methods (default: dense, keys rank 16 / 32 with margin 0.1, the shared set with margin 0.5)
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
bench() {  # $1 doc, $2 windows, $3 tag, $4 VALVE_FEW_LIVE, $5 the finished sequences skipped by the keys plan
  KEYS=dustin:layer_share=1.0:layer_scores=keys
  SKIP="import specdec.selectors.hybrid_srh as h; h._finished_skipped = (lambda c, l: None) if not ${5:-True} else h._finished_skipped"
  timeout ${LIMIT:-280} python3 -c "import sys, specdec.verifiers as v; v.VALVE_FEW_LIVE = $4; v.VALVE_FEW_LIVE_UPTO = ${UPTO:-0.25}; $SKIP; from specdec.cli import main; main()" bench \
    --methods ${METHODS:-dense,$KEYS:key_rank=16:margin=0.1,$KEYS:key_rank=32:margin=0.1,dustin:margin=0.5} \
    --budget-ratio 0.25 --contexts 8000 --batch-sizes 64 --windows $2 --documents .heldout/$1 \
    --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT --tag $3 \
    > $OUT/$3.log 2>&1
  echo bench $3 rc=$?
  grep -v "━" $OUT/$3.log | grep "|" | cut -c1-260
  tail -n 2 $OUT/$3.log
}
case "${STAGE:-3}" in
1)
  mkdir -p /tmp/m /tmp/site && cp .model/a/part_aa /tmp/m/
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  nvidia-smi --query-gpu=name --format=csv,noheader
  [ "${CHECKS:-1}" = 1 ] || exit 0
  SPECDEC_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py -k few_live \
    > $OUT/few_live_tests.txt 2>&1; echo tests rc=$?; tail -n 5 $OUT/few_live_tests.txt
  timeout 200 python3 benchmarks/gpu/valve_rerun_speed.py --out $OUT > $OUT/valve_rerun_speed.txt 2>&1; echo valve rc=$?
  cat $OUT/valve_rerun_speed.md
  ;;
2)
  cp .model/b/part_ab /tmp/m/
  ;;
3)
  ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
  md5sum /tmp/m/smol.gguf
  nvidia-smi --query-gpu=name --format=csv,noheader
  bench click_core.py 8 valve_few_live_click True
  bench click_core.py 8 valve_full_launch_click False
  ;;
4)
  bench licenses_gpl3_lgpl21.txt 4 valve_few_live_gpl True
  bench licenses_gpl3_lgpl21.txt 4 valve_full_launch_gpl False
  ;;
5)  # (after STAGE=1 CHECKS=0 and STAGE=2; carry .model/c .heldout) the keys plan with and without the finished
    # sequences skipped (few-live launch on in both), click core.py in 8 windows
  ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
  nvidia-smi --query-gpu=name --format=csv,noheader
  bench click_core.py 8 finished_skip_click True True
  bench click_core.py 8 finished_read_click True False
  ;;
esac
