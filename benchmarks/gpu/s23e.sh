# Session 2026-12-04e, third machine, third call (after .whl + .model/a and .model/b): the interleaved `specdec bench`
# again, now with turns (each an untimed run, then a timed one: no timed run is the first after the other engine's;
# the first interleaved run had dense runs right after a MagicDec run up to 7 % slower at B 16), B 64 / 16 / 1.
set -x
cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 570 python3 -m specdec bench --methods dense,magicdec,vegas,quest --contexts 8000 --batch-sizes 64,16,1 \
  --documents .heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt --max-new-tokens 96 --gamma 4 \
  --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 5 --output-dir $OUT/r \
  --tag gpu_interleaved_turns_2026-12-04 > $OUT/e.log 2>&1
echo rc=$?
grep -v "━" $OUT/e.log | tail -28
