# Session 2026-12-04f, one H200 (the two-GPU kind was withdrawn after s24c.sh; s24e.sh never ran), third call: every
# method of the 8k table in one interleaved run after the EAGLE state-leak fix (8732f9c): dense, MagicDec, Vegas,
# Quest, Dustin (+ on dense's text), B 64 / 16 / 1, 4 windows of each outside document (τ over 4 continuations, not
# one greedy loop), shipped defaults (adaptive γ from 4, 5 %).
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
mkdir -p $OUT/r
timeout 570 python3 -m specdec bench --methods dense,magicdec,vegas,quest,dustin --dense-text --contexts 8000 \
  --batch-sizes 64,16,1 --windows 4 --window-stride 800 \
  --documents .heldout/click_core.py,.heldout/licenses_gfdl_mpl2_apache.txt --max-new-tokens 96 --gamma 4 \
  --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 3 --output-dir $OUT/r \
  --tag gpu_after_leak_fix_2026-12-04 > $OUT/f.log 2>&1
echo rc=$?
grep -v "━" $OUT/f.log | tail -34 | cut -c1-260
