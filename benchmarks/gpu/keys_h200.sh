# Dustin's `layer_scores=keys` option on the GPU (issue 15: >= 99 % agreement at 25 % met at 8k on the CPU with
# key_rank=32; its speed was not measured). (1) the ranking of one layer at 8k x B 64, torch vs the Triton kernels;
# (2) `specdec bench` at 8k x B 64 on two outside documents: dense, Dustin's default (5 %), Dustin at 25 % with its
# default per-pass set and with layer_scores=keys (key_rank=32), interleaved with dense.
# Third call of the usual three (wheels + model part a, part b, part c + .heldout).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 benchmarks/gpu/keyrank_time.py --batch 64 --context 8000 --rank 32 --out $OUT/keyrank_b64.json
timeout 60 python3 benchmarks/gpu/keyrank_time.py --batch 1 --context 8000 --rank 32 --out $OUT/keyrank_b1.json
KEYS=dustin:layer_share=1.0:layer_scores=keys:key_rank=32
timeout ${LIMIT1:-150} python3 -m specdec bench --methods dense,dustin \
  --contexts 8000 --batch-sizes 64 --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
  --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r --tag gpu_dustin_default_2026-12-06 \
  > $OUT/b64_default.log 2>&1
echo default rc=$?
grep -v "━" $OUT/b64_default.log | grep "|" | cut -c1-230
timeout ${LIMIT2:-300} python3 -m specdec bench --methods dense,$KEYS,dustin --budget-ratio 0.25 \
  --contexts 8000 --batch-sizes 64 --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
  --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r --tag gpu_dustin_keys_2026-12-06 \
  > $OUT/b64_keys.log 2>&1
echo keys rc=$?
grep -v "━" $OUT/b64_keys.log | grep "|" | cut -c1-230
tail -n 5 $OUT/b64_keys.log
