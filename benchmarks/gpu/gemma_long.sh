#!/usr/bin/env bash
# Issue 16 item 5: Gemma 3 270M at 16k and 32k on one H200 — dense, magicdec, vegas, quest, dustin at
# B = 1, 8, 32: tau, tok/s, dense step vs the roofline of the bytes it actually reads (local layers
# read only their 512-token window), KV bytes held; plus float32 parity with HF generate at 16k.
#
# The model (253 MB GGUF) exceeds one call's 64 MiB carry: it travels as 6 pieces of 45 MB in the
# ignored folder .model/ (kept on the warm machine between calls), then is joined and checked.
#
#   here:   bash benchmarks/gpu/gemma_long.sh prepare          # .model/gemma.part-0..5, .whl/ (pydantic)
#   device: 6 calls, one piece each (carry ".model/gemma.part-N", command "bash benchmarks/gpu/gemma_long.sh has N")
#   device: carry [".whl"], command "bash benchmarks/gpu/gemma_long.sh run 16384"   (≤ 9.5 min; results in $OUT)
#   device: same with "run 32768", then "parity" (float32 HF-generate parity at 16k, ≤ 5 min)
#   Each e2e run is capped at 270 s and saves its JSON after every row, so a slow one still reports.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
case "${1:-}" in
prepare)
  mkdir -p .model .whl
  src=$(.venv/bin/python -c "from specdec.models import embedded_model_path; print(embedded_model_path('gemma3-270m'))")
  split -b 45M -d -a 1 "$src" .model/gemma.part-
  ls -la .model
  .venv/bin/python -m pip download -q -d .whl --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 pydantic pydantic-core annotated-types typing-inspection typing-extensions
  du -sh .whl ;;
has)
  ls -la .model ;;
run|parity)
  ctxs=${2:-16384}
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
  python3 -c "import pydantic" 2>/dev/null || python3 -m pip install -q --no-index --find-links .whl pydantic
  cat .model/gemma.part-? > .model/gemma-3-270m-q4_k_m.gguf
  echo "$SHA  .model/gemma-3-270m-q4_k_m.gguf" | sha256sum -c -
  export PYTHONPATH=$PWD SPECDEC_CACHE=$PWD/.model/cache
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee "$OUT/versions.txt"
  # the loader on this transformers version: layout read back from the de-quantized config
  python3 - <<'PY' | tee "$OUT/layout.txt"
from specdec.models import load_hf, model_dims
hf, tok = load_hf(".model/gemma-3-270m-q4_k_m.gguf", "bfloat16", "cuda")
d = model_dims(hf.config)
print(type(hf).__name__, d)
assert d.n_global == 3 and d.windows[0] == 512, "unexpected Gemma 3 layout on this transformers version"
PY
  [ "$1" = run ] && for ctx in $ctxs; do
    for doc in long:prose long:code; do
      tag=$(echo "$doc" | tr ':' '_')
      timeout 270 python3 benchmarks/e2e_gpu.py --gguf .model/gemma-3-270m-q4_k_m.gguf --doc "$doc" \
        --context "$ctx" --batches 1,8,32 --methods dense,magicdec,vegas,quest,dustin --new 64 --gamma 4 \
        --budget-ratio 0.05 --backend triton --graphs 1 --hf 0 --out "$OUT/gemma_${ctx}_${tag}.json" \
        > "$OUT/gemma_${ctx}_${tag}.log" 2>&1 || echo "ctx $ctx $doc: exit $?" >> "$OUT/failures.txt"
      tail -n 12 "$OUT/gemma_${ctx}_${tag}.log"
    done
  done
  [ "$1" = parity ] || exit 0
  # float32 token-for-token parity with HF generate at 16k (torch backend, every lossless method)
  timeout 300 python3 benchmarks/gemma_cpu_parity.py --model .model/gemma-3-270m-q4_k_m.gguf --device cuda \
    --backend torch --context 16384 --new 32 --docs long:code --methods dense,magicdec,vegas,quest \
    --out "$OUT/gemma_parity_16k_fp32.json" > "$OUT/gemma_parity_16k.log" 2>&1 || echo "parity: exit $?" >> "$OUT/failures.txt"
  tail -n 6 "$OUT/gemma_parity_16k.log" ;;
*)
  echo "usage: $0 prepare | has N | run [contexts] | parity" >&2; exit 2 ;;
esac
