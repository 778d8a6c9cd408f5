"""Backend parity: a backend against the reference backend, through whole tiny-model forwards.

Going through :meth:`SpecdecModel.forward` (not ``attend`` directly) checks what a user runs — the
routing, the cache writes, ragged lengths, plans and score requests — and stays valid whatever the
backend's internal call looks like.
"""

from __future__ import annotations

import torch

from specdec.interfaces import AttentionBackend, ScoreRequest, SparsePlan

#: per dtype: (atol, rtol) on logits and scores
TOLERANCE = {torch.float32: (2e-4, 2e-4), torch.bfloat16: (6e-2, 6e-2), torch.float16: (2e-2, 2e-2)}


def runnable_backends(device: str = "cpu", dtype: torch.dtype = torch.float32) -> list[str]:
    """Registered backends (plugins included) that say they can run on ``device`` in ``dtype``."""
    from specdec.registry import BACKENDS

    out = []
    for name in BACKENDS.names():
        try:
            be = BACKENDS.build(name)
        except ImportError:  # an optional dependency is missing: not runnable here, by definition
            continue
        if be.validate(torch.device(device), dtype) is None:
            out.append(name)
    return out


def _close(got: torch.Tensor, ref: torch.Tensor, what: str, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    got, ref = got.float().cpu(), ref.float().cpu()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, the reference gives {tuple(ref.shape)}"
    err = (got - ref).abs() - rtol * ref.abs()
    assert float(err.max()) <= atol, f"{what}: differs from the reference by {float((got - ref).abs().max()):.3g}"


def check_backend(backend: AttentionBackend | str, family: str = "llama", device: str = "cpu",
                  dtype: torch.dtype = torch.float32, scores: bool | None = None) -> None:
    """The backend parity matrix; raises ``AssertionError`` naming the first step that differs.

    Steps (a tiny GQA model, 2 sequences of 29 and 17 tokens): per-sequence prefill; a batched one-row
    decode; a 4-row verify collecting scores of rows 0 and 3 (``logits`` and ``softmax``, summed per KV
    group); a one-row sparse step over a plan with a different list per KV head, ``-1`` padding and
    ``dense_from``. ``scores=None`` checks scores unless the backend says ``supports_scores = False``.
    """
    from specdec.registry import BACKENDS
    from specdec.testing.models import tiny_model
    from specdec.attention.reference import ReferenceBackend

    be = BACKENDS.build(backend) if isinstance(backend, str) else backend
    name = getattr(be, "name", type(be).__name__)
    reason = be.validate(torch.device(device), dtype)
    assert reason is None, f"backend {name} cannot run on {device} in {dtype}: {reason}"
    if scores is None:
        scores = bool(getattr(be, "supports_scores", True))
    models = {}
    for label, b in (("ref", ReferenceBackend()), ("got", be)):
        m = tiny_model(family, seed=11, backend=b)
        m.hf.to(device=device, dtype=dtype)
        models[label] = m
    dims = models["ref"].dims
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, dims.vocab_size, (n,), generator=gen) for n in (29, 17)]
    caches = {k: m.new_cache(2, 64) for k, m in models.items()}
    lengths = torch.tensor([len(p) for p in prompts], device=dev)

    def both(what: str, fn) -> dict:
        out = {k: fn(models[k], caches[k]) for k in models}
        _close(out["got"], out["ref"], f"backend {name}, {what}", dtype)
        return out

    for b, p in enumerate(prompts):  # ragged prefill, one sequence at a time
        both(f"prefill of sequence {b}", lambda m, c: m.forward(p.view(1, -1).to(dev), c.rows(b, b + 1),
                                                                 torch.tensor([0], device=dev)))
    tok = torch.randint(0, dims.vocab_size, (2, 4), generator=gen).to(dev)
    both("one-row decode", lambda m, c: m.forward(tok[:, :1], c, lengths))
    lengths = lengths + 1
    if scores:
        for kind in ("logits", "softmax"):
            reqs = {}

            def verify(m, c, kind=kind):
                req = ScoreRequest(rows=[0, 3], kind=kind, heads="group")
                reqs[m is models["got"]] = req
                return m.forward(tok, c, lengths, scores=req)

            both(f"4-row verify with {kind} scores", verify)
            got, ref = reqs[True].scores, reqs[False].scores
            assert sorted(got) == sorted(ref), f"backend {name}: scores for layers {sorted(got)}, expected {sorted(ref)}"
            for layer in ref:
                _close(got[layer], ref[layer], f"backend {name}, {kind} scores of layer {layer}", dtype)
    else:
        both("4-row verify", lambda m, c: m.forward(tok, c, lengths))
    # a sparse step: a different list per KV head, padding, and the tokens since the plan (dense_from)
    K = 10
    idx = torch.stack([torch.stack([torch.randperm(int(n), generator=gen)[:K] for _ in range(dims.n_kv_heads)])
                       for n in lengths.tolist()])  # (B, H_kv, K)
    idx[:, :, -2:] = -1
    plan = SparsePlan(indices=idx.unsqueeze(0).to(dev), dense_from=(lengths - 2).to(dev))
    both("one-row sparse step", lambda m, c: m.forward(tok[:, 1:2], c, lengths + 3, plan=plan))
