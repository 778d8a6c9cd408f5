#!/usr/bin/env bash
# Execute every tutorials/*.ipynb top to bottom with nbclient; exit 1 if any notebook raises.
#   bash scripts/run_tutorials.sh                 # CI: small settings (SPECDEC_CI_SMALL=1), outputs discarded
#   bash scripts/run_tutorials.sh --write         # refresh the outputs stored in the notebooks (the site shows them)
#   bash scripts/run_tutorials.sh tutorials/01_pipeline.ipynb   # only these notebooks
#   bash scripts/execute_tutorials.sh [NOTEBOOK ...]            # the same as --write
# Per-notebook timeout: TUTORIAL_TIMEOUT seconds (default 600). Timings are printed per notebook.
# One thread (OMP/MKL) unless set. A notebook also fails when a cell writes to stderr (a warning, a
# progress bar): the site would show it as a red block. Hide known noise in the notebook itself,
# e.g. warnings.filterwarnings("ignore", message="IProgress not found") in the first cell.
# The docs build (docs/hooks/specdec_docs.py) refuses a notebook whose stored outputs are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export SPECDEC_CI_SMALL=${SPECDEC_CI_SMALL:-1} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
# the kernel picks the inline backend itself (figures stored in the notebook) unless MPLBACKEND is set
unset MPLBACKEND
exec "$PY" - "$@" <<'PYEOF'
import glob, os, sys, time
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

args = sys.argv[1:]
write = "--write" in args
paths = [a for a in args if a != "--write"] or sorted(glob.glob("tutorials/*.ipynb"))
timeout = int(os.environ.get("TUTORIAL_TIMEOUT", "600"))
if not paths:
    print("run_tutorials: no notebooks in tutorials/")
    sys.exit(0)
total, failed = 0.0, []
for path in paths:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": os.path.dirname(path) or "."}})
    t0 = time.perf_counter()
    try:
        client.execute()
        status = "ok"
        stderr = [(i, "".join(o.get("text", ""))) for i, c in enumerate(nb.cells) if c.cell_type == "code"
                  for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]
        if stderr:
            status = "FAILED"
            failed.append(path)
            i, text = stderr[0]
            print(f"--- {path}: cell {i} wrote to stderr (the site would show it as a red block); hide or fix it:\n"
                  f"{text[:2000]}", file=sys.stderr)
    except (CellExecutionError, CellTimeoutError) as exc:
        status = "FAILED"
        failed.append(path)
        print(f"--- {path} failed:\n{str(exc)[-4000:]}", file=sys.stderr)
    dt = time.perf_counter() - t0
    total += dt
    print(f"{status:6s} {dt:7.1f} s  {path}", flush=True)
    if write and status == "ok":
        nbformat.write(nb, path)
print(f"tutorials: {len(paths) - len(failed)}/{len(paths)} ok in {total:.1f} s")
sys.exit(1 if failed else 0)
PYEOF
