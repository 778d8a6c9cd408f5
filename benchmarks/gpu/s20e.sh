# Session 2026-12-04b, fourth machine: the next draft started before the host emits (this tree) vs without (/tmp/old).
# /tmp/old is .old: `mkdir .old && git archive 0139414 specdec | tar -x -C .old && rm -rf .old/specdec/draft_weights` (the
# draft weights are copied from this tree on the device); carried with the third call, after .whl + .model/a and .model/b.
set -x
rm -rf /tmp/old && cp -r .old /tmp/old && cp -r specdec/draft_weights /tmp/old/specdec/
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
D=.heldout/licenses_gfdl_mpl2_apache.txt
timeout 190 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/ab --documents $D \
  --methods dense,dustin --rounds 2 --repeats 3 > $OUT/ab.log 2>&1
tail -16 $OUT/ab.log
(cd $OUT && tar czf ab.tgz ab ab.log && rm -rf ab ab.log)
timeout 30 python3 -m pytest -q -p no:cacheprovider tests/test_eagle_graphs.py tests/test_eagle.py -k "graph or ahead" > $OUT/tests.log 2>&1
tail -2 $OUT/tests.log
