"""Dustin on the CPU: fidelity of sparse verification vs dense on the embedded model (EarlyExitDrafter).

Writes ``benchmarks/results/cpu_dustin_<date>.json`` and ``.md`` (rewritten after every run, so a
partial result survives an interrupted job). Run it niced in the background::

    nice -n 5 /work/venv/bin/python benchmarks/dustin_cpu.py --srh benchmarks/results/cpu_dustin_srh_smollm2.json \
        --context 4096 --documents pydoc,stdlib:argparse,stdlib:typing --budgets 512,1024 \
        --max-new-tokens 64 --passkey-trials 4 > /tmp/dustin_bench.log 2>&1 &
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

from specdec.fidelity import markdown, run_fidelity, summarize
from specdec.models import SpecdecModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--srh", required=True, help="SRH artifact from `specdec profile-srh`")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--documents", default="pydoc,stdlib:argparse,stdlib:typing")
    ap.add_argument("--budgets", default="512,1024")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--passkey-trials", type=int, default=4)
    ap.add_argument("--valve-every", type=int, default=4, help="dense_every of the safety-valve variant (0 = skip)")
    ap.add_argument("--out", default=None, help="output prefix (default benchmarks/results/cpu_dustin_<date>)")
    a = ap.parse_args()

    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    prefix = Path(a.out or f"benchmarks/results/cpu_dustin_{date}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(x) for x in ["python", *sys.argv])
    srh = json.loads(Path(a.srh).read_text())
    variants = {"static": ("dustin", {"srh": a.srh}), "adaptive": ("dustin-adaptive", {"srh": a.srh})}
    if a.valve_every:
        variants[f"static+dense_every={a.valve_every}"] = ("dustin", {"srh": a.srh, "dense_every": a.valve_every})
    meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), model="smollm2-135m (float32, CPU)",
                drafter=f"EarlyExitDrafter({srh['draft'].get('early_exit_layers')} layers)", context=a.context,
                budgets=a.budgets, gamma=a.gamma, max_new_tokens=a.max_new_tokens,
                srh=dict(target_heads=srh["target_heads"], draft_heads=srh["draft_heads"], m_ratio=srh["m_ratio"]))
    model = SpecdecModel.from_pretrained("smollm2-135m")
    rows: list = []
    t0 = time.time()

    def write(result) -> None:
        payload = dict(meta=meta, command=command, summary=summarize(result), srh_profile=dict(
            arr_per_layer_srh=srh.get("arr_per_layer_srh"), arr_per_layer_full_signals=srh.get("arr_per_layer_full_signals"),
            calibration=srh.get("calibration")), elapsed_s=time.time() - t0, **result)
        prefix.with_suffix(".json").write_text(json.dumps(payload, indent=1))
        prefix.with_suffix(".md").write_text(markdown(result, command, meta))

    def on_row(row) -> None:
        rows.append(row)
        write(dict(rows=rows, passkey=[], passkey_accuracy={}))

    log = lambda s: print(f"[{time.time() - t0:7.0f}s] {s}", flush=True)  # noqa: E731
    res = run_fidelity(model, [d for d in a.documents.split(",") if d], a.context, [int(b) for b in a.budgets.split(",")],
                       variants, a.gamma, a.max_new_tokens, a.passkey_trials, log=log, on_row=on_row)
    write(res)
    log("done")


if __name__ == "__main__":
    main()
