# specdec eval's six tasks, Dustin (defaults, verification budget 25 %) against dense, with more samples than the
# 8 per task of 2026-12-01 / 12-04: 32 per task at 4,096 tokens and 16 at 8,000 (issue 15: "every eval task within
# 1 point of dense", "passkey / needle retrieval equal to dense at 4k and 8k"). float32, reference backend (the
# CLI's choice for eval), B = 1, greedy. Six processes side by side (two tasks each; the GPU and 16 cores are shared,
# no timing is read). METHOD=... picks another method entry (e.g. dustin:layer_share=1.0:layer_scores=keys:key_rank=32,
# 2026-12-06). Third call of the usual three (wheels + model part a, part b, part c + .heldout).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/e
for ctx in 4096 8000; do
  n=$([ $ctx = 4096 ] && echo ${S4:-32} || echo ${S8:-16})
  for tasks in passkey,niah_single niah_multikey,niah_multivalue variable_tracking,common_words; do
    tag=${ctx}_${tasks%%,*}
    timeout ${LIMIT:-520} python3 -m specdec eval --methods ${METHOD:-dustin} --tasks $tasks --context-tokens $ctx --samples $n \
      --budget-ratio 0.25 --documents '' --device cuda --model /tmp/m/smol.gguf \
      --output-json $OUT/e/$tag.json --output-md $OUT/e/$tag.md > $OUT/e/$tag.log 2>&1 &
  done
done
wait
for f in $OUT/e/*.md; do echo "== $f"; grep "|" $f | head -12; done
tail -n 3 $OUT/e/*.log
