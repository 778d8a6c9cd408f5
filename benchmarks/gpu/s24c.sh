# Session 2026-12-04f, nvidia-h200-x2, third call (after .whl + .model/a and .model/b): (1) the EAGLE state-leak fix
# (8732f9c) on the H200: hf_state.py --between dustin --probe on GPU 0 while the GPU tests run on GPU 1; (2) tensor
# parallelism on two GPUs for the first time: tests/test_parallel_gpu.py (NCCL, CUDA graphs per rank), then
# `specdec bench --tp 2` on the embedded model at 8k (every method's tokens against TP dense's) next to one GPU.
set -x
export PYTHONPATH=$PWD:/tmp/site PATH=$PATH:/tmp/site/bin PYTHONUNBUFFERED=1
ls -la /tmp/m/smol.gguf || cat /tmp/m/part_aa /tmp/m/part_ab .model/c/part_ac > /tmp/m/smol.gguf
md5sum /tmp/m/smol.gguf
nvidia-smi topo -m; env | grep -E "NVLS|MULTICAST" ; python3 -c "import torch; print(torch.cuda.device_count(), torch.cuda.nccl.version())"
mkdir -p $OUT/leak $OUT/r
(CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/gpu/hf_state.py --model /tmp/m/smol.gguf \
   --document .heldout/licenses_gfdl_mpl2_apache.txt --out $OUT/leak --between dustin --probe > /tmp/leak.log 2>&1; echo leak rc=$?) &
CUDA_VISIBLE_DEVICES=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_dustin_graphs.py \
  tests/test_eagle_graphs.py > /tmp/gputests.log 2>&1; echo gputests rc=$?
wait
grep -v Warning /tmp/leak.log | tail -8; tail -4 /tmp/gputests.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_parallel_gpu.py > /tmp/tpg.log 2>&1; echo tp_gpu_tests rc=$?
tail -25 /tmp/tpg.log | cut -c1-400
cp /tmp/leak.log /tmp/gputests.log /tmp/tpg.log $OUT/ 2>/dev/null
B="--methods dense,magicdec,vegas,quest --contexts 8000 --batch-sizes 64 --documents .heldout/licenses_gfdl_mpl2_apache.txt \
  --max-new-tokens 96 --gamma 4 --budget-ratio 0.05 --model /tmp/m/smol.gguf --no-compile --repeats 3 --no-adaptive --output-dir $OUT/r"
timeout 150 torchrun --nproc-per-node 2 -m specdec bench $B --tp 2 --tag gpu_tp2_smollm2_2026-12-04 > /tmp/tp2.log 2>&1; echo tp2 rc=$?
grep -v "━" /tmp/tp2.log | tail -12 | cut -c1-300
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m specdec bench $B --tag gpu_tp1_smollm2_2026-12-04 > /tmp/tp1.log 2>&1; echo tp1 rc=$?
grep -v "━" /tmp/tp1.log | tail -3 | cut -c1-300
python3 - <<'PY'
import json, os
o = os.environ["OUT"] + "/r/"
try:
    a = json.load(open(o + "gpu_tp2_smollm2_2026-12-04.json")); b = json.load(open(o + "gpu_tp1_smollm2_2026-12-04.json"))
    for ra, rb in zip(a["rows"], b["rows"]):
        print(ra["method"], "tp2 %.0f tok/s tau %.2f same_as_dense %s | tp1 %.0f tau %.2f | tp2 tokens == tp1 tokens: %s" % (
            ra["tokens_per_second"], ra["tau"], ra.get("same_tokens_as_dense"), rb["tokens_per_second"], rb["tau"],
            ra["tokens"] == rb["tokens"]))
except Exception as e:
    print("compare failed", e)
PY
