# Session 2026-12-04d, second machine, fourth call: the Llama-3.1-8B shape (random weights, B 16 x 32k, CUDA graphs,
# fused kernels) replaying acceptance recorded the way a user records it (`specdec generate --record-acceptance`) by
# MagicDec and Vegas on the embedded model over 8k of each outside document, γ 8, 5 % budget. /tmp/m/smol.gguf was
# joined by s22c.sh.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
mkdir -p $OUT/r $OUT/tr
for d in click:.heldout/click_core.py gfdl:.heldout/licenses_gfdl_mpl2_apache.txt; do
  for m in magicdec vegas; do
    timeout 60 python3 -m specdec generate --prompt-file ${d#*:} --model /tmp/m/smol.gguf --method $m --context-tokens 8000 \
      --max-new-tokens 96 --batch-size 4 --gamma 8 --budget-ratio 0.05 --no-compile \
      --record-acceptance $OUT/tr/${d%%:*}_$m.json --output-json $OUT/tr/${d%%:*}_${m}_out.json 2>&1 | tail -1
  done
done
for d in click gfdl; do
  timeout 170 python3 -m specdec bench --shape llama-3.1-8b --methods dense,magicdec,vegas --contexts 32768 --batch-sizes 16 \
    --max-new-tokens 64 --gamma 8 --budget-ratio 0.05 --no-compile --repeats 3 \
    --acceptance-trace magicdec=$OUT/tr/${d}_magicdec.json,vegas=$OUT/tr/${d}_vegas.json \
    --output-dir $OUT/r --tag gpu_replay_8b_${d}_2026-12-04 > $OUT/rep_$d.log 2>&1
  echo rc=$?
  grep -v "━" $OUT/rep_$d.log | tail -6
done
rm -f $OUT/tr/*_out.json
