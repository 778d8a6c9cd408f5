"""How close a query-aware sparse verification comes to dense: every layer picks its own set with this pass's own
queries (the diagnostic that preceded Dustin's ``layer_scores=keys`` option, which builds the same ranking in the
selector; kept for the full-rank ``q64`` ceiling).

Each verification pass runs sparsely; at every global layer the plan scores the verified positions with the layer's
queries (after RoPE) against the cached keys, exactly (``q64`` for a 64-dim head: the in-pass oracle of this pass's
own logits) or in a rank-r projection of the keys (``q16``: Loki-style, the basis the top principal directions of
the prompt's keys per layer and KV head, taken once after the prefill), takes the softmax of those logits per query
head and row, sums it over the KV group's heads and the rows, and keeps sinks + recent + the best of the rest within
the budget. ``default`` is Dustin's own selection in the same run. Teacher-forced on dense's trajectory
(:class:`DenseTwin`), as ``dustin_oracle_cpu.py``.

    python benchmarks/dustin_qaware_cpu.py 4096 128 .heldout/GPL-3.txt default,q64,q16,q8 0.25
"""
import json
import os
import sys
import time

import torch

from specdec.data import context_ids, load_document
from specdec.engine import SpeculativeEngine
from specdec.evaluation import DenseTwin
from specdec.interfaces import SparsePlan
from specdec.loading import load_model
from specdec.presets import PipelineConfig, build_engine
from specdec.selectors.base import fixed_positions
from specdec.selectors.hybrid_srh import hybrid_select

torch.set_num_threads(1)
ctx, new, docs, modes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4].split(",")
ratio = float(sys.argv[5]) if len(sys.argv) > 5 else 0.25
m = load_model(os.environ.get("MODEL", "smollm2-135m"), "float32", os.environ.get("DEVICE", "cpu"), "reference")
tok = m.tokenizer
N, H, D = m.dims.n_global, m.dims.n_heads, m.dims.head_dim
dense = SpeculativeEngine(m, method="dense", eos_token_id=-1)


class QueryAwarePlan(SparsePlan):
    """Fixed positions in ``indices``; :meth:`indices_for` adds each layer's best ``room`` by its own queries."""

    def setup(self, cache, lengths, budget, sinks, recent, basis, scale):
        self.cache, self.lengths, self.budget_t, self.sinks, self.recent = cache, lengths, budget, sinks, recent
        self.basis, self.scale = basis, scale
        self.read = 0.0  # key dims read for scoring, as a share of the verified keys' dims

    def indices_for(self, layer, q):
        B, Hq, T, Dq = q.shape
        L = int(self.lengths.max())
        K = self.cache.k[layer, :, :, :L].float()  # (B, Hkv, L, D)
        Hkv = K.shape[1]
        G = Hq // Hkv
        qg = q.float().view(B, Hkv, G, T, Dq)
        if self.basis is not None:
            P = self.basis[layer]  # (Hkv, D, r)
            K = torch.einsum("bhld,hdr->bhlr", K, P)
            qg = torch.einsum("bhgtd,hdr->bhgtr", qg, P)
        logits = torch.einsum("bhgtd,bhld->bhgtl", qg, K) * self.scale
        pos = torch.arange(L)
        logits = logits.masked_fill(pos.view(1, 1, 1, 1, L) >= self.lengths.view(B, 1, 1, 1, 1), float("-inf"))
        mass = torch.softmax(logits, -1).sum((2, 3))  # (B, Hkv, L)
        _, room = fixed_positions(self.lengths, self.budget_t, self.sinks, self.recent)
        per = [hybrid_select(self.lengths, self.budget_t, self.sinks, self.recent, None, mass[:, h],
                             torch.zeros_like(room)) for h in range(Hkv)]
        return torch.stack(per, 1)


class QueryAware:
    def __init__(self, inner, rank):
        self.inner, self.rank, self.basis = inner, rank, None

    def __call__(self, state, tokens, scores):
        c = self.inner.selector.config
        L = int(state.lengths.max())
        B = tokens.shape[0]
        if self.rank < D and self.basis is None:  # the prompt's keys' top directions per layer and KV head
            Kp = state.cache.k[:, 0, :, :L].float()  # (N, Hkv, L, D), one sequence
            self.basis = torch.stack([torch.stack([torch.linalg.svd(Kp[l, h], full_matrices=False)[2][: self.rank].T
                                                   for h in range(Kp.shape[1])]) for l in range(N)])
        budget = c.budget_for(state.lengths)
        fixed, _ = fixed_positions(state.lengths, budget, c.sinks, c.recent)
        plan = QueryAwarePlan(indices=fixed.view(1, B, 1, -1).contiguous(), dense_from=state.lengths.clone())
        plan.setup(state.cache, state.lengths, budget, c.sinks, c.recent,
                   self.basis if self.rank < D else None, D ** -0.5)
        self.inner.iteration += 1
        return m.forward(tokens, state.cache, state.lengths, plan=plan)


for doc in docs:
    ids = context_ids(tok, load_document(doc), ctx, offset=new + 16)
    pre = dense.prefill([ids])
    ref = dense.generate([ids], new, prefilled=pre)
    for mode in modes:
        eng = build_engine(m, PipelineConfig.make(method="dustin", gamma=4, budget_ratio=ratio), eos_token_id=-1)
        inner = eng.verifier
        if mode != "default":
            o = QueryAware(inner, int(mode[1:]))
            inner.verify = lambda state, tokens, scores, o=o, inner=inner: (
                inner._reset(state) if inner._state is not state else None, o(state, tokens, scores))[1]
        eng.verifier = DenseTwin(inner, forced=[ids + ref.tokens[0]])
        t = time.time()
        eng.generate([ids], new, prefilled=pre)
        print(doc, mode, json.dumps({k: round(v, 4) for k, v in eng.verifier.summary().items()}),
              f"{time.time() - t:.0f}s", flush=True)
