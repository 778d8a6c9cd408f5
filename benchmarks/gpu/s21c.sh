# Session 2026-12-04c, second machine: TRITON_SELECT = "auto" (radix16 select; /tmp/auto = this tree with that default)
# vs the default torch top-k (this tree), Vegas on five outside documents at B 64, two at B 16, one at B 1.
# Carried with the third call, after .whl + .model/a and .model/b.
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
rm -rf /tmp/auto && mkdir /tmp/auto && cp -r specdec /tmp/auto/ && \
  sed -i 's/^TRITON_SELECT: bool | str = False$/TRITON_SELECT: bool | str = "auto"/' /tmp/auto/specdec/selectors/base.py
grep -n '^TRITON_SELECT' /tmp/auto/specdec/selectors/base.py specdec/selectors/base.py
H=.heldout
D=$H/click_core.py,$H/licenses_gpl3_lgpl21.txt,$H/licenses_gfdl_mpl2_apache.txt,$H/numpy_function_base_impl.py,$H/hypothesis_core.py
timeout 330 python3 benchmarks/gpu/code_ab.py --trees torch=.,auto=/tmp/auto --out $OUT/s64 --documents $D \
  --methods vegas --rounds 2 --repeats 3 > $OUT/s64.log 2>&1
tail -16 $OUT/s64.log
timeout 130 python3 benchmarks/gpu/code_ab.py --trees torch=.,auto=/tmp/auto --out $OUT/s16 --documents $H/click_core.py,$H/licenses_gfdl_mpl2_apache.txt \
  --methods vegas --batch 16 --rounds 2 --repeats 3 > $OUT/s16.log 2>&1
tail -8 $OUT/s16.log
timeout 110 python3 benchmarks/gpu/code_ab.py --trees torch=.,auto=/tmp/auto --out $OUT/s1 --documents $H/licenses_gfdl_mpl2_apache.txt \
  --methods vegas --batch 1 --rounds 2 --repeats 3 > $OUT/s1.log 2>&1
tail -7 $OUT/s1.log
cd $OUT && tar czf sel.tgz s64 s16 s1 *.log && rm -rf s64 s16 s1 *.log
