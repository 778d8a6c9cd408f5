# Session 2026-12-04c, first machine: greedy self-drafts as one CUDA graph per draft (this tree) vs stepping (/tmp/old).
# /tmp/old is .old: `mkdir .old && git archive 716fc0e specdec | tar -x -C .old && rm -rf .old/specdec/draft_weights` (the
# draft weights are copied from this tree on the device); carried with the third call, after .whl + .model/a and .model/b.
set -x
rm -rf /tmp/old && cp -r .old /tmp/old && cp -r specdec/draft_weights /tmp/old/specdec/
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_greedy_chain.py tests/test_engine.py > $OUT/tests.log 2>&1
tail -3 $OUT/tests.log
D=.heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt,.heldout/licenses_gfdl_mpl2_apache.txt
timeout 400 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/ab --documents $D \
  --methods dense,magicdec,vegas --rounds 2 --repeats 3 > $OUT/ab.log 2>&1
tail -30 $OUT/ab.log
cd $OUT && tar czf ab.tgz ab *.log && rm -rf ab *.log
