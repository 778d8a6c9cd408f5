# Session 2026-12-04c, third machine: Quest's plan without a host read, replayed as one graph (this tree) vs the plan
# with its host read (/tmp/old = .old: `mkdir .old && git archive 5b59649 specdec | tar -x -C .old && rm -rf
# .old/specdec/draft_weights`); GPU tests; the greedy chain's replay test against a planted defect (a copy of this tree
# whose chain replay does not copy the lengths in: the test must fail). Carried after .whl + .model/a and .model/b.
set -x
rm -rf /tmp/old && cp -r .old /tmp/old && cp -r specdec/draft_weights /tmp/old/specdec/
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_greedy_chain.py > $OUT/tests.log 2>&1
tail -2 $OUT/tests.log
SPECDEC_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_quest_triton.py > $OUT/tests_quest.log 2>&1
tail -2 $OUT/tests_quest.log
rm -rf /tmp/defect && mkdir /tmp/defect && cp -r specdec tests /tmp/defect/ && python3 - <<'PY'
p = "/tmp/defect/specdec/graphs.py"
s = open(p).read()
old = "            g.ids.copy_(first)\n            g.lengths.copy_(lengths)\n"
assert s.count(old) == 1
open(p, "w").write(s.replace(old, "            g.ids.copy_(first)\n"))
PY
(cd /tmp/defect && PYTHONPATH=/tmp/defect:/tmp/site timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/test_gpu_graphs.py -k greedy_chain_replays > $OUT/defect.log 2>&1; echo "planted defect rc=$? (must be 1)")
tail -2 $OUT/defect.log
D=.heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt
timeout 280 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/abq --documents $D \
  --methods quest --rounds 2 --repeats 3 > $OUT/abq.log 2>&1
tail -10 $OUT/abq.log
cd $OUT && tar czf q.tgz abq *.log && rm -rf abq *.log
