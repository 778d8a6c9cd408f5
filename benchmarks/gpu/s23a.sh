# Session 2026-12-04e, third call (after .whl + .model/a and .model/b): `specdec bench` with each method's timed runs
# alternating with dense's (--interleave, the new default), B 1 and 16, 8k of two outside documents (click's core.py;
# GFDL-1.3 + MPL-2.0 + Apache-2.0), lossless methods, adaptive γ as shipped, 5 timed runs per row.
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 560 python3 -m specdec bench --methods dense,magicdec,vegas,quest --contexts 8000 --batch-sizes 1,16 \
  --documents .heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt --max-new-tokens 96 --gamma 4 \
  --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 5 --output-dir $OUT/r \
  --tag gpu_interleaved_b1_b16_2026-12-04 > $OUT/a.log 2>&1
echo rc=$?
grep -v "━" $OUT/a.log | tail -24
