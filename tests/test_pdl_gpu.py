"""Programmatic dependent launch on a Hopper GPU: every per-layer Triton kernel and whole graph-captured decode steps
give bit-identical results with PDL on and off, and the on-run's kernels really are PDL kernels.

Every PDL kernel waits for its predecessor (``gdc_wait``) before any load or store, so nothing may change, not one
bit: ``torch.equal`` throughout. (tests/test_pdl.py checks the switch and its plumbing on the CPU.)
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9:  # pragma: no cover
    pytest.skip("programmatic dependent launch needs compute capability >= 9 (Hopper)", allow_module_level=True)

pytest.importorskip("triton", reason="the fused kernels need the optional 'triton' package")

from specdec import BACKENDS, ScoreRequest, SparsePlan  # noqa: E402
from specdec.cuda import triton_attention, triton_fused  # noqa: E402
from specdec.cuda.triton_pdl import pdl_launch, set_pdl  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

from conftest import make_tiny  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def _reset():
    set_pdl(None)
    yield
    set_pdl(None)


def _both(fn):
    """``fn()`` with PDL off, then on (each result cloned right away)."""
    out = []
    for on in (False, True):
        set_pdl(on)
        assert pdl_launch(DEV) == on
        r = fn()
        torch.cuda.synchronize()
        out.append(tuple(x.clone() for x in (r if isinstance(r, tuple) else (r,))))
    return out


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()


def _pdl_compiled(kernel) -> bool:
    """Whether ``kernel`` has a compiled variant launched with PDL whose code waits in ``griddepcontrol.wait``."""
    found = False
    for entry in kernel.device_caches.values():
        for k in entry[0].values():
            ptx = getattr(k, "asm", {}).get("ptx", "")
            found |= bool(getattr(k.metadata, "launch_pdl", False)) and "griddepcontrol.wait" in ptx
    return found


def test_fused_kernels_bit_identical_with_pdl():
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(16, 1, 4096, generator=g, device=DEV, dtype=bf)
    parts = torch.randn(2, 16, 1, 4096, generator=g, device=DEV, dtype=bf)
    w = torch.randn(4096, generator=g, device=DEV, dtype=bf)
    _equal(*_both(lambda: triton_fused.rms_norm(x, w, 1e-5)))
    _equal(*_both(lambda: triton_fused.rms_norm(parts, w, 1e-5, residual=x, splits=2)))
    gu = torch.randn(16, 1, 2 * 14336, generator=g, device=DEV, dtype=bf)
    _equal(*_both(lambda: triton_fused.silu_mul(gu)))
    B, T, H, Hkv, D, L = 16, 5, 32, 8, 128, 300
    qkv = torch.randn(2, B, T, (H + 2 * Hkv) * D, generator=g, device=DEV, dtype=bf)
    q, k, v = (t.reshape(B, T, -1, D) for t in qkv[0].split([H * D, Hkv * D, Hkv * D], -1))
    pos = torch.arange(T, device=DEV).expand(B, T) + 200
    cos, sin = triton_fused.rotary_cos_sin(pos, 1.0 / 500000 ** (torch.arange(0, D, 2, device=DEV) / D), 1.0, bf)
    _equal(*_both(lambda: triton_fused.rotary_cos_sin(pos, 1.0 / 500000 ** (torch.arange(0, D, 2, device=DEV) / D),
                                                      1.0, bf)))
    lens = torch.randint(100, 290, (B,), device=DEV)

    def rope():
        kc, vc = torch.zeros(2, B, Hkv, L, D, device=DEV, dtype=bf)
        return (triton_fused.rope_qkv_write(q, k, v, cos, sin, kc, vc, lens, splits=2, split_stride=qkv.stride(0)),
                kc, vc)

    _equal(*_both(rope))
    assert all(_pdl_compiled(kern) for kern in (triton_fused._rms_kernel, triton_fused._silu_mul_kernel,
                                                triton_fused._rope_qkv_kernel, triton_fused._rotary_kernel))


@pytest.mark.parametrize("case", ["sparse_fused_combine", "sparse_combine", "dense_verify"])
def test_splitk_attention_bit_identical_with_pdl(case):
    g = torch.Generator(device="cuda").manual_seed(1)
    B, H, Hkv, D, L = 4, 32, 8, 128, 4096
    T = 5 if case == "dense_verify" else 1
    kc = torch.randn(B, Hkv, L, D, generator=g, device=DEV, dtype=torch.bfloat16)
    vc = torch.randn(B, Hkv, L, D, generator=g, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(B, H, T, D, generator=g, device=DEV, dtype=torch.bfloat16)
    lens = torch.tensor([4000, 3000, 100, 4090], device=DEV)
    plan = dense_from = None
    if case != "dense_verify":
        gc = torch.Generator().manual_seed(2)
        plan = torch.stack([torch.randperm(90, generator=gc)[:64] for _ in range(B)]).sort(-1).values
        plan = plan.to(DEV).view(B, 1, 64).expand(B, Hkv, 64).contiguous()
        dense_from = lens.clone()
    meta = AttentionMetadata(lengths=lens, scale=D ** -0.5, plan_indices=plan, dense_from=dense_from)
    cfg = triton_attention.LaunchConfig(num_splits=3, fused_combine=case == "sparse_fused_combine",
                                        sparse_single_split_at=None)
    _equal(*_both(lambda: triton_attention.splitk_attention(q, kc, vc, meta, cfg=cfg)[:2]))
    assert _pdl_compiled(triton_attention._splitk_attn_kernel)
    if case != "sparse_fused_combine":
        assert _pdl_compiled(triton_attention._combine_kernel)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_graph_captured_steps_bit_identical_with_pdl(family):
    """Dense, sparse and verify steps of a fused model under CUDA graphs: logits and KV cache, PDL off vs on."""
    m = make_tiny(family, seed=3)
    m.hf.to(DEV, torch.bfloat16)
    m.backend = BACKENDS.build("triton")
    m.fuse_projections()
    B = 2
    L = torch.tensor([40, 70], device=DEV)
    plan = SparsePlan(indices=torch.randint(0, 39, (1, B, 1, 10), device=DEV), dense_from=L.clone())
    x1 = torch.randint(0, 96, (B, 1), device=DEV)
    x5 = torch.randint(0, 96, (B, 5), device=DEV)
    # the last: a verify that emits Collect-2-Query scores (its score buffer's fill runs between RoPE and attention)
    scores = lambda: ScoreRequest(rows=[0, 4], kind="softmax", heads="group")  # noqa: E731
    for x, kw in ((x1, {}), (x1, {"plan": plan}), (x5, {}), (x5, {"scores": "c2q"})):
        def step(x=x, kw=kw):
            m.enable_cuda_graphs()  # a fresh graph cache: PDL is fixed at capture
            c = m.new_cache(B, 96)
            torch.manual_seed(1)
            c.k.normal_()
            c.v.normal_()
            m.forward(x, c, L, **({**kw, "scores": scores()} if "scores" in kw else kw))  # warm-up + capture
            req = scores() if "scores" in kw else None
            out = m.forward(x, c, L, **({**kw, "scores": req} if req is not None else kw))  # replay
            assert m._graphs.replays >= 1 and not m._graphs.uncapturable
            if req is not None:
                assert req.scores, "the verify recorded no scores"
                return (out, c.k, c.v, *(req.scores[i] for i in sorted(req.scores)))
            return out, c.k, c.v

        _equal(*_both(step))
    m.disable_cuda_graphs()
