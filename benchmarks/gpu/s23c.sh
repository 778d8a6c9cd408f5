# Session 2026-12-04e, fifth call: the Llama-3.1-8B shape (random weights, B 16 x 32k, CUDA graphs, fused kernels)
# replaying acceptance recorded by `specdec generate --record-acceptance` (MagicDec and Vegas on the embedded model,
# 7,900 tokens of each outside document + 256 new, batch 4, γ 8, 5 %), decoding 256 tokens per call (the earlier replay
# decoded 64: with τ ≈ 7 that is ~9 rounds, the last one cut short), dense alternating with each method.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf
mkdir -p $OUT/r $OUT/tr
for d in click:.heldout/click_core.py gfdl:.heldout/licenses_gfdl_mpl2_apache.txt; do
  for m in magicdec vegas; do
    timeout 60 python3 -m specdec generate --prompt-file ${d#*:} --model /tmp/m/smol.gguf --method $m \
      --context-tokens 7900 --max-new-tokens 256 --batch-size 4 --gamma 8 --budget-ratio 0.05 --no-compile \
      --record-acceptance $OUT/tr/${d%%:*}_$m.json --output-json /tmp/${d%%:*}_${m}_out.json 2>&1 | tail -1
  done
done
for d in click gfdl; do
  timeout 230 python3 -m specdec bench --shape llama-3.1-8b --methods dense,magicdec,vegas --contexts 32768 \
    --batch-sizes 16 --max-new-tokens 256 --gamma 8 --budget-ratio 0.05 --no-compile --repeats 3 \
    --acceptance-trace magicdec=$OUT/tr/${d}_magicdec.json,vegas=$OUT/tr/${d}_vegas.json \
    --output-dir $OUT/r --tag gpu_replay_8b_256_${d}_2026-12-04 > $OUT/rep_$d.log 2>&1
  echo rc=$?
  grep -v "━" $OUT/rep_$d.log | tail -6
done
