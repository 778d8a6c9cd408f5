"""The Triton kernels write the attention output in transformers' ``(B, T, H, D)`` layout.

``LaunchConfig.out_bthd`` (default) makes ``splitk_attention`` return a ``(B, H, T, D)`` view of a
contiguous ``(B, T, H, D)`` buffer, so the attention function's ``transpose(1, 2).contiguous()``
copies nothing. The values must be bit-identical to the old contiguous ``(B, H, T, D)`` output on
every path (split + combine, one split writing directly, sparse, scores).
"""

from __future__ import annotations

import dataclasses
import os

_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
if _DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the triton backend needs the optional 'triton' package")
pytest.importorskip("pydantic", reason="backend configs need pydantic")

from specdec.cuda.triton_attention import LaunchConfig, splitk_attention  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

if _DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("SPECDEC_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)

DEV = torch.device(_DEVICE)


def _case(B, Hkv, G, T, D, L, dtype, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(DEV, dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(DEV, dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(DEV, dtype)
    return q, k, v, torch.tensor(lengths, device=DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("scores", [None, "weights"])
def test_bthd_output_is_bit_identical(dtype, T, sparse, splits, scores):
    lengths = [29, 0, 41]
    q, k, v, lens = _case(3, 2, 3, T, 16, 48, dtype, lengths, seed=T + 5 * splits)
    extra, plan = {}, {}
    if sparse:
        g = torch.Generator().manual_seed(9)
        idx = torch.stack([torch.stack([torch.randperm(40, generator=g)[:10] for _ in range(2)]) for _ in range(3)])
        plan = dict(plan_indices=idx.to(DEV), dense_from=torch.tensor([20, 0, 35], device=DEV))
    if scores:
        extra["row_weights"] = torch.ones(6, T, device=DEV)
    res = {}
    for bthd in (False, True):
        cfg = LaunchConfig(block_n=16, num_splits=splits, out_bthd=bthd)
        res[bthd] = splitk_attention(q, k, v, AttentionMetadata(lens, 0.25, **plan), cfg=cfg, **extra)
    old, new = res[False], res[True]
    assert old[0].is_contiguous() and new[0].transpose(1, 2).is_contiguous()
    assert new[0].shape == old[0].shape == q.shape
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
    if scores:
        assert torch.equal(old[2], new[2])


def test_attention_function_gets_bthd_without_a_copy():
    """Through a model: the tensor the attention function hands to o_proj is the kernel's buffer."""
    from conftest import make_tiny

    m = make_tiny("llama")
    m.hf.to(DEV)
    be = TritonBackend(TritonConfig(block_n=16))
    ids = torch.randint(0, 96, (2, 5), device=DEV)
    logits = {}
    for bthd in (False, True):
        be._launch = dataclasses.replace(be._launch, out_bthd=bthd)
        cache = m.new_cache(2, 16)
        lens = torch.tensor([0, 3], device=DEV)
        with m.using_backend(be):
            m.forward(ids[:, :3], cache, lens)
            logits[bthd] = m.forward(ids, cache, lens + 3)
    assert torch.equal(logits[False], logits[True])
    # the T = 5 output of the kernel is already (B, T, H, D): contiguous() returns it unchanged
    q, k, v, lens = _case(2, 2, 2, 5, 16, 16, torch.float32, [0, 3])
    out, _ = be.attend(q, k, v, AttentionMetadata(lens, 0.25))
    flat = out.transpose(1, 2)
    assert flat.contiguous().data_ptr() == flat.data_ptr()
