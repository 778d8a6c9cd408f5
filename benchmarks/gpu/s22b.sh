# Session 2026-12-04d, first machine, fourth call: the same `specdec bench` on an outside prose document (GFDL-1.3 +
# MPL-2.0 + Apache-2.0 from /usr/share/common-licenses, carried in .heldout/) without the HF baselines; then γ 8 (fixed)
# against γ 4 (fixed) for MagicDec and Vegas at B 64 on both documents. /tmp/m/smol.gguf was joined by s22a.sh.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
mkdir -p $OUT/r
C="--contexts 8000 --max-new-tokens 96 --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r"
timeout 250 python3 -m specdec bench --methods dense,magicdec,vegas,quest,dustin --batch-sizes 64,16,1 --gamma 4 \
  --documents .heldout/licenses_gfdl_mpl2_apache.txt --dense-text $C --tag gpu_bench_gfdl_2026-12-04 > $OUT/b.log 2>&1
echo rc=$?
grep -v "━" $OUT/b.log | tail -22
for g in 4 8; do
  timeout 150 python3 -m specdec bench --methods dense,magicdec,vegas --batch-sizes 64 --gamma $g --no-adaptive \
    --documents .heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt $C --tag gpu_gamma${g}_fixed_2026-12-04 > $OUT/g$g.log 2>&1
  echo rc=$?
  grep -v "━" $OUT/g$g.log | tail -9
done
