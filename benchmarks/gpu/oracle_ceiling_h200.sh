# How close can any KV selection at 25 % get to dense's greedy tokens on this model? (2026-12-05, issue 15's
# "agreement >= 99 % at 25 %".) Teacher-forced on dense's text, 128 tokens per document: Dustin's default selection,
# and oracle sets taken from each verification pass's own dense attention (one set shared by every layer, and one per
# layer and KV head), at 4k on five outside documents and 8k on four. float32, reference backend.
# Third call of the usual three (wheels + model part a, part b, part c + .heldout).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
H=.heldout
export DEVICE=cuda MODEL=/tmp/m/smol.gguf
timeout ${LIMIT4:-240} python3 benchmarks/dustin_oracle_cpu.py 4096 128 \
  $H/GPL-3.txt,$H/LGPL-2.1.txt,$H/GFDL-1.3.txt,$H/click_core.py,$H/numpy_function_base_impl.py default,shared,per 0.25 \
  2>&1 | tee $OUT/oracle_4k.log | grep -v Warning
echo rc4=$?
timeout ${LIMIT8:-300} python3 benchmarks/dustin_oracle_cpu.py 8000 128 \
  $H/licenses_gpl3_lgpl21.txt,$H/licenses_gfdl_mpl2_apache.txt,$H/click_core.py,$H/numpy_function_base_impl.py default,shared,per 0.25 \
  2>&1 | tee $OUT/oracle_8k.log | grep -v Warning
echo rc8=$?
