# Dustin's confidence valve on the GPU: `margin=0.5` (>= 99 % teacher-forced at 4k, 25 %) against Dustin without it and
# dense, `specdec bench` at 8k x B 64, budget 25 %, on two outside documents, dense interleaved. Third call of the usual
# three (wheels + model part a, part b, part c + .heldout).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
TAG=${TAG:-gpu_dustin_valve_speed_2026-12-06}
timeout ${LIMIT:-240} python3 -m specdec bench --methods dense,dustin,dustin:margin=0.5 --budget-ratio 0.25 \
  --contexts 8000 --batch-sizes 64 --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
  --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT --tag $TAG > $OUT/$TAG.log 2>&1
echo valve rc=$?
grep -v "━" $OUT/$TAG.log | grep "^| " | cut -c1-260
tail -n 3 $OUT/$TAG.log
