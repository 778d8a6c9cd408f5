# Session 2026-12-04e, fifth machine, third call: the same check with a Dustin engine run between the two passes (in
# stop 42's two-document run, prose MagicDec / Vegas at B 64 came after click's Dustin rows and read τ 3.34 / 3.43
# against 3.52 / 3.80 in runs without them). hf_state.py --between dustin.
set -x
ls /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
timeout 300 python3 benchmarks/gpu/hf_state.py --model /tmp/m/smol.gguf --document .heldout/licenses_gfdl_mpl2_apache.txt \
  --out $OUT --between dustin --probe 2>&1 | grep -v Warning | tail -10
