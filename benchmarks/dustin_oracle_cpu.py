"""What sparse verification could reach with a perfect importance signal at a given budget (a diagnostic).

Every verification pass first runs densely with every layer's attention recorded over the whole context (the
*oracle*: this very pass's attention), then verifies sparsely over the top entries of that attention:
``shared`` = one set for every layer and KV head (Dustin's global importance map), ``per`` = a set per layer and KV
head; ``fromL`` = layers 0..L dense and one set from layer L's attention for the layers after it (a re-selection
layer, as TidalDecode's); ``+n`` keeps the first n layers dense; ``default`` is Dustin's own selection (no oracle), for comparison in the
same run. Teacher-forced on dense's trajectory (:class:`DenseTwin`).

    python benchmarks/dustin_oracle_cpu.py 512 64 stdlib:difflib shared,per,shared+2 0.25
    DEVICE=cuda MODEL=/tmp/m/smol.gguf python benchmarks/dustin_oracle_cpu.py 4096 64 stdlib:calendar shared,per 0.25
"""
import sys, json, time, torch
from specdec.loading import load_model
from specdec.data import context_ids, load_document
from specdec.engine import SpeculativeEngine
from specdec.presets import PipelineConfig, build_engine
from specdec.evaluation import DenseTwin
from specdec.interfaces import ScoreRequest, SparsePlan
from specdec.selectors.hybrid_srh import hybrid_select
from specdec.selectors.base import fixed_positions
torch.set_num_threads(1)
ctx, new, docs, modes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4].split(",")
ratio = float(sys.argv[5]) if len(sys.argv) > 5 else 0.25
import os
m = load_model(os.environ.get("MODEL", "smollm2-135m"), "float32", os.environ.get("DEVICE", "cpu"), "reference"); tok = m.tokenizer
N = m.dims.n_global; H = m.dims.n_heads
dense = SpeculativeEngine(m, method="dense", eos_token_id=-1)

class Oracle:
    def __init__(self, inner, mode, dense_layers=0): self.inner, self.mode, self.dl = inner, mode, dense_layers
    def __call__(self, state, tokens, scores):
        v = self.inner
        req = ScoreRequest(rows=list(range(tokens.shape[1])), kind="softmax", heads="group", layers=list(range(N)), source="context")
        m.forward(tokens, state.cache, state.lengths, scores=[req])
        c = v.selector.config
        L = int(state.lengths.max()); B = tokens.shape[0]
        budget = c.budget_for(state.lengths)
        _, room = fixed_positions(state.lengths, budget, c.sinks, c.recent)
        if self.mode == "shared" or self.mode.startswith("from"):
            src = range(N) if self.mode == "shared" else [int(self.mode[4:])]  # fromL: layer L's attention only
            s = sum(req.scores[l].sum(1) / req.scores[l].sum((1, 2)).clamp(min=1e-30).unsqueeze(-1) for l in src)
            idx = hybrid_select(state.lengths, budget, c.sinks, c.recent, None, s, torch.zeros_like(room))
            ind = idx.view(1, B, 1, -1).expand(1, B, state.cache.n_kv_heads, -1)
        else:  # per layer and KV head
            per = []
            for l in range(N):
                hs = []
                for h in range(state.cache.n_kv_heads):
                    s = req.scores[l][:, h]
                    hs.append(hybrid_select(state.lengths, budget, c.sinks, c.recent, None, s, torch.zeros_like(room)))
                per.append(torch.stack(hs, 1))
            ind = torch.stack(per, 0)
        if self.dl:
            full = torch.arange(L, device=ind.device).view(1, 1, 1, L).expand(1, B, ind.shape[2], L)
            if ind.shape[0] == 1: ind = ind.expand(N, -1, -1, -1)
            K = max(L, ind.shape[-1])
            pad = lambda t: torch.nn.functional.pad(t, (0, K - t.shape[-1]), value=-1)
            ind = torch.cat([pad(full).expand(self.dl, -1, -1, -1), pad(ind[self.dl:])], 0)
        plan = SparsePlan(indices=ind.contiguous(), dense_from=state.lengths.clone())
        v.iteration += 1
        return m.forward(tokens, state.cache, state.lengths, plan=plan)

for doc in docs:
    ids = context_ids(tok, load_document(doc), ctx, offset=new + 16)
    pre = dense.prefill([ids]); ref = dense.generate([ids], new, prefilled=pre)
    for mode in modes:
        name, dl = (mode.split("+") + ["0"])[:2]
        if name.startswith("from") and dl == "0":  # a re-selection layer: it and the layers before it run dense
            dl = str(int(name[4:]) + 1)
        eng = build_engine(m, PipelineConfig.make(method="dustin", gamma=4, budget_ratio=ratio), eos_token_id=-1)
        inner = eng.verifier
        if name != "default":
            o = Oracle(inner, name, int(dl))
            inner.verify = lambda state, tokens, scores, o=o, inner=inner: (inner._reset(state) if inner._state is not state else None, o(state, tokens, scores))[1]
        eng.verifier = DenseTwin(inner, forced=[ids + ref.tokens[0]])
        t = time.time(); r = eng.generate([ids], new, prefilled=pre)
        print(doc, mode, json.dumps({k: round(v, 4) for k, v in eng.verifier.summary().items()}), f"{time.time()-t:.0f}s", flush=True)
