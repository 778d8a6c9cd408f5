# Session 2026-12-04f, nvidia-h200-x2, a second machine (only .whl carried): in s24c.sh's call the two-GPU runs
# (tests/test_parallel_gpu.py, `specdec bench --tp 2`) hit their time limits although the bench had written every
# row: find where the ranks stand (stacks dumped by faulthandler), then the Llama-3.1-8B shape on one GPU and on two:
# the all-reduces alone (tp_allreduce.py), dense / MagicDec / Vegas replaying click's window traces (γ 8, 5 %) at
# 32k: one GPU at B 16 (B 32 does not fit one H200), two at B 16 and 32.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
mkdir -p $OUT/r $OUT/logs
date +%T.%N
timeout 45 torchrun --nproc-per-node 2 benchmarks/gpu/tp_allreduce.py --out $OUT/r/gpu_tp_allreduce_2026-12-04.json > /tmp/ar.log 2>&1; echo allreduce rc=$?
date +%T.%N; grep -v Warning /tmp/ar.log | tail -8
TP_DEVICE=cuda TP_STACKS_AFTER=80 timeout 100 torchrun --nproc-per-node 2 tests/helpers/tp_worker.py /tmp/w.json tiny-llama-kv3 > $OUT/logs/worker.log 2>&1; echo worker rc=$?
date +%T.%N; ls -la /tmp/w.json; head -c 600 /tmp/w.json; echo; grep -E "rank|File|Thread|Error" $OUT/logs/worker.log | head -40 | cut -c1-200
T=benchmarks/results/traces
R="--shape llama-3.1-8b --methods dense,magicdec,vegas --contexts 32768 --max-new-tokens 128 --gamma 8 --budget-ratio 0.05 \
  --no-compile --repeats 3 --output-dir $OUT/r \
  --acceptance-trace magicdec=$T/windows4_gamma8_click_core_magicdec_2026-12-04.json,vegas=$T/windows4_gamma8_click_core_vegas_2026-12-04.json"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m specdec bench $R --batch-sizes 16 --tag gpu_tp1_8b_2026-12-04 > $OUT/logs/e1.log 2>&1; echo tp1 rc=$?
date +%T.%N; grep -v "━" $OUT/logs/e1.log | tail -5 | cut -c1-300
FH_AFTER=230 timeout 250 torchrun --nproc-per-node 2 benchmarks/gpu/fh_run.py bench $R --batch-sizes 16,32 --tp 2 --tag gpu_tp2_8b_2026-12-04 > $OUT/logs/e2.log 2>&1; echo tp2 rc=$?
date +%T.%N; grep -v "━" $OUT/logs/e2.log | grep -E "wrote|\||Error|rank|File" | tail -30 | cut -c1-250
