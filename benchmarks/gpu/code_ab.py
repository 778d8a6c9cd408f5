"""Tokens/s of two (or more) checkouts of specdec on the same workload, process by process in ABBA order.

    python3 benchmarks/gpu/code_ab.py --trees before=.old,after=. --gguf /tmp/m/smol.gguf --out DIR \\
        --documents a.py,b.txt [--methods dense,magicdec,vegas,dustin] [--rounds 2] [--repeats 3]

What a change that cannot be switched off at run time is worth: each tree (a directory holding a ``specdec`` package,
e.g. ``git archive`` of an older commit) runs in its own process (``sys.path`` starts with the tree), the trees in
ABBA order over ``--rounds`` rounds (round ``r`` runs them forwards when ``r`` is even, backwards when odd). A process
loads the model (bf16, Triton, CUDA graphs, fused projections — the settings of ``sync_timing.py``), and per document
and method (8k context, B = 64, 96 new tokens, γ 4, ``--budget-ratio`` 5 %; a lossy method also on dense's text,
:func:`specdec.bench.dense_text_replay`) runs once untimed, then ``--repeats`` timed runs. Per row: every tree's median,
min–max tokens/s over all its timed runs, the ratio of medians against the first tree, the phases' ms per iteration of
each tree's median run, and whether every run of every tree emitted the same tokens. Writes
``DIR/code_ab.{json,md}``. ``--smoke``: the embedded model on the CPU, context 128, B = 2, 8 tokens, one repeat.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", required=True, help="comma-separated name=directory (the first is the reference)")
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--documents", required=True, help="comma-separated files or built-in names")
    ap.add_argument("--methods", default="dense,magicdec,vegas,dustin")
    ap.add_argument("--budget-ratio", type=float, default=0.05)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one tree in this process, print JSON
    return ap.parse_args(argv)


def child(a) -> list[dict]:
    """Runs in the tree's process: one record per document × method (× dense's text)."""
    sys.path.insert(0, str(Path(a.child).resolve()))
    import specdec
    from specdec.loading import load_model
    from workload import engines  # (benchmarks/gpu: the script's directory)

    assert Path(specdec.__file__).resolve().is_relative_to(Path(a.child).resolve()), specdec.__file__
    gpu = not a.smoke
    ctx, B, new, repeats = (128, 2, 8, 1) if a.smoke else (a.context, a.batch, a.new, a.repeats)
    model = load_model("smollm2-135m" if a.smoke else a.gguf, "bfloat16" if gpu else "float32",
                       "cuda" if gpu else "cpu", "triton" if gpu else "reference", gpu, False, gpu)
    recs = []
    for doc, _, label, eng, pre in engines(model, a.documents, a.methods, a.budget_ratio, ctx, B, new):
        eng.generate(pre.ids, max_new_tokens=new, prefilled=pre)  # captures and compilations happen here
        runs = [eng.generate(pre.ids, max_new_tokens=new, prefilled=pre) for _ in range(repeats)]
        med = sorted(runs, key=lambda r: r.stats.tokens_per_second)[(len(runs) - 1) // 2]
        n = max(med.stats.iterations, 1)
        recs.append(dict(
            document=doc, method=label, tau=med.stats.mean_accepted_length, iterations=med.stats.iterations,
            tokens_per_second=[r.stats.tokens_per_second for r in runs],
            tokens=sorted({hashlib.sha1(json.dumps(r.tokens).encode()).hexdigest() for r in runs}),
            ms_per_iteration={k: 1e3 * v / n for k, v in med.stats.phase_seconds.items()
                              if v and k != "prefill"}))
    return recs


def machine_meta(gpu: bool) -> dict:
    """Where a child ran: the device, the library versions (written into the JSON and the report)."""
    import platform

    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # (the CPU smoke run may lack it)
        triton_version = None
    device = torch.cuda.get_device_name() if gpu else f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    return dict(device=device, torch=torch.__version__, triton=triton_version, python=platform.python_version())


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.child:
        recs = child(a)
        print("CODE_AB_META " + json.dumps(machine_meta(not a.smoke)), flush=True)
        print("CODE_AB_JSON " + json.dumps(recs), flush=True)
        return 0
    trees = [t.split("=", 1) for t in a.trees.split(",")]
    bad = [t for t in trees if len(t) != 2 or not (Path(t[1]) / "specdec" / "__init__.py").is_file()]
    if bad:
        raise SystemExit(f"--trees: {bad[0]!r} is not name=DIR with DIR/specdec/__init__.py; give e.g. before=.old,after=.")
    argv = list(sys.argv[1:] if argv is None else argv)
    runs: dict[str, list[list[dict]]] = {name: [] for name, _ in trees}
    t0 = time.time()
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    for r in range(a.rounds):
        for name, path in (trees if r % 2 == 0 else trees[::-1]):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(path).resolve())]
                                                              + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            p = subprocess.run([sys.executable, __file__, *argv, "--child", path], env=env, capture_output=True, text=True)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("CODE_AB_JSON ")]
            if p.returncode or not line:
                raise SystemExit(f"tree {name} ({path}) failed in round {r}:\n{p.stderr[-4000:]}")
            runs[name].append(json.loads(line[-1][len("CODE_AB_JSON "):]))
            if "device" not in meta:
                meta.update(json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("CODE_AB_META ")][-1][len("CODE_AB_META "):]))
            print(f"round {r} {name}: done ({time.time() - t0:.0f} s)", flush=True)
    rows = []
    ref = trees[0][0]
    for i, rec in enumerate(runs[ref][0]):
        row = dict(document=rec["document"], method=rec["method"], tau={}, trees={})
        hashes = set()
        for name, _ in trees:
            recs = [rnd[i] for rnd in runs[name]]
            assert all((x["document"], x["method"]) == (rec["document"], rec["method"]) for x in recs)
            tps = [v for x in recs for v in x["tokens_per_second"]]
            hashes |= {h for x in recs for h in x["tokens"]}
            med = sorted(recs, key=lambda x: statistics.median(x["tokens_per_second"]))[(len(recs) - 1) // 2]
            row["tau"][name] = med["tau"]
            row["trees"][name] = dict(median=statistics.median(tps), min=min(tps), max=max(tps),
                                      ms_per_iteration=med["ms_per_iteration"])
        for name, _ in trees:
            row["trees"][name]["ratio"] = row["trees"][name]["median"] / row["trees"][ref]["median"]
        row["same_tokens_every_run"] = len(hashes) == 1
        rows.append(row)
    write(a, trees, rows, meta)
    return 0


def write(a, trees, rows: list[dict], meta: dict) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "code_ab.json").write_text(json.dumps(dict(argv=sys.argv, trees=trees, meta=meta, rows=rows), indent=1))
    names = [n for n, _ in trees]
    lines = [f"# Tokens/s of {' vs '.join(names)} — {meta['date']}", "",
             f"`{' '.join(sys.argv)}`", "",
             f"Machine: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, Python {meta['python']}.", "",
             "| document | method | τ (per tree where they differ) | " + " | ".join(f"{n} tok/s" for n in names) + " | "
             + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " | same tokens |",
             "|---|---|---|" + "---|" * (2 * len(names) - 1) + "---|"]
    for r in rows:
        t = r["trees"]
        # τ of each tree's median run: one value when they agree, each tree's (in --trees order) when they differ
        taus = [f"{r['tau'][n]:.2f}" for n in names]
        lines.append(f"| {r['document']} | {r['method']} | {taus[0] if len(set(taus)) == 1 else ' / '.join(taus)} | "
                     + " | ".join(f"{t[n]['median']:.0f} ({t[n]['min']:.0f}–{t[n]['max']:.0f})" for n in names) + " | "
                     + " | ".join(f"{t[n]['ratio']:.3f}" for n in names[1:]) + f" | {r['same_tokens_every_run']} |")
    lines += ["", "ms per iteration by phase (each tree's median run): " + " / ".join(names), ""]
    for r in rows:
        ph = sorted(set().union(*(r["trees"][n]["ms_per_iteration"] for n in names)))
        lines.append(f"- {r['document']} {r['method']}: " + ", ".join(
            f"{p} " + " / ".join(f"{r['trees'][n]['ms_per_iteration'].get(p, 0):.2f}" for n in names) for p in ph))
    (out / "code_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
