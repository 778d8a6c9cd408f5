"""The programmatic-dependent-launch switch (:mod:`specdec.cuda.triton_pdl`) and its plumbing into every per-layer
Triton launch. No kernel runs here (the launches are recorded, not executed): PDL itself needs a Hopper GPU, where
``tests/test_pdl_gpu.py`` checks that results are bit-identical with it on and off."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the fused kernels need the optional 'triton' package")

from specdec.cuda import triton_attention, triton_fused, triton_pdl  # noqa: E402
from specdec.cuda.triton_pdl import ENV, pdl_args, pdl_launch, pdl_requested, set_pdl  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    set_pdl(None)
    yield
    set_pdl(None)


def test_pdl_is_off_by_default_and_follows_env_then_override(monkeypatch):
    assert not pdl_requested()
    monkeypatch.setenv(ENV, "1")
    assert pdl_requested()
    set_pdl(False)  # the override wins over the environment
    assert not pdl_requested()
    set_pdl(None)
    monkeypatch.setenv(ENV, "0")
    assert not pdl_requested()
    set_pdl(True)
    assert pdl_requested()


def test_bad_env_value_and_bad_override_are_refused(monkeypatch):
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=r"SPECDEC_PDL='yes' is not a valid setting; use 1 .* or 0"):
        pdl_requested()
    with pytest.raises(ValueError, match="set_pdl takes True, False or None"):
        set_pdl(1)


def test_pdl_never_on_cpu_nor_under_the_interpreter(monkeypatch):
    set_pdl(True)
    assert not pdl_launch(torch.device("cpu"))
    assert pdl_args(torch.device("cpu")) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl_launch(torch.device("cuda"))  # decided before any CUDA call: safe without a GPU
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(triton_pdl, "_CAPABLE", {0: False})  # a pre-Hopper GPU
    assert not pdl_launch(torch.device("cuda:0"))
    monkeypatch.setattr(triton_pdl, "_CAPABLE", {0: True})
    assert pdl_launch(torch.device("cuda:0"))
    assert pdl_args(torch.device("cuda:0")) == {"PDL": True, "launch_pdl": True}
    set_pdl(False)
    assert not pdl_launch(torch.device("cuda:0"))


class _Spy:
    """Stands in for a ``@triton.jit`` kernel: records each launch's keywords instead of running it."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        return lambda *args, **kw: self.log.append((self.name, kw.get("PDL", False), kw.get("launch_pdl", False)))


KERNELS = {triton_fused: ("_rms_kernel", "_silu_mul_kernel", "_rope_qkv_kernel", "_rotary_kernel"),
           triton_attention: ("_splitk_attn_kernel", "_combine_kernel")}


def _launch_all():
    """One call of every wrapper whose kernel takes PDL (CPU tensors; the kernels are spies)."""
    x = torch.randn(2, 3, 64)
    triton_fused.rms_norm(x, torch.ones(64), 1e-6, residual=x.clone())
    triton_fused.silu_mul(torch.randn(2, 3, 128))
    B, T, H, Hkv, D = 2, 1, 4, 2, 16
    q, k, v = torch.randn(B, T, H, D), torch.randn(B, T, Hkv, D), torch.randn(B, T, Hkv, D)
    cos = sin = torch.randn(B, T, D)
    kc = torch.zeros(B, Hkv, 32, D)
    lens = torch.tensor([3, 7])
    triton_fused.rope_qkv_write(q, k, v, cos, sin, kc, kc.clone(), lens)
    triton_fused.rotary_cos_sin(torch.zeros(B, T, dtype=torch.long), torch.ones(D // 2), 1.0, torch.float32)
    meta = AttentionMetadata(lengths=lens, scale=D ** -0.5)
    # 2 splits, combine launch: both kernels
    triton_attention.splitk_attention(q.transpose(1, 2), kc, kc.clone(), meta,
                                      cfg=triton_attention.LaunchConfig(num_splits=2, fused_combine=False))


@pytest.mark.parametrize("on", [False, True])
def test_every_per_layer_kernel_launches_with_pdl_exactly_when_the_switch_says(monkeypatch, on):
    log: list = []
    for mod, names in KERNELS.items():
        for n in names:
            monkeypatch.setattr(mod, n, _Spy(log, n))
    monkeypatch.setattr(triton_pdl, "pdl_launch", lambda device: on)  # as on a Hopper GPU with the switch set
    _launch_all()
    want = {n for names in KERNELS.values() for n in names}
    assert {n for n, _, _ in log} == want
    assert all(pdl == on and launch == on for _, pdl, launch in log), log
