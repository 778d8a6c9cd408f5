# Session 2026-12-04c, fourth machine: the self-speculative drafter plans the next draft in on_verify (before the host
# waits for the iteration's transfer; drafts_ahead where γ is fixed) (this tree) vs planning at the draft (/tmp/old =
# .old: `mkdir .old && git archive 35ddcca specdec | tar -x -C .old && rm -rf .old/specdec/draft_weights`); GPU tests.
# Carried after .whl + .model/a and .model/b.
set -x
rm -rf /tmp/old && cp -r .old /tmp/old && cp -r specdec/draft_weights /tmp/old/specdec/
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
D=.heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt
timeout 230 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/abp --documents $D \
  --methods magicdec,vegas,quest --rounds 2 --repeats 3 > $OUT/abp.log 2>&1
tail -16 $OUT/abp.log
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_greedy_chain.py > $OUT/tests.log 2>&1
tail -2 $OUT/tests.log
cd $OUT && tar czf p.tgz abp *.log && rm -rf abp *.log
