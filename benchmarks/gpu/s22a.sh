# Session 2026-12-04d, first machine, third call (after .whl + .model/a and .model/b): a fresh `specdec bench` at 8k
# on an outside code document (click's core.py, carried in .heldout/), every method at B 64 / 16 / 1 with both Hugging
# Face baselines (default and static-cache generate, each warmed up at the same shape), adaptive γ as shipped.
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 540 python3 -m specdec bench --methods dense,magicdec,vegas,quest,dustin --contexts 8000 --batch-sizes 64,16,1 \
  --documents .heldout/click_core.py --max-new-tokens 96 --gamma 4 --budget-ratio 0.05 --model /tmp/m/smol.gguf \
  --no-compile --hf-baseline --dense-text --repeats 3 --output-dir $OUT/r --tag gpu_bench_click_2026-12-04 > $OUT/a.log 2>&1
echo rc=$?
grep -v "━" $OUT/a.log | tail -30
