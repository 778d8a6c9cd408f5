# Dustin's `layer_scores=keys` (key_rank=32, margin=0.1: the >= 99 % agreement setting) on the GPU after two fixes of
# 2026-12-06: the key basis by host LAPACK (CUDA's eigh of ~6k 64x64 Gram matrices loops one solver call per matrix)
# and the ranking kernel split over chunks of positions. `specdec bench` at 8k x B 64 on two outside documents, dense
# interleaved. Third call of the usual three (wheels + model part a, part b, part c + .heldout).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
KEYS=dustin:layer_share=1.0:layer_scores=keys:key_rank=32
timeout ${LIMIT:-240} python3 -m specdec bench --methods dense,$KEYS,$KEYS:margin=0.1,dustin --budget-ratio 0.25 \
  --contexts 8000 --batch-sizes 64 --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
  --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT --tag ${TAG:-gpu_dustin_keys_fix_2026-12-06} \
  > $OUT/${TAG:-b64_keys_fix}.log 2>&1
echo keys rc=$?
grep -v "━" $OUT/${TAG:-b64_keys_fix}.log | grep "|" | cut -c1-230
tail -n 5 $OUT/${TAG:-b64_keys_fix}.log
