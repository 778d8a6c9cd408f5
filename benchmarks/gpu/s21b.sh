# Session 2026-12-04c, same machine, next call: Quest's A/B at B 64 (its draft is one chain too), and B 1 (launch-bound).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
timeout 200 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/abq --documents .heldout/click_core.py \
  --methods quest --rounds 2 --repeats 3 > $OUT/abq.log 2>&1
tail -8 $OUT/abq.log
timeout 300 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/ab1 --documents .heldout/click_core.py \
  --methods dense,magicdec,vegas --batch 1 --rounds 2 --repeats 3 > $OUT/ab1.log 2>&1
tail -14 $OUT/ab1.log
cd $OUT && tar czf abq.tgz abq ab1 *.log && rm -rf abq ab1 *.log
