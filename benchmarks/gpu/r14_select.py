"""Vegas' selection per iteration at the embedded shape (30 layers, B 64, 3 KV heads, 8k, 5 %): the plan's top-k
by ``torch.topk`` (today) vs one Triton launch (``specdec.selectors.base.TRITON_SELECT = True``), and their sets.

    python3 benchmarks/gpu/r14_select.py --out $OUT            # GPU
    python3 benchmarks/gpu/r14_select.py --out /tmp/s --smoke  # CPU, tiny, TRITON_INTERPRET=1

Timing: ``benchmarks/gpu/scores_e14.py``'s ``selection`` (on_verify head sum + the plan graph; medians of
``--reps``), once per setting, each with a fresh cache (so a fresh plan graph). Parity: the eager plans of
the same scores with both settings, per (layer, sequence, head) row the sorted index sets must be equal.
Writes ``<out>/r14_select.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import torch  # noqa: E402


def parity(dev, smoke) -> dict:
    from specdec import SELECTORS, KVCache
    from specdec.interfaces import ScoreRequest
    from specdec.selectors import base

    N, B, Hkv, L = (30, 64, 3, 8000) if not smoke else (3, 3, 3, 300)
    cache = KVCache(N, B, Hkv, L + 16, 8, torch.bfloat16 if dev.type == "cuda" else torch.float32, dev)
    sel = SELECTORS.build("collect2", budget_ratio=0.05 if not smoke else 0.3)
    sel.reset(cache)
    g = torch.Generator(device=dev).manual_seed(1)
    req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
    req.scores = dict(enumerate(torch.rand(N, B, Hkv, L + 16, device=dev, generator=g).unbind(0)))
    lengths = torch.randint(L // 2, L + 1, (B,), device=dev, generator=g)
    sel.on_verify(req, lengths)
    plans = {}
    for flag in (False, "always"):
        base.TRITON_SELECT = flag
        plans[flag] = sel.plan(cache, lengths).indices
    base.TRITON_SELECT = False
    a, b = plans[False], plans["always"]
    return dict(same_index_sets=bool(torch.equal(a.sort(-1).values, b.sort(-1).values)), shape=list(a.shape),
                empty_slots=int((a == -1).sum()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    a = ap.parse_args()
    a.reps = a.reps or (3 if a.smoke else 20)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import scores_e14

    from specdec.selectors import base

    dev = torch.device("cpu" if a.smoke else "cuda")
    res = {}
    try:
        res["parity"] = parity(dev, a.smoke)
    except Exception:
        res["parity"] = dict(error=traceback.format_exc())
    print("parity", res["parity"], flush=True)
    for flag in (False, "always" if a.smoke else True):
        try:
            base.TRITON_SELECT = flag
            res[f"triton_select={flag}"] = scores_e14.selection(a, dev, print)
        except Exception:
            res[f"triton_select={flag}"] = dict(error=traceback.format_exc())
        finally:
            base.TRITON_SELECT = False
        (out / "r14_select.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
