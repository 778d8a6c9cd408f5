# Smaller draft trees (2026-12-05, third session): the chain, the default tree (16 nodes + 4-node lookup branch =
# 21 rows) and the 8-node ranked tree (DraftTree.top(8) + branch = 13 rows) against dense at 8k, B 16 and 64, both
# outside documents, three timed runs interleaved with dense. Also the first GPU reading of the tree round after its
# host read was removed (5844ac9). Third call of the usual three (wheels + model part a, part b, part c + .heldout).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/r
for B in ${BATCHES:-16 64}; do
  timeout ${LIMIT:-270} python3 -m specdec bench \
    --methods dense,dustin:verify=dense,dustin:verify=dense:tree=true,dustin:verify=dense:tree=8 \
    --contexts 8000 --batch-sizes $B --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt \
    --max-new-tokens 96 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r \
    --tag gpu_trees_small_b${B}_2026-12-05 > $OUT/b$B.log 2>&1
  echo bench B=$B rc=$?
  grep -v "━" $OUT/b$B.log | grep "|" | cut -c1-230
done
