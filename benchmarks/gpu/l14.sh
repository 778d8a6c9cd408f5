#!/usr/bin/env bash
# l14 (issue 14): the 8B sparse draft step, today's default vs each lever, side by side in ONE process on ONE H200,
# <= 3 minutes (hard: `timeout 170` on the python run). Random weights, Llama-3.1-8B shape, B 16 x 32k, bf16, triton,
# CUDA graphs, fused kernels; graph-replayed medians of 15 (CUDA events), torch.profiler kernel tables, roofline from
# the copy bandwidth measured at the start of the same run (benchmarks/e2e_gpu.copy_bandwidth).
#   bash benchmarks/gpu/l14.sh           # GPU: -> $OUT/l14/issue14.{md,json}, run.log; $OUT/l14.tgz
#   bash benchmarks/gpu/l14.sh --smoke   # CPU (Triton interpreter, tiny shape), < 2 minutes
# Variants (benchmarks/gpu/issue14.py; dense + verify + sparse for the first two, sparse only for the rest):
#   fused_kernels_split2        the default before l14 (o_proj / qkv in 2 slices, one down GEMM + cuBLAS split-K reduce)
#   fused_kernels_split2_down2  lever 1, the default since l14 (fusion.DOWN_SPLITS = 2, guarded for hidden-state readers)
#   ..._down2_fused_combine     lever 2: the split-K attention's combine done by the last program of each pair
#   ..._down2_sparse_{c2,c8,s3,w8,c2_fc}  lever 3: launch rows of the sparse kernel (splits, stages, warps)
# Since the H200 run of 2026-12-01 20:41 UTC (benchmarks/results/gpu_8b_steps_2026-12-01e.md) the library's own
# sparse launch at this shape IS the c2_fc row (launch table SPARSE_LONG + FUSED_COMBINE_ROWS), so the first two
# variants' sparse steps now run it too; the lever rows pin their launch (fused_combine included) explicitly.
set -u
OUT=${OUT:-/tmp/l14_out}
D="$OUT/l14"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
V=fused_kernels_split2,fused_kernels_split2_down2,fused_kernels_split2_down2_fused_combine
V=$V,fused_kernels_split2_down2_sparse_c2,fused_kernels_split2_down2_sparse_c2_fc,fused_kernels_split2_down2_sparse_s3
V=$V,fused_kernels_split2_down2_sparse_w8,fused_kernels_split2_down2_sparse_c8
if [ "${1:-}" = "--smoke" ]; then
  export TRITON_INTERPRET=1
  timeout 110 $PY benchmarks/gpu/issue14.py --smoke --parts steps --variants $V --no-vegas-costs --out "$D" \
    > "$D/run.log" 2>&1; echo "steps exit $? at ${SECONDS}s"
else
  timeout 170 $PY benchmarks/gpu/issue14.py --parts steps --step-shapes llama-3.1-8b --variants $V --no-vegas-costs \
    --budget-s 130 --out "$D" > "$D/run.log" 2>&1; echo "steps exit $? at ${SECONDS}s"
fi
tar czf "$OUT/l14.tgz" -C "$OUT" l14
[ -f "$D/issue14.md" ] && head -c 6000 "$D/issue14.md"
tail -n 5 "$D/run.log"
exit 0
