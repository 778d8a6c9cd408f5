"""Dustin on the CPU: SRH search + fidelity of sparse verification vs dense on the embedded model.

One prefill per document serves everything: the SRH calibration (probe points in the second half of
the context), then dense decoding and every Dustin variant. The SRH artifact is written next to the
results. Output: ``<out>.json`` / ``<out>.md`` (rewritten after every run, so a partial result
survives an interrupted job) and ``<out>_srh.json``. Run it niced in the background::

    nice -n 5 /work/venv/bin/python benchmarks/dustin_cpu.py --context 2048 \\
        --documents pydoc,stdlib:argparse --budgets 1024,512 --max-new-tokens 32 --passkey-trials 2 \\
        > /tmp/dustin_bench.log 2>&1 &
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

from specdec.data import context_ids, load_document
from specdec.drafters import EarlyExitDrafter
from specdec.engine import SpeculativeEngine
from specdec.fidelity import markdown, run_fidelity, summarize
from specdec.models import SpecdecModel
from specdec.srh import (RETRIEVAL_FILLER, Calibration, calibrate, greedy_search, model_identity, per_layer_signals,
                         load_srh, retrieval_calibration, save_srh, srh_report)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--documents", default="pydoc,stdlib:argparse")
    ap.add_argument("--budgets", default="1024,512")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=9)
    ap.add_argument("--calib-documents", default="stdlib:inspect,stdlib:tarfile",
                    help="prose/code documents for the SRH calibration (kept apart from --documents)")
    ap.add_argument("--retrieval", type=int, default=8, help="pass-key probes in the SRH calibration (0 = none)")
    ap.add_argument("--points", type=int, default=8, help="SRH calibration probe points per document")
    ap.add_argument("--srh", default=None, help="reuse this SRH artifact (skip the calibration and search)")
    ap.add_argument("--srh-budget", type=int, default=512, help="budget the SRH search optimises for")
    ap.add_argument("--max-heads", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--passkey-trials", type=int, default=2)
    ap.add_argument("--passkey-context", type=int, default=None)
    ap.add_argument("--valve-every", type=int, default=0, help="dense_every of a safety-valve variant (0 = skip)")
    ap.add_argument("--out", default=None, help="output prefix (default benchmarks/results/cpu_dustin_<date>)")
    a = ap.parse_args()

    t0 = time.time()
    log = lambda s: print(f"[{time.time() - t0:7.0f}s] {s}", flush=True)  # noqa: E731
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    prefix = Path(a.out or f"benchmarks/results/cpu_dustin_{date}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    srh_path = prefix.with_name(prefix.name + "_srh.json")
    command = " ".join(shlex.quote(x) for x in ["nice -n 5 python", *sys.argv])
    docs = [d for d in a.documents.split(",") if d]
    budgets = [int(b) for b in a.budgets.split(",")]

    model = SpecdecModel.from_pretrained("smollm2-135m")
    drafter = EarlyExitDrafter(model, a.draft_layers)
    dense = SpeculativeEngine(model, method="dense")
    prefills, cals = {}, []
    calib_docs = [d for d in a.calib_documents.split(",") if d] if not a.srh else []
    for doc in calib_docs:
        ids = context_ids(model.tokenizer, load_document(doc), a.context, offset=a.max_new_tokens + 16)
        cals.append(calibrate(model, drafter, ids, a.gamma, a.points))
        log(f"calibration {doc}: {len(ids)} tokens, {a.points} probe points")
    if a.retrieval and not a.srh:
        cals.append(retrieval_calibration(model, drafter, a.retrieval, a.context, a.gamma))
        log(f"calibration: {a.retrieval} pass-key probes ({RETRIEVAL_FILLER})")
    for doc in docs:
        ids = context_ids(model.tokenizer, load_document(doc), a.context, offset=a.max_new_tokens + 16)
        prefills[doc] = (ids, dense.prefill([ids]))
        log(f"{doc}: prefilled {len(ids)} tokens")
    if a.srh:  # reuse an artifact (e.g. profiled at another context): no calibration here
        srh = load_srh(a.srh, model, drafter)
        res = dict(target_heads=srh["target_heads"], draft_heads=srh["draft_heads"], m_ratio=srh["m_ratio"])
        srh_path = Path(a.srh)
        log(f"SRH from {a.srh}: target {res['target_heads']} draft {res['draft_heads']} m_ratio {res['m_ratio']}")
    else:
        srh, res = profile(a, model, drafter, cals, calib_docs, log)
        save_srh(srh_path, srh)

    opts = {"srh": str(srh_path), "draft_layers": a.draft_layers}
    variants = {"static": ("dustin", opts), "adaptive": ("dustin-adaptive", opts)}
    if a.valve_every:
        variants[f"static+dense_every={a.valve_every}"] = ("dustin", {**opts, "dense_every": a.valve_every})
    meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), model="smollm2-135m (float32, CPU)",
                drafter=f"EarlyExitDrafter({a.draft_layers} layers)", context=a.context, budgets=budgets, gamma=a.gamma,
                max_new_tokens=a.max_new_tokens, passkey_context=a.passkey_context or a.context,
                srh=dict(target_heads=res["target_heads"], draft_heads=res["draft_heads"], m_ratio=res["m_ratio"]))
    rows: list = []

    def write(result) -> None:
        payload = dict(meta=meta, command=command, summary=summarize(result), srh_profile={
            k: srh[k] for k in ("arr_per_layer_srh", "arr_per_layer_full_signals", "calibration", "search")},
            elapsed_s=time.time() - t0, **result)
        prefix.with_suffix(".json").write_text(json.dumps(payload, indent=1))
        prefix.with_suffix(".md").write_text(markdown(result, command, meta) + srh_markdown(srh))

    def on_row(row) -> None:
        rows.append(row)
        write(dict(rows=rows, passkey=[], passkey_accuracy={}))

    out = run_fidelity(model, docs, a.context, budgets, variants, a.gamma, a.max_new_tokens, a.passkey_trials, log=log,
                       on_row=on_row, prefills=prefills, passkey_context=a.passkey_context)
    write(out)
    log("done")


def profile(a, model, drafter, cals, calib_docs, log):
    """SRH greedy search on the calibration probes → (artifact payload, search result)."""
    cal = Calibration.cat(cals)
    res = greedy_search(cal, a.srh_budget, 4, 16, max_heads=a.max_heads, pool=12)
    layer_map = drafter.layer_map(model.dims.n_layers)
    srh = dict(target=model_identity(model), draft=drafter.identity(), target_heads=res["target_heads"],
               draft_heads=res["draft_heads"], layer_map=layer_map, m_ratio=res["m_ratio"],
               calibration=dict(documents=calib_docs, context=a.context, budget=a.srh_budget, gamma=a.gamma, points=a.points,
                                retrieval=a.retrieval, retrieval_filler=RETRIEVAL_FILLER),
               search=dict(mean_arr=res["arr"], trace=res["trace"]),
               arr_per_layer_srh=srh_report(cal, res, a.srh_budget, 4, 16),
               arr_per_layer_full_signals=per_layer_signals(cal, a.srh_budget, 4, 16, layer_map, (0.0, 0.25, 0.5, 0.75, 1.0)))
    log(f"SRH: target {res['target_heads']} draft {res['draft_heads']} m_ratio {res['m_ratio']} mean ARR {res['arr']:.3f}")
    return srh, res


def srh_markdown(srh: dict) -> str:
    s, f = srh["arr_per_layer_srh"], srh["arr_per_layer_full_signals"]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    lines = ["", f"## SRH calibration (context {srh['calibration']['context']}, budget {srh['calibration']['budget']}, "
             f"{srh['calibration']['points']} probe points per document of {', '.join(srh['calibration']['documents'])}"
             f" + {srh['calibration'].get('retrieval', 0)} pass-key probes)", "",
             f"- target SRHs {srh['target_heads']}, draft SRHs {srh['draft_heads']}, m_ratio {srh['m_ratio']}",
             f"- SRH sets, mean ARR over layers: draft-only {mean(s['draft_only']):.3f}, target-only "
             f"{mean(s['target_only']):.3f}, hybrid {mean(s['hybrid']):.3f}",
             f"- all heads of the mapped layer (complementarity), mean ARR: draft-only {mean(f['draft_only']):.3f}, "
             f"target-only {mean(f['target_only']):.3f}, best hybrid {mean(f['hybrid']):.3f}", "",
             "| layer | SRH draft-only | SRH target-only | SRH hybrid | layer-signal draft-only | layer-signal target-only | layer-signal hybrid (m ratio) |",
             "|---|---|---|---|---|---|---|"]
    for l in range(len(s["hybrid"])):
        lines.append(f"| {l} | {s['draft_only'][l]:.3f} | {s['target_only'][l]:.3f} | {s['hybrid'][l]:.3f} | "
                     f"{f['draft_only'][l]:.3f} | {f['target_only'][l]:.3f} | {f['hybrid'][l]:.3f} ({f['hybrid_m_ratio'][l]}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
