#!/usr/bin/env bash
# Issue 18 (s18): our verify WITH sink_softmax scores (the table's pick and the opt-in score paths: sink_anchors
# "pre", score_store "direct" / "lean") vs FlashInfer's verify WITHOUT, side by side and interleaved in
# one run, then the GPU parity tests of the new score stores in the time left. <= 4 minutes (LIMIT=240 s, hard:
# every step under `timeout`).
#
#   call 1, carry [".whl18/part1"]:  bash benchmarks/gpu/peers.sh install1
#   call 2, carry [".whl18/part2"]:  bash benchmarks/gpu/s18.sh          (same warm machine)
#   or FlashInfer alone, one call, carry [".whlfi"]:
#     bash benchmarks/gpu/peers.sh install_fi && S18_SKIP=install,peer_tests bash benchmarks/gpu/s18.sh
#   CPU check (no peers, interpreter, ~30 s):  bash benchmarks/gpu/s18.sh --smoke
#
# S18_SKIP (comma-separated, default none) leaves parts out: install (part2 already unpacked into $SITE this
# session), launch (s18.py pass 2), decode (the 8B capturable decode rows), kernel_tests, peer_tests.
#   e.g. S18_SKIP=install,decode,peer_tests bash benchmarks/gpu/s18.sh   (peers installed earlier this session)
#
# 1. unpack part2 into $SITE and check both peers import: `PARTS=none peers.sh run` (no tests, no bench, no e2e)
# 2. benchmarks/gpu/s18.py (peers.run_case machinery), per shape 8B 1x128k, 8B 16x32k, SmolLM2 B 64/16/1 x 8k:
#    ours plain, ours + sink_softmax (sink_table = the table's pick, sink_tile, sink_direct, sink_lean,
#    sink_pre_direct), FlashInfer eager + CUDA-graph wrapper; the same once more interleaved
#    (round-robin graph replays); then at 8B 1x128k the launch variants (ours); then decode at the 8B shapes
#    -> $OUT/s18/{s18.md,results.json,results.md,log.txt,run.log}
# 3. GPU parity tests: the score stores' kernel tests (the "direct" / "lean" PTX stores run only here, each
#    its own compile), then tests/test_peers_gpu.py, in the time left -> $OUT/s18/pytest_*.log
# 4. $OUT/s18.tgz
set -uo pipefail
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site}
LIMIT=${LIMIT:-240}
SKIP=",${S18_SKIP:-},"
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
skipped() { [[ "$SKIP" == *",$1,"* ]]; }
if skipped install; then
    echo "install: skipped (S18_SKIP)"
else
    OUT="$OUT/s18" PARTS=none LIMIT=60 timeout 90 bash benchmarks/gpu/peers.sh run > "$OUT/s18/install.log" 2>&1
    echo "install rc=$? after $(( $(date +%s) - t0 )) s: $(cat "$OUT/s18/peers_import.txt" 2>/dev/null | tr '\n' ' ')"
fi
export PYTHONPATH=$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
export MAX_JOBS=${MAX_JOBS:-16} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PYSKIP=""
for p in launch decode; do skipped $p && PYSKIP="$PYSKIP,$p"; done
RESERVE=15
skipped kernel_tests || RESERVE=$(( RESERVE + 50 ))
skipped peer_tests || RESERVE=$(( RESERVE + 60 ))
CAP=${S18_CAP:-230}  # the most seconds s18.py may take (a fresh FlashInfer JIT-compiles its kernels inside it)
B=$(( $(left) - RESERVE - 20 )); [ "$B" -gt "$CAP" ] && B=$CAP
timeout $(( B + 30 )) python3 benchmarks/gpu/s18.py --out "$OUT/s18" --budget-s "$B" --skip "${PYSKIP#,}" \
    > "$OUT/s18/run.log" 2>&1
echo "s18.py rc=$? after $(( $(date +%s) - t0 )) s (budget $B s)"
tail -n 30 "$OUT/s18/s18.md"
if ! skipped kernel_tests; then
    L=$(( $(left) - 10 )); skipped peer_tests || L=$(( L - 60 ))
    if [ "$L" -gt 20 ]; then
        SPECDEC_TEST_DEVICE=cuda timeout "$L" python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py \
            -k "fast_loop or lean_stores_reach or (sink_score_variants_match and tile-direct and dtype1) or table_score_path" \
            > "$OUT/s18/pytest_kernels.log" 2>&1
        krc=$?
        [ $krc -eq 124 ] && echo "pytest: stopped at the ${L} s limit" >> "$OUT/s18/pytest_kernels.log"
        echo "kernel variant tests rc=$krc: $(tail -n 1 "$OUT/s18/pytest_kernels.log")"
    else
        echo "kernel tests: skipped, only $L s left" | tee "$OUT/s18/kernel_tests_SKIPPED.txt"
    fi
fi
if ! skipped peer_tests; then
    L=$(( $(left) - 8 ))
    if [ "$L" -gt 20 ]; then
        SPECDEC_TEST_DEVICE=cuda SPECDEC_REQUIRE_PEERS=1 timeout "$L" python3 -m pytest -q -rs -p no:cacheprovider \
            tests/test_peers_gpu.py > "$OUT/s18/pytest_peers.log" 2>&1
        prc=$?
        [ $prc -eq 124 ] && echo "pytest: stopped at the ${L} s limit; the tests without a result did not run" >> "$OUT/s18/pytest_peers.log"
        echo "peers tests rc=$prc: $(tail -n 2 "$OUT/s18/pytest_peers.log" | tr '\n' ' ')"
    else
        echo "peer tests: skipped, only $L s left" | tee "$OUT/s18/peer_tests_SKIPPED.txt"
    fi
fi
tar czf "$OUT/s18.tgz" -C "$OUT" s18
echo "s18.sh done after $(( $(date +%s) - t0 )) s"
