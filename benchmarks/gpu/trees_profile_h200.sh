# Why draft trees ran at 0.25-0.95x dense on the H200 (benchmarks/results/gpu_trees_2026-12-05.md) while the chain
# ran at 1.07-1.90x: the tree's verify took 3.9 / 7.7 / 11.9 ms at B 16 x 1k / 4k / 8k against the chain's
# 1.2 / 1.6 / 2.0. Third call of the usual three. (1) kernels by phase, chain and tree, B 16 x 8k, with whether every
# forward replayed as a graph; (2) the same-tokens checks of that run in float32 (bf16 near-ties or a real defect?);
# the split-K kernel alone at the chain's and the tree's shapes.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
if [ "$1" != b64 ]; then
python3 benchmarks/gpu/tree_attention_time.py --batch 16 --context 8000 2>&1 | tail -5
python3 benchmarks/gpu/tree_attention_time.py --batch 1 --context 8000 2>&1 | tail -5
for m in dustin:verify=dense:tree=true dustin:verify=dense; do
  d=$OUT/prof_$(echo $m | tr ':=' '__')
  timeout 150 python3 benchmarks/gpu/dustin_draft_profile.py --gguf /tmp/m/smol.gguf --out $d --document .heldout/click_core.py \
    --method $m --context 8000 --batch 16 --top 25 > $d.log 2>&1; echo prof rc=$?
  grep -A12 "^graphs" $d.log | cut -c1-300; head -12 $d/profile.md | cut -c1-300
done
timeout 240 python3 -m specdec bench --dtype float32 \
  --methods dense,dustin:verify=dense,dustin:verify=dense:tree=true \
  --contexts 1024,8000 --batch-sizes 1,16 --documents .heldout/click_core.py --max-new-tokens 96 \
  --model /tmp/m/smol.gguf --no-compile --repeats 1 --output-dir $OUT/r --tag gpu_trees_fp32_2026-12-05 > $OUT/f.log 2>&1
echo fp32 rc=$?
grep -v "━" $OUT/f.log | grep "|" | cut -c1-230
fi
[ "$1" = b64 ] || exit 0
# (3) `bash benchmarks/gpu/trees_profile_h200.sh b64`, the next call: Dustin at issue 15's speed target shape (8k, B 64): the default (sparse verification) and the same drafts
# verified densely, as a chain and as a tree, next to dense, in one interleaved run
timeout 200 python3 -m specdec bench \
  --methods dense,dustin,dustin:verify=dense,dustin:verify=dense:tree=true \
  --contexts 8000 --batch-sizes 64 --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
  --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r --tag gpu_dustin_b64_2026-12-05 \
  > $OUT/b64.log 2>&1
echo b64 rc=$?
grep -v "━" $OUT/b64.log | grep "|" | cut -c1-230
