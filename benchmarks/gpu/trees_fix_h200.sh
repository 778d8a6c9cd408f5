# Draft trees after the kernel's per-tile tree test, the head's tree attention on the kernel and the batched LM head
# (2026-12-05, second session). Third call of the usual three (wheels + model part a, part b, part c + .heldout):
# (1) the draft phase and the verify kernels by phase, tree vs chain, B 16 x 8k (click), as the profile before;
# (2) tree vs chain vs dense at 8k, B 16 and 64, both outside documents, three timed runs interleaved with dense.
# `bash benchmarks/gpu/trees_fix_h200.sh bench`: (2) only, tagged gpu_trees_fix2 (after the tree round's host read).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
TAG=gpu_trees_fix_2026-12-05
[ "$1" = bench ] && TAG=gpu_trees_fix2_2026-12-05
[ "$1" = bench ] || for m in dustin:verify=dense:tree=true dustin:verify=dense; do
  d=$OUT/prof_$(echo $m | tr ':=' '__')
  timeout 120 python3 benchmarks/gpu/dustin_draft_profile.py --gguf /tmp/m/smol.gguf --out $d --document .heldout/click_core.py \
    --method $m --context 8000 --batch 16 --top 25 > $d.log 2>&1; echo prof rc=$?
  grep -A12 "^graphs" $d.log | cut -c1-300; head -12 $d/profile.md | cut -c1-300
done
timeout 300 python3 -m specdec bench \
  --methods dense,dustin:verify=dense,dustin:verify=dense:tree=true \
  --contexts 8000 --batch-sizes 16,64 --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
  --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r --tag $TAG \
  > $OUT/b.log 2>&1
echo bench rc=$?
grep -v "━" $OUT/b.log | grep "|" | cut -c1-230
