# Session 2026-12-04d, second machine, third call (after .whl + .model/a and .model/b): one `specdec bench` over two
# outside documents (click's core.py; GFDL-1.3 + MPL-2.0 + Apache-2.0), every method at 8k, B 64 / 16 / 1, both HF
# baselines, Dustin also on dense's text, adaptive γ as shipped — the run the Benchmarks page's summary reads.
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 570 python3 -m specdec bench --methods dense,magicdec,vegas,quest,dustin --contexts 8000 --batch-sizes 64,16,1 \
  --documents .heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt --max-new-tokens 96 --gamma 4 \
  --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --hf-baseline --dense-text --repeats 3 --output-dir $OUT/r \
  --tag gpu_bench_2026-12-04 > $OUT/c.log 2>&1
echo rc=$?
grep -v "━" $OUT/c.log | tail -36
