# Sourced by heldout_curve.sh and layer_share_sweep.sh: teacher-forced Dustin runs of benchmarks/dustin_fidelity.py,
# each its own process in the background (float32, torch backend, 128 tokens per document).
#   TF_DIR=name; source benchmarks/gpu/tf_runs.sh "$@"   # sets OUT, creates $OUT/$TF_DIR; --smoke: the CPU, tiny model
#   run <label> <context> <budgets> <documents> <options JSON> [margins] &   ...; wait; tf_finish "<grep pattern>"
OUT=${OUT:-/tmp/${TF_DIR}_out}
mkdir -p "$OUT/$TF_DIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} SPECDEC_CACHE=${SPECDEC_CACHE:-/tmp/specdec_cache}
M=/tmp/m/smol.gguf; [ -f "$M" ] || M=smollm2-135m
DEV=cuda; EXTRA="--backend torch"; PY=${PY:-python3}; HARD=${HARD:-280}
if [ "${1:-}" = "--smoke" ]; then DEV=cpu; EXTRA="--smoke"; HARD=120; fi
TF_START=$(date +%s)
run() {  # label, context, budgets, documents, options, margins
  timeout -k 5 $HARD $PY benchmarks/dustin_fidelity.py $EXTRA --device $DEV --model "$M" --context "$2" --budgets "$3" \
    --documents "$4" --new-tokens 128 --tf-only --options "$5" ${6:+--margins $6} --budget-s $((HARD - 20)) \
    --out "$OUT/$TF_DIR/$1" > "$OUT/$TF_DIR/$1.log" 2>&1 || echo "$1: rc $?" | tee -a "$OUT/$TF_DIR/failures.txt"
}
tf_finish() {  # grep pattern of the summary rows to print; then the archive $OUT/$TF_DIR.tgz
  echo "wall $(( $(date +%s) - TF_START )) s" | tee "$OUT/$TF_DIR/wall.txt"
  for f in "$OUT/$TF_DIR"/*/fidelity.md; do echo "== $f"; grep -E "$1" "$f" | head -12; done
  tar -czf "$OUT/$TF_DIR.tgz" -C "$OUT" "$TF_DIR"
}
