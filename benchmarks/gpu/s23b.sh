# Session 2026-12-04e, fourth call (the model joined at /tmp/m/smol.gguf by s23a.sh): the same interleaved
# `specdec bench` at B 64.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 560 python3 -m specdec bench --methods dense,magicdec,vegas,quest --contexts 8000 --batch-sizes 64 \
  --documents .heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt --max-new-tokens 96 --gamma 4 \
  --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 5 --output-dir $OUT/r \
  --tag gpu_interleaved_b64_2026-12-04 > $OUT/b.log 2>&1
echo rc=$?
grep -v "━" $OUT/b.log | tail -14
