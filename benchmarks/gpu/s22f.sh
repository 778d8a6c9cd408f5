# Session 2026-12-04d, third machine, third call: B 1 and B 16 on the prose document where timed calls had captured
# graphs (min 101 and 1,815 tokens/s), with `specdec bench`'s warm-up now running SpeculativeEngine.warm_up first.
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 130 python3 -m specdec bench --methods dense,magicdec,vegas,quest --contexts 8000 --batch-sizes 16,1 \
  --documents .heldout/licenses_gfdl_mpl2_apache.txt --max-new-tokens 96 --gamma 4 \
  --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r \
  --tag gpu_bench_warm_up_2026-12-04 > $OUT/f.log 2>&1
echo rc=$?
grep -v "━" $OUT/f.log | tail -18
