#!/usr/bin/env bash
# The project's test command: unit + integration tests (Triton kernels under the interpreter),
# the docs site in strict mode, and the tutorials executed top to bottom (small settings).
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1 SPECDEC_CI_SMALL=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
.venv/bin/python -m pytest -q -ra "$@"
# strict docs build WITHOUT -q: -q hides the warnings that --strict turns into a failure
if [ -f mkdocs.yml ]; then .venv/bin/mkdocs build --strict; fi
if [ -x scripts/run_tutorials.sh ]; then bash scripts/run_tutorials.sh; fi
