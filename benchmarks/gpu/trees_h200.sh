# Draft trees on one H200 (planned 2026-12-05; no GPU was lent that session, so not run yet). Third call of the usual
# three (wheels + model part a, part b, part c + .heldout): the GPU tests of the tree path first (the Triton kernel's
# tree mask compiled for real, the tree forward as a CUDA graph), then B = 1 and B = 16 side by side: dense, Dustin's
# drafting with dense verification as a chain, as a tree, and as a tree without prompt lookup (all lossless: every
# row must show "same tokens as dense" True), 1k / 4k / 8k contexts of two documents that are not in the repository.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
SPECDEC_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -x tests/test_gpu_graphs.py tests/test_kernels_triton.py \
  -k tree > $OUT/tests.log 2>&1
echo tests rc=$?
tail -5 $OUT/tests.log
timeout 360 python3 -m specdec bench \
  --methods dense,dustin:verify=dense,dustin:verify=dense:tree=true,dustin:verify=dense:tree=true:lookup_min=0 \
  --contexts 1024,4096,8000 --batch-sizes 1,16 \
  --documents .heldout/click_core.py,.heldout/licenses_gpl3_lgpl21.txt --max-new-tokens 96 \
  --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r --tag gpu_trees_2026-12-05 > $OUT/b.log 2>&1
echo rc=$?
grep -v "━" $OUT/b.log | tail -30 | cut -c1-260
