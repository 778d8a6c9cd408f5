#!/usr/bin/env bash
# Execute every tutorials/*.ipynb top to bottom with nbclient; exit 1 if any notebook raises.
#   bash scripts/run_tutorials.sh                 # CI: small settings (SPECDEC_CI_SMALL=1), outputs discarded
#   bash scripts/run_tutorials.sh --write         # refresh the outputs stored in the notebooks (the site shows them)
#   bash scripts/run_tutorials.sh tutorials/01_pipeline.ipynb   # only these notebooks
# Per-notebook timeout: TUTORIAL_TIMEOUT seconds (default 600). Timings are printed per notebook.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export SPECDEC_CI_SMALL=${SPECDEC_CI_SMALL:-1} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
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
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path) or "."}})
    t0 = time.perf_counter()
    try:
        client.execute()
        status = "ok"
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
