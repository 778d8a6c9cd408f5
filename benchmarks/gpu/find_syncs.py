"""Diagnostic: where does a decode/verify/Quest-draft forward synchronise with the host? (run on a GPU)"""
import sys, traceback, warnings
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import torch
from specdec import BACKENDS, PipelineConfig, build_engine
from conftest import make_tiny

seen = set()
def show(message, category, filename, lineno, file=None, line=None):
    st = traceback.extract_stack()[:-2]
    st = st[-7:]
    key = tuple((f.filename, f.lineno) for f in st)
    if key not in seen:
        seen.add(key)
        print("SYNC:", str(message)[:80], "".join(traceback.format_list(st)))
warnings.showwarning = show

for backend in ("triton",):
    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = make_tiny("llama", seed=5); m.hf.cuda(); m.backend = be
    print("=====", backend, m.dims, flush=True)
    eng = build_engine(m, PipelineConfig.make(method="quest", gamma=3, budget=12, sinks=2, recent=4), eos_token_id=-1)
    orig = m._eager_forward
    def fwd(ids, *a, **k):
        if ids.shape[1] > 16:
            return orig(ids, *a, **k)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return orig(ids, *a, **k)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    m._eager_forward = fwd
    eng.generate([list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7], 6)
