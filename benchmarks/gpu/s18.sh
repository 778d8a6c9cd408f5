#!/usr/bin/env bash
# Issue 18 (s18): our verify WITH sink_softmax scores vs FlashInfer's verify WITHOUT, side by side in one run,
# then the 8B capturable forms and the GPU parity tests of the peers in the time left. <= 5.5 minutes.
#
#   call 1, carry [".whl18/part1"]:  bash benchmarks/gpu/peers.sh install1
#   call 2, carry [".whl18/part2"]:  bash benchmarks/gpu/s18.sh          (same warm machine)
#   CPU check (no peers, interpreter, ~1 min):  bash benchmarks/gpu/s18.sh --smoke
#
# 1. unpack part2 into $SITE and check both peers import: `PARTS=none peers.sh run` (no tests, no bench, no e2e)
# 2. benchmarks/gpu/s18.py (peers.run_case machinery): 8B 1x128k, 8B 16x32k, SmolLM2 B 64/16/1 x 8k: ours plain +
#    launch variants, ours + sink_softmax (table launch, bf16 buffer, launch
#    variants), FlashInfer eager + CUDA-graph wrapper, FA4, SDPA; then decode at the 8B shapes (capturable forms)
#    -> $OUT/s18/{s18.md,results.json,results.md,log.txt}
# 3. tests/test_peers_gpu.py (the parity tests cut last time) + the new kernel variants' parity tests on the GPU,
#    in the time left -> $OUT/s18/pytest_*.log
# 4. $OUT/s18.tgz
set -uo pipefail
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site}
LIMIT=${LIMIT:-325}
mkdir -p "$OUT/s18"
if [ "${1:-}" = "--smoke" ]; then
    export PYTHONPATH=$PWD:${PYTHONPATH:-} TRITON_INTERPRET=1
    ${PY:-python3} benchmarks/gpu/s18.py --smoke --out "$OUT/s18"
    rc=$?
    tar czf "$OUT/s18.tgz" -C "$OUT" s18
    exit $rc
fi
t0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
OUT="$OUT/s18" PARTS=none LIMIT=60 timeout 90 bash benchmarks/gpu/peers.sh run > "$OUT/s18/install.log" 2>&1
echo "install rc=$? after $(( $(date +%s) - t0 )) s: $(cat "$OUT/s18/peers_import.txt" 2>/dev/null | tr '\n' ' ')"
export PYTHONPATH=$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
export MAX_JOBS=${MAX_JOBS:-16} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$(( $(left) - 120 )); [ "$B" -gt 200 ] && B=200
timeout $(( B + 45 )) python3 benchmarks/gpu/s18.py --out "$OUT/s18" --budget-s "$B" > "$OUT/s18/run.log" 2>&1
echo "s18.py rc=$? after $(( $(date +%s) - t0 )) s"
tail -n 45 "$OUT/s18/s18.md"
L=$(( $(left) - 10 ))
if [ "$L" -gt 30 ]; then
    SPECDEC_TEST_DEVICE=cuda timeout $(( L / 3 )) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py \
        -k "sink_softmax" > "$OUT/s18/pytest_kernels.log" 2>&1
    echo "kernel variant tests rc=$?: $(tail -n 1 "$OUT/s18/pytest_kernels.log")"
    L=$(( $(left) - 8 ))
    SPECDEC_TEST_DEVICE=cuda SPECDEC_REQUIRE_PEERS=1 timeout "$L" python3 -m pytest -q -rs -p no:cacheprovider \
        tests/test_peers_gpu.py > "$OUT/s18/pytest_peers.log" 2>&1
    prc=$?
    [ $prc -eq 124 ] && echo "pytest: stopped at the ${L} s limit; the tests without a result did not run" >> "$OUT/s18/pytest_peers.log"
    echo "peers tests rc=$prc: $(tail -n 2 "$OUT/s18/pytest_peers.log" | tr '\n' ' ')"
else
    echo "tests: skipped, only $L s left" | tee "$OUT/s18/tests_SKIPPED.txt"
fi
tar czf "$OUT/s18.tgz" -C "$OUT" s18
echo "s18.sh done after $(( $(date +%s) - t0 )) s"
