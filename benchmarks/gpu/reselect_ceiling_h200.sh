# A re-selection layer as the verification's importance signal (TidalDecode-style), measured as an oracle variant
# (2026-12-05): layers 0..L run dense, and the layers after L read one set chosen from layer L's attention of this
# very pass (`fromL` of benchmarks/dustin_oracle_cpu.py), 25 % budget, teacher-forced on dense's text, 128 tokens,
# the documents of oracle_ceiling_h200.sh. float32, reference backend. Third call of the usual three.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
H=.heldout
export DEVICE=cuda MODEL=/tmp/m/smol.gguf
timeout ${LIMIT4:-200} python3 benchmarks/dustin_oracle_cpu.py 4096 128 \
  $H/LGPL-2.1.txt,$H/click_core.py,$H/GFDL-1.3.txt,$H/GPL-3.txt,$H/numpy_function_base_impl.py ${MODES:-from2,from4,from1} 0.25 \
  2>&1 | tee $OUT/reselect_4k.log | grep heldout &
timeout ${LIMIT8:-200} python3 benchmarks/dustin_oracle_cpu.py 8000 128 \
  $H/click_core.py,$H/licenses_gpl3_lgpl21.txt,$H/numpy_function_base_impl.py,$H/licenses_gfdl_mpl2_apache.txt ${MODES:-from2,from4,from1} 0.25 \
  2>&1 | tee $OUT/reselect_8k.log | grep heldout &
wait
