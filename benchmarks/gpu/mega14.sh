#!/bin/bash
# The one-launch MLP half (benchmarks/gpu/mega14_kernel.py) against today's launches on the GPU: a few launch configs.
# Run from the repository root on the GPU machine with the wheels in .whl:  OUT=$OUT bash benchmarks/gpu/mega14.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
i=0
for tune in '{}' '{"block_n1": 16, "block_n2": 16}' '{"block_n1": 64, "block_n2": 64}' '{"num_warps": 8}' '{"block_k1": 128, "block_k2": 128}'; do
  i=$((i+1))
  echo "== tune $tune"
  v=kernels,fused_gemm,mega,mega2,mega_d1,mega_d4; [ $i -gt 1 ] && v=kernels,mega,mega_d4
  timeout 150 python3 benchmarks/gpu/mega14.py --tune "$tune" --variants $v --out $OUT/mega14_$i.json || echo "exit $?"
done
