# Session 2026-12-04b, third machine: the emission on the device (one Triton launch) and the next plan queued before
# /tmp/old is .old: `mkdir .old && git archive d5db805 specdec | tar -x -C .old && rm -rf .old/specdec/draft_weights` (the
# draft weights are copied from this tree on the device); carried with the third call, after .whl + .model/a and .model/b.
# the host emits (this tree) vs the tree at the session's start (/tmp/old); GPU tests; a Dustin trace.
set -x
rm -rf /tmp/old && cp -r .old /tmp/old && cp -r specdec/draft_weights /tmp/old/specdec/
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
SPECDEC_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_triton_emit.py > $OUT/tests_emit.log 2>&1
tail -2 $OUT/tests_emit.log
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_engine.py > $OUT/tests.log 2>&1
tail -2 $OUT/tests.log
D=.heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt,.heldout/licenses_gfdl_mpl2_apache.txt
timeout 340 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/ab --documents $D \
  --methods dense,magicdec,vegas,dustin --rounds 2 --repeats 3 > $OUT/ab.log 2>&1
tail -36 $OUT/ab.log
timeout 45 python3 benchmarks/gpu/dustin_draft_profile.py --out $OUT/pd --document .heldout/licenses_gfdl_mpl2_apache.txt \
  --new 48 --trace > $OUT/pd.log 2>&1
python3 benchmarks/gpu/trace_idle.py $OUT/pd/trace.json.gz > $OUT/pd/idle.txt 2>&1; head -30 $OUT/pd/idle.txt
cd $OUT && tar czf all.tgz ab *.log pd/profile.* pd/idle.txt && rm -rf ab *.log pd/profile.* pd/idle.txt
