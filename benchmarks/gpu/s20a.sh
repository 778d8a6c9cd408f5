# Session 2026-12-04b, call 3: join the model, A/B the self-draft host-read removal, GPU tests, a Vegas profile.
# /tmp/old is .old: `mkdir .old && git archive 44fd23f specdec | tar -x -C .old && rm -rf .old/specdec/draft_weights` (the
# draft weights are copied from this tree on the device); carried with the third call, after .whl + .model/a and .model/b.
set -x
rm -rf /tmp/old && cp -r .old /tmp/old && cp -r specdec/draft_weights /tmp/old/specdec/
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
D=.heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt
timeout 330 python3 benchmarks/gpu/code_ab.py --trees before=/tmp/old,after=. --out $OUT/ab --documents $D \
  --methods dense,magicdec,vegas,quest,dustin --rounds 2 --repeats 3 > $OUT/ab.log 2>&1
tail -30 $OUT/ab.log
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_numerics.py tests/test_phase_timer.py tests/test_gpu_graphs.py \
  tests/test_lookup.py -k "nonfinite or phase or Phase or graph or device or lookup" > $OUT/tests.log 2>&1
tail -5 $OUT/tests.log
timeout 90 python3 benchmarks/gpu/dustin_draft_profile.py --method vegas --out $OUT/pv --document .heldout/click_core.py \
  --new 48 --trace > $OUT/pv.log 2>&1
python3 benchmarks/gpu/trace_idle.py $OUT/pv/trace.json.gz > $OUT/pv/idle.txt 2>&1
head -20 $OUT/pv/profile.md; cat $OUT/pv/idle.txt | head -40
cd $OUT && tar czf all.tgz ab ab.log tests.log pv.log pv/profile.json pv/profile.md pv/idle.txt && rm -rf ab ab.log tests.log pv.log && rm -f pv/profile.json pv/profile.md pv/idle.txt
