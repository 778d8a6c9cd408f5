# Session 2026-12-04e, sixth call: the 256-token traces of s23c.sh were mostly the embedded model's greedy loop (click:
# `type_value_default_default_…`; licenses: `Apache-2.0-in-all-containers-with-…`), where any recent window drafts well.
# Here the traces are the first 64 tokens after each of 4 windows of each document (ends 800 tokens apart,
# benchmarks/gpu/window_traces.py), replayed at the Llama-3.1-8B shape over 256 tokens per call (the rounds cycle), dense
# alternating with each method.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
mkdir -p $OUT/r $OUT/tr
for d in .heldout/click_core.py .heldout/licenses_gfdl_mpl2_apache.txt; do
  timeout 150 python3 benchmarks/gpu/window_traces.py --model /tmp/m/smol.gguf --document $d --methods magicdec,vegas \
    --windows 4 --stride 800 --context 8000 --new 64 --gamma 8 --budget-ratio 0.05 --out $OUT/tr 2>&1 | tail -2
done
for d in click_core licenses_gfdl_mpl2_apache; do
  timeout 200 python3 -m specdec bench --shape llama-3.1-8b --methods dense,magicdec,vegas --contexts 32768 \
    --batch-sizes 16 --max-new-tokens 256 --gamma 8 --budget-ratio 0.05 --no-compile --repeats 3 \
    --acceptance-trace magicdec=$OUT/tr/${d}_magicdec.json,vegas=$OUT/tr/${d}_vegas.json \
    --output-dir $OUT/r --tag gpu_replay_8b_windows_${d%%_*}_2026-12-04 > /tmp/rep_$d.log 2>&1
  echo rc=$?
  grep -v "━" /tmp/rep_$d.log | tail -4
done
