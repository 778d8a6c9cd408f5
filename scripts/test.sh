#!/usr/bin/env bash
# The project's test command: unit + integration tests (Triton kernels under the interpreter),
# the docs site in strict mode, and the tutorials executed top to bottom (small settings).
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 SPECDEC_CI_SMALL=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
# one thread per process (tests/conftest.py sets it too): the pytest workers below already share the cores
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# the pytest passes run on SPECDEC_TEST_WORKERS pytest-xdist workers (default 2; 0: one process, no workers);
# worksteal: a worker that runs out of tests takes queued ones from the other (a few tests take minutes)
XDIST=(-n "${SPECDEC_TEST_WORKERS:-2}" --dist worksteal)
.venv/bin/python -m pytest -q -ra "${XDIST[@]}" "$@"
# the tests of the code that reaches into transformers' internals (fusion, tensor parallelism) against the GPU
# machine's transformers 5.17 too (scripts/setup.sh --test installs it in .compat/): a full run only
if [ $# -eq 0 ]; then
  if [ ! -d .compat/transformers-5.17/transformers ]; then
    echo "test.sh: .compat/transformers-5.17 is missing; run bash scripts/setup.sh --test first." >&2
    exit 1
  fi
  echo "[test] the fusion, fused-kernel and tensor-parallel tests against transformers 5.17 (not the slow ones)"
  PYTHONPATH=.compat/transformers-5.17 .venv/bin/python -m pytest -q -ra "${XDIST[@]}" -p no:cacheprovider -m "not slow" \
    tests/test_fusion.py tests/test_fused_kernels.py tests/test_triton_gemm.py tests/test_parallel.py
fi
# strict docs build WITHOUT -q: -q hides the warnings that --strict turns into a failure
if [ -f mkdocs.yml ]; then .venv/bin/mkdocs build --strict; fi
if [ -x scripts/run_tutorials.sh ]; then bash scripts/run_tutorials.sh; fi
