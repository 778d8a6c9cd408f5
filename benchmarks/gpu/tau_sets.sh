#!/usr/bin/env bash
# τ of EAGLE heads on both document sets of gpu_eagle_v6_2026-12-03.md at once (tau_parallel.sh twice, 24 CPU
# processes): the development set (.devdocs) and the evaluation set (.taudocs).
#   GGUF=/tmp/m/smol.gguf HEADS="g=/tmp/eagle_v4/g/smollm2-135m-eagle-gpu.safetensors" LOOKUP="2,4,4" \
#     bash benchmarks/gpu/tau_sets.sh                     # $OUT/dev/, $OUT/eval/ (tau.tgz + the printed means)
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GGUF:?}" "${OUT:?}" "${HEADS:?}"
DEV="license:GPL-1=prose:GPL-1.txt license:GPL-2=prose:GPL-2.txt license:LGPL-3=prose:LGPL-3.txt"
DEV+=" license:MPL-1.1=prose:MPL-1.1.txt license:CC0-1.0=prose:CC0-1.0.txt gcc/README.Bugs=prose:gcc_readme_bugs.txt"
DEV+=" transformers/generation/utils.py=code:hf_generation_utils.py torch/nn/modules/module.py=code:torch_module.py"
DEV+=" requests/sessions.py=code:requests_sessions.py rich/console.py=code:rich_console.py"
DEV+=" typer/main.py=code:typer_main.py matplotlib/axes/_base.py=code:mpl_axes_base.py"
mkdir -p "$OUT/dev" "$OUT/eval"
DOCS=.devdocs SPECS="$DEV" TAU_DIR=/tmp/tau_dev OUT="$OUT/dev" bash benchmarks/gpu/tau_parallel.sh >"$OUT/dev/means.txt" 2>&1 &
a=$!
sleep 5  # its shim link and the model cache first (the cache is built under a lock anyway)
DOCS=.taudocs TAU_DIR=/tmp/tau_eval OUT="$OUT/eval" bash benchmarks/gpu/tau_parallel.sh >"$OUT/eval/means.txt" 2>&1 &
b=$!
rc=0
wait $a || rc=1
wait $b || rc=1
tail -n 8 "$OUT/dev/means.txt" "$OUT/eval/means.txt"
exit $rc
