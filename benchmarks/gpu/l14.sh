#!/usr/bin/env bash
# l14 / l14b (issue 14): the 8B sparse draft step against its roofline, ONE process on ONE H200, <= 4 minutes
# (hard limits inside: `timeout 140` on the steps, `timeout 80` on the GPU tests). Random weights, Llama-3.1-8B
# shape, B 16 x 32k, bf16, triton, CUDA graphs, fused kernels; roofline from the copy bandwidth measured at the
# start of the same run (benchmarks/e2e_gpu.copy_bandwidth).
#   bash benchmarks/gpu/l14.sh           # GPU, l14b: programmatic dependent launch off vs on (part 'pdl' of
#                                        #   benchmarks/gpu/issue14.py): dense, sparse 5 % and verify steps, each
#                                        #   variant in its own CUDA-graph cache, replays interleaved (5 rounds x 4,
#                                        #   order alternating: medians of 20), kernel count per step, logits and
#                                        #   KV cache off == on; then the GPU parity tests of PDL
#                                        #   -> $OUT/l14/issue14.{md,json}, run.log, pytest_pdl.log; $OUT/l14.tgz
#   bash benchmarks/gpu/l14.sh --levers  # GPU, l14's sweep (2026-12-01 20:41 UTC, gpu_8b_steps_2026-12-01e.md):
#                                        #   the default before l14 vs each lever, sequential variants, medians of 15
#   bash benchmarks/gpu/l14.sh --smoke   # CPU (Triton interpreter, tiny shape), < 2 minutes: part 'pdl' (PDL is
#                                        #   never active on the CPU: both rows are the same code) + tests/test_pdl.py
# --levers variants (benchmarks/gpu/issue14.py; dense + verify + sparse for the first two, sparse only for the rest):
#   fused_kernels_split2        the default before l14 (o_proj / qkv in 2 slices, one down GEMM + cuBLAS split-K reduce)
#   fused_kernels_split2_down2  lever 1, the default since l14 (fusion.DOWN_SPLITS = 2, guarded for hidden-state readers)
#   ..._down2_fused_combine     lever 2: the split-K attention's combine done by the last program of each pair
#   ..._down2_sparse_{c2,c8,s3,w8,c2_fc}  lever 3: launch rows of the sparse kernel (splits, stages, warps)
set -u
OUT=${OUT:-/tmp/l14_out}
D="$OUT/l14"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
V=fused_kernels_split2,fused_kernels_split2_down2,fused_kernels_split2_down2_fused_combine
V=$V,fused_kernels_split2_down2_sparse_c2,fused_kernels_split2_down2_sparse_c2_fc,fused_kernels_split2_down2_sparse_s3
V=$V,fused_kernels_split2_down2_sparse_w8,fused_kernels_split2_down2_sparse_c8
case "${1:-}" in
  --smoke)
    export TRITON_INTERPRET=1
    timeout 100 $PY benchmarks/gpu/issue14.py --smoke --parts pdl --pdl-rounds 2 --pdl-per-round 1 --out "$D" \
      > "$D/run.log" 2>&1; echo "pdl exit $? at ${SECONDS}s"
    timeout 40 $PY -m pytest -q -p no:cacheprovider tests/test_pdl.py > "$D/pytest_pdl.log" 2>&1
    echo "tests exit $?: $(tail -n 1 "$D/pytest_pdl.log")"
    ;;
  --levers)
    timeout 170 $PY benchmarks/gpu/issue14.py --parts steps --step-shapes llama-3.1-8b --variants $V --no-vegas-costs \
      --budget-s 130 --out "$D" > "$D/run.log" 2>&1; echo "steps exit $? at ${SECONDS}s"
    ;;
  *)
    timeout 140 $PY benchmarks/gpu/issue14.py --parts pdl --step-shapes llama-3.1-8b --budget-s 100 --out "$D" \
      > "$D/run.log" 2>&1; echo "pdl exit $? at ${SECONDS}s"
    SPECDEC_TEST_DEVICE=cuda timeout 80 $PY -m pytest -q -rs -p no:cacheprovider tests/test_pdl_gpu.py tests/test_pdl.py \
      > "$D/pytest_pdl.log" 2>&1
    rc=$?; [ $rc -eq 124 ] && echo "pytest: stopped at the 80 s limit" >> "$D/pytest_pdl.log"
    echo "PDL tests rc=$rc: $(tail -n 1 "$D/pytest_pdl.log")"
    ;;
esac
tar czf "$OUT/l14.tgz" -C "$OUT" l14
[ -f "$D/issue14.md" ] && head -c 6000 "$D/issue14.md"
tail -n 5 "$D/run.log"
exit 0
