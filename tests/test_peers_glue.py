"""The triton backend's peers (FlashAttention-4, FlashInfer), tested with *fake* modules.

Neither library runs on this CPU machine (both JIT-compile CUDA code; their wheels are for Python
3.12). The fakes below implement, independently of specdec and with explicit loops, the documented
semantics of the calls specdec makes — FA4's ``flash_attn_varlen_func`` (q ``(B, T, H, D)``, K/V
``(B, L, H_kv, D)``, ``seqused_k``, causal mask aligned to the bottom right, GQA ``h → h // G``,
returns ``(out, lse)``) and FlashInfer's paged decode/prefill wrappers (``plan(indptr, indices,
last_page_len, ...)``, HND pages ``(num_pages, H_kv, page_size, D)``, the last page holding
``last_page_len`` tokens, prefill causal aligned to the bottom right). They check the glue —
layouts, page lists, lengths, when a peer is taken — not the libraries: ``benchmarks/gpu/peers.py``
checks the real ones on the GPU.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

_GPU_SESSION = os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cuda"
if not _GPU_SESSION:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402

if _GPU_SESSION:
    pytest.skip("CPU-only test (fake modules); the GPU run checks the real peers", allow_module_level=True)
import torch  # noqa: E402

pytest.importorskip("triton", reason="the triton backend needs the optional 'triton' package")

from specdec.attention.reference import ReferenceBackend  # noqa: E402
from specdec.cuda import peers  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

REF = ReferenceBackend()


def _attend_rows(q_rows, kk, vv, scale):
    """softmax(q kᵀ · scale) v for one head: q_rows (T, D), kk/vv (n, D) → (T, D) fp32."""
    return torch.softmax((q_rows.float() @ kk.float().T) * scale, -1) @ vv.float()


# ------------------------------------------------------------------ fakes
def _fake_fa4(calls):
    def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                               max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                               gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                               pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None,
                               mask_mod=None, block_sparse_tensors=None, aux_tensors=None, aux_scalars=None,
                               return_lse=False, **kw):
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
        assert cu_seqlens_k is None and page_table is None and gather_kv_indices is None
        assert seqused_k.dtype == torch.int32 and seqused_k.shape == (q.shape[0],) and causal
        B, T, H, D = q.shape
        Hkv = k.shape[2]
        assert k.shape == (B, k.shape[1], Hkv, D) and H % Hkv == 0
        out = torch.zeros(B, T, H, D, dtype=q.dtype)
        for b in range(B):
            n = int(seqused_k[b])
            for h in range(H):
                kv = h // (H // Hkv)
                for i in range(T):
                    last = i + n - T  # bottom-right causal alignment
                    out[b, i, h] = _attend_rows(q[b, i, h][None], k[b, : last + 1, kv], v[b, : last + 1, kv],
                                                softmax_scale)[0].to(q.dtype)
        calls.append(dict(fn="fa4", B=B, T=T, seqused_k=seqused_k.tolist()))
        return out, None

    return flash_attn_varlen_func


class _FakeWrapper:
    """Paged attention over HND pages, as FlashInfer documents it (decode and prefill)."""

    def __init__(self, calls, kind, workspace, kv_layout="NHD", use_cuda_graph=False, **kw):
        assert kv_layout == "HND" and workspace.dtype == torch.uint8
        self.calls, self.kind, self.graph = calls, kind, use_cuda_graph
        if use_cuda_graph:  # CUDA-graph mode: the caller's fixed buffers, the batch size fixed by them
            if kind == "decode":
                self.bufs = dict(indptr=kw["paged_kv_indptr_buffer"], indices=kw["paged_kv_indices_buffer"],
                                 last=kw["paged_kv_last_page_len_buffer"])
            else:
                self.bufs = dict(qo=kw["qo_indptr_buf"], indptr=kw["paged_kv_indptr_buf"],
                                 indices=kw["paged_kv_indices_buf"], last=kw["paged_kv_last_page_len_buf"])
            assert all(torch.is_tensor(b) and b.dtype == torch.int32 for b in self.bufs.values())
            assert len(self.bufs["indptr"]) == len(self.bufs["last"]) + 1

    def plan(self, *args, **kw):
        if self.kind == "prefill":
            qo, args = args[0], args[1:]
            assert kw.pop("causal") is True
        indptr, indices, last, H, Hkv, D, page_size = args
        for t in (indptr, indices, last):
            assert t.dtype == torch.int32
        if self.graph:  # as FlashInfer: copy into the fixed buffers; the (captured) run reads them
            assert len(indptr) == len(self.bufs["indptr"]) and len(indices) <= len(self.bufs["indices"])
            self.bufs["indptr"].copy_(indptr)
            self.bufs["last"].copy_(last)
            self.bufs["indices"][: len(indices)].copy_(indices)
            if self.kind == "prefill":
                self.bufs["qo"].copy_(qo)
        else:
            self.bufs = dict(indptr=indptr, indices=indices, last=last, **({"qo": qo} if self.kind == "prefill" else {}))
        self.p = dict(H=H, Hkv=Hkv, D=D, P=page_size, scale=kw["sm_scale"])
        assert kw["q_data_type"] is not None and kw["kv_data_type"] is not None
        self.calls.append(dict(fn="plan_" + self.kind, graph=self.graph))

    def _lists(self):
        """The page table as the kernel reads it: from the buffers at run time (a graph replay)."""
        b = self.bufs
        p = dict(self.p, indptr=b["indptr"].tolist(), last=b["last"].tolist())
        p["indices"] = b["indices"][: p["indptr"][-1]].tolist()
        if self.kind == "prefill":
            p["qo"] = b["qo"].tolist()
        return p

    def _kv(self, cache, r, p):
        pages = p["indices"][p["indptr"][r]: p["indptr"][r + 1]]
        parts = []
        for j, pg in enumerate(pages):
            n = p["last"][r] if j == len(pages) - 1 else p["P"]
            assert 1 <= n <= p["P"]
            parts.append(cache[pg, :, :n])  # (Hkv, n, D)
        return torch.cat(parts, dim=1)

    def run(self, q, kv):
        k, v = kv
        p = self._lists()
        assert k.shape[1:] == (p["Hkv"], p["P"], p["D"]) and q.shape[-2:] == (p["H"], p["D"])
        G = p["H"] // p["Hkv"]
        out = torch.zeros_like(q)
        n_req = len(p["indptr"]) - 1
        for r in range(n_req):
            kk, vv = self._kv(k, r, p), self._kv(v, r, p)
            n = kk.shape[1]
            if self.kind == "decode":
                for h in range(p["H"]):
                    out[r, h] = _attend_rows(q[r, h][None], kk[h // G], vv[h // G], p["scale"])[0].to(q.dtype)
            else:
                q0, q1 = p["qo"][r], p["qo"][r + 1]
                for i in range(q1 - q0):
                    last = i + n - (q1 - q0)
                    for h in range(p["H"]):
                        out[q0 + i, h] = _attend_rows(q[q0 + i, h][None], kk[h // G, : last + 1], vv[h // G, : last + 1],
                                                      p["scale"])[0].to(q.dtype)
        self.calls.append(dict(fn=self.kind, n_req=n_req, H=p["H"], Hkv=p["Hkv"], P=p["P"]))
        return out


def _runs(calls):
    """The kernel calls (plans left out)."""
    return [c for c in calls if not c["fn"].startswith("plan_")]


@pytest.fixture
def fakes(monkeypatch):
    """Fake ``flash_attn.cute`` and ``flashinfer`` modules; returns the list of recorded calls."""
    calls: list[dict] = []
    fa = types.ModuleType("flash_attn")
    fa.__spec__ = importlib.machinery.ModuleSpec("flash_attn", loader=None, is_package=True)
    cute = types.ModuleType("flash_attn.cute")
    cute.__spec__ = importlib.machinery.ModuleSpec("flash_attn.cute", loader=None)
    cute.flash_attn_varlen_func = _fake_fa4(calls)
    fa.cute = cute
    fi = types.ModuleType("flashinfer")
    fi.__spec__ = importlib.machinery.ModuleSpec("flashinfer", loader=None)
    fi.BatchDecodeWithPagedKVCacheWrapper = lambda ws, layout="NHD", **kw: _FakeWrapper(calls, "decode", ws, layout, **kw)
    fi.BatchPrefillWithPagedKVCacheWrapper = lambda ws, layout="NHD", **kw: _FakeWrapper(calls, "prefill", ws, layout, **kw)
    for name, mod in (("flash_attn", fa), ("flash_attn.cute", cute), ("flashinfer", fi)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


@pytest.fixture
def no_peers(monkeypatch):
    for name in ("flash_attn", "flash_attn.cute", "flashinfer"):
        monkeypatch.setitem(sys.modules, name, None)


def _case(B, Hkv, G, T, L, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.randint(1, L - T, (B,), generator=g)  # ragged
    return q, k, v, lengths


# ------------------------------------------------------------------ parity of the glue (fakes)
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("G", [1, 3])
def test_fa4_dense_equals_reference(fakes, T, G):
    q, k, v, lengths = _case(3, 2, G, T, 40, 16, seed=T + G)
    out = peers.fa4_dense(q, k, v, lengths, 0.3)
    torch.testing.assert_close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.3))[0], rtol=1e-5, atol=1e-5)
    assert fakes == [dict(fn="fa4", B=3, T=T, seqused_k=(lengths + T).tolist())]


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("G", [1, 3])
@pytest.mark.parametrize("L,P,used", [(40, 8, 8), (40, 16, 10), (41, 16, 41)])  # 40: the largest divisor <= 16; 41: prime
def test_flashinfer_dense_equals_reference(fakes, T, G, L, P, used):
    """Pages of ``P`` tokens (or the largest smaller divisor of ``L``, down to 4; else one page of
    ``L``) as strided views of the cache (ragged page counts, partial last pages)."""
    q, k, v, lengths = _case(3, 2, G, T, L, 16, seed=10 + T + G)
    out = peers.FlashInferRunner(workspace_mb=1, page_size=P).dense(q, k, v, lengths, 0.3)
    torch.testing.assert_close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.3))[0], rtol=1e-5, atol=1e-5)
    assert _runs(fakes) == [dict(fn="decode" if T == 1 else "prefill", n_req=3, H=2 * G, Hkv=2, P=used)]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("tail", [False, True])
def test_flashinfer_sparse_equals_reference(fakes, shared, tail):
    """Page size 1, heads folded into the batch: plan ∪ dense tail, causal, no position twice
    (plans here reach into the tail and past the row, and carry ``-1`` padding)."""
    B, Hkv, G, L, D = 3, 2, 3, 48, 16
    q, k, v, lengths = _case(B, Hkv, G, 1, L, D, seed=5)
    g = torch.Generator().manual_seed(6)
    idx = torch.stack([torch.randperm(L, generator=g)[:10] for _ in range(B * (1 if shared else Hkv))])
    idx = idx.view(B, 1 if shared else Hkv, 10)
    idx[:, :, -1] = -1
    dense_from = (lengths - 4).clamp(min=0) if tail else None
    meta = AttentionMetadata(lengths, 0.3, idx, dense_from)
    out = peers.FlashInferRunner(workspace_mb=1).sparse(q, k, v, lengths, 0.3, idx, dense_from)
    torch.testing.assert_close(out, REF.attend(q, k, v, meta)[0], rtol=1e-5, atol=1e-5)
    assert _runs(fakes) == [dict(fn="decode", n_req=B * Hkv, H=G, Hkv=1, P=1)]


def test_token_lists_match_visibility_mask():
    from specdec.attention.reference import visibility_mask

    B, Hkv, L = 4, 3, 30
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(5, L - 1, (B,), generator=g)
    idx = torch.randint(-1, L, (B, Hkv, 8), generator=g)
    idx = torch.stack([torch.stack([torch.randperm(L, generator=g)[:8] for _ in range(Hkv)]) for _ in range(B)])
    dense_from = lengths - 3
    indptr, pages = peers.token_lists(idx, dense_from, lengths, Hkv, L)
    mask = visibility_mask(lengths, 1, L, idx, dense_from)[:, :, 0]  # (B, Hkv, L)
    for b in range(B):
        for h in range(Hkv):
            r = b * Hkv + h
            got = sorted(int(p) - r * L for p in pages[indptr[r]: indptr[r + 1]])
            assert got == mask[b, h].nonzero().flatten().tolist()


# ------------------------------------------------------------------ when a peer is taken
CUDA = torch.device("cuda")  # a device object only: nothing runs on it


def _call(T=1, D=64, B=2, dtype=torch.bfloat16, device=CUDA):
    return types.SimpleNamespace(dtype=dtype, device=device, shape=(B, 9, T, D))


def _kc(L=100, contiguous=True):
    return types.SimpleNamespace(shape=(2, 3, L, 64), is_contiguous=lambda: contiguous)


DENSE = AttentionMetadata(torch.zeros(2, dtype=torch.long), 1.0)
SPARSE = DENSE.replace(plan_indices=torch.zeros(2, 1, 4, dtype=torch.long))


def test_pick_reads_the_table():
    table = {("decode", 64): [(1000, "flashinfer"), (10**9, "fa4")], ("verify", 128): [(10**9, "triton")]}
    assert peers.pick("decode", 64, 1000, table) == "flashinfer"
    assert peers.pick("decode", 64, 1001, table) == "fa4"
    assert peers.pick("decode", 128, 5, table) == "triton"  # unmeasured head dim
    assert peers.pick("sparse", 64, 5, table) == "triton"
    assert peers.pick("decode", 64, 5) == "triton" or peers.PICKS  # the shipped table


def test_auto_follows_the_table(fakes):
    be = TritonBackend(TritonConfig())
    assert be._peers == {"fa4", "flashinfer", "sdpa"}
    be._peer_table = {("decode", 64): [(150, "fa4"), (10**9, "flashinfer")], ("verify", 64): [(10**9, "fa4")],
                      ("sparse", 64): [(10**9, "flashinfer")]}
    assert be.peer_for(_call(), _kc(75), DENSE) == "fa4"  # B·L = 150
    assert be.peer_for(_call(), _kc(76), DENSE) == "flashinfer"
    assert be.peer_for(_call(T=5), _kc(), DENSE) == "fa4"
    assert be.peer_for(_call(), _kc(), SPARSE) == "flashinfer"
    assert be.peer_for(_call(T=5), _kc(), SPARSE) == "triton"  # FlashInfer's sparse path is one row
    assert be.peer_for(_call(), _kc(contiguous=False), SPARSE) == "triton"  # pages are views of the cache
    assert be.peer_for(_call(), _kc(), DENSE.replace(score_rows=[0])) == "triton"  # scores stay ours
    assert be.peer_for(_call(), _kc(), DENSE.replace(static=True)) == "triton"  # capture: GRAPH_PICKS (ours at d 64)
    assert be.peer_for(_call(dtype=torch.float32), _kc(), DENSE) == "triton"
    assert be.peer_for(_call(device=torch.device("cpu")), _kc(), DENSE) == "triton"
    be._peer_table = {}
    assert be.peer_for(_call(), _kc(), DENSE) == "triton"  # unmeasured: ours


def test_forced_peer_serves_what_it_can(fakes):
    fa4 = TritonBackend(TritonConfig(peers="fa4"))
    assert fa4.peer_for(_call(T=5), _kc(), DENSE) == "fa4"
    assert fa4.peer_for(_call(), _kc(), SPARSE) == "triton"  # FA4's gather is MLA/SM100 only
    fi = TritonBackend(TritonConfig(peers="flashinfer"))
    assert fi.peer_for(_call(T=5), _kc(), DENSE) == "flashinfer"
    assert fi.peer_for(_call(), _kc(), SPARSE) == "flashinfer"
    assert TritonBackend(TritonConfig(peers="off")).peer_for(_call(), _kc(), DENSE) == "triton"


def test_attend_routes_to_the_peer(fakes, monkeypatch):
    """Through ``attend`` (the CUDA condition relaxed to the CPU for this test)."""
    be = TritonBackend(TritonConfig(peers="flashinfer", block_n=16))
    monkeypatch.setattr(be, "peer_for", lambda q, k, meta: "flashinfer" if not meta.wants_scores else "triton")
    be._flashinfer = peers.FlashInferRunner(workspace_mb=1)
    q, k, v, lengths = _case(2, 3, 3, 5, 48, 16, seed=7)
    out, s = be.attend(q, k, v, AttentionMetadata(lengths, 0.25))
    assert s is None and [c["fn"] for c in _runs(fakes)] == ["prefill"]
    torch.testing.assert_close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.25))[0], rtol=1e-5, atol=1e-5)
    meta = AttentionMetadata(lengths, 0.25, score_rows=[0, 4])  # scores: our kernel (interpreter)
    out, s = be.attend(q, k, v, meta)
    assert len(_runs(fakes)) == 1 and s is not None
    torch.testing.assert_close(out, REF.attend(q, k, v, meta)[0], rtol=1e-4, atol=2e-5)


def test_forced_peer_missing_is_one_clear_error(no_peers):
    with pytest.raises(SpecdecError, match=r"peers='fa4' needs fa4.*pip install 'specdec\[flash\]'"):
        TritonBackend(TritonConfig(peers="fa4"))
    with pytest.raises(SpecdecError, match=r"pip install .specdec\[flashinfer\]. \(flashinfer-python\)"):
        TritonBackend(TritonConfig(peers="flashinfer"))
    assert TritonBackend(TritonConfig()).peer_for(_call(), _kc(), DENSE) == "triton"  # auto: silently ours


def test_fa4_package_is_not_flash_attn_2(tmp_path, monkeypatch):
    """The flash-attn-4 wheel installs ``flash_attn/cute`` only: the flash-attn 2 glue must not
    take it for flash-attn 2 (``from flash_attn import flash_attn_with_kvcache`` would fail)."""
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert peers.fa4_installed() and not peers.fa2_installed()
    assert not TritonBackend(TritonConfig())._flash
    (tmp_path / "flash_attn" / "flash_attn_interface.py").write_text("")
    assert peers.fa2_installed()


def test_half_installed_peer_falls_back_or_fails_clearly(tmp_path, monkeypatch):
    """FA4 found but not importable (its CUTLASS DSL missing, as on the H200 without the dsl_packages path):
    ``auto`` warns once and runs our kernel; a forced ``peers='fa4'`` names the problem and the fix."""
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("import cutlass_dsl_not_here_42\n")
    for name in ("flash_attn", "flash_attn.cute", "flashinfer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # not installed
    monkeypatch.syspath_prepend(str(tmp_path))
    assert peers.fa4_installed() and "cutlass_dsl_not_here_42" in peers.import_error("fa4")
    be = TritonBackend(TritonConfig())
    be._peer_table = {("verify", 64): [(10**9, "fa4")]}
    with pytest.warns(RuntimeWarning, match=r"fa4 is installed but does not import .*cutlass_dsl_not_here_42.*"
                                            r"Triton kernel runs instead"):
        assert be.peer_for(_call(T=5), _kc(), DENSE) == "triton"
    assert "fa4" not in be._peers and be.peer_for(_call(T=5), _kc(), DENSE) == "triton"  # warned once, dropped
    forced = TritonBackend(TritonConfig(peers="fa4"))
    with pytest.raises(SpecdecError, match=r"peers='fa4': fa4 is installed but does not import .*pip install"):
        forced.peer_for(_call(T=5), _kc(), DENSE)


# ------------------------------------------------------------------ the measured table (H200, 2026-12-01)
RESULTS = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results")
RUN = os.path.join(RESULTS, "gpu_peers_2026-12-01.json")  # 12:54 UTC: every kind and shape
# the re-run of 15:13 UTC: d 64 decode / verify only, with the capturable forms (flashinfer_graph, sdpa_masked)
RERUN = os.path.join(RESULTS, "gpu_peers_2026-12-01c.json")
# benchmarks/gpu/s18.sh, 17:42 UTC: d 128 decode / verify of the four kernels and their capturable forms
# (its d 64 verify rows are not taken: the d 64 picks stay with their own run)
S18 = os.path.join(RESULTS, "gpu_scores_2026-12-01d.json")


def _bench_module():
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu", "peers.py")
    spec = importlib.util.spec_from_file_location("_peers_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(rows, fresh):
    """``rows`` with every (kind, D, B, L) that ``fresh`` timed replaced by ``fresh``'s rows; returns the
    merged rows and the replaced keys."""
    redone = {(r["kind"], r["D"], r["B"], r["L"]) for r in fresh if "us" in r}
    return [r for r in rows if (r.get("kind"), r.get("D"), r.get("B"), r.get("L")) not in redone] + fresh, redone


def _run_rows():
    import json

    with open(RUN) as f:
        rows = json.load(f)["rows"]
    with open(RERUN) as f:
        rows, redone = _replace(rows, json.load(f)["rows"])
    assert len(redone) == 6  # d 64 decode, verify × B = 1, 16, 64
    with open(S18) as f:
        s18 = [r for r in json.load(f)["rows"] if r.get("D") == 128 and r.get("kind") in ("decode", "verify")]
    rows, redone = _replace(rows, s18)
    assert redone == {(k, 128, B, L) for k in ("decode", "verify") for B, L in ((1, 131072), (16, 32768))}
    return rows


def test_shipped_table_is_the_run_derived():
    """``peers.PICKS`` is what ``derive_picks`` makes of the H200 run (ours on ties within 3 %)."""
    table = _bench_module().derive_picks(_run_rows())
    assert {k: [tuple(e) for e in v] for k, v in table.items()} == peers.PICKS
    assert peers.MEASURED == "2026-12-01"


def test_shipped_picks_are_within_5_percent_of_the_fastest():
    """For every measured call kind and shape the kernel the table picks is within 5 % of the
    fastest of the four (ours, FA4, FlashInfer, SDPA) and can serve the call."""
    times: dict[tuple, dict[str, float]] = {}
    for r in _run_rows():
        if r["kind"] in ("decode", "verify", "sparse") and "us" in r:
            assert r["parity_ok"], r
            times.setdefault((r["kind"], r["D"], r["B"], r["L"]), {})[r["variant"]] = r["us"]
    assert len(times) == 15  # 3 kinds × 5 shapes
    picked_sdpa = 0
    for (kind, D, B, L), t in times.items():
        got = peers.pick(kind, D, B * L)
        assert peers.can_serve(got, 1 if kind != "verify" else 5, kind == "sparse"), (kind, D, B, L, got)
        assert t[got] <= 1.05 * min(t.values()), (kind, D, B, L, got, t)
        picked_sdpa += got == "sdpa"
    assert picked_sdpa == 2  # d 64 B=16×8k and d 128 B=1×128k decode


def test_shipped_graph_picks_are_within_5_percent_of_the_fastest_capturable():
    """Under capture, for every measured call kind and shape, the kernel :data:`peers.GRAPH_PICKS` picks
    is within 5 % of the fastest capturable kernel measured there (ours, FA4, FlashInfer's graph mode —
    its eager decode where the graph mode was not timed — and the masked SDPA decode) and is capturable."""
    times: dict[tuple, dict[str, float]] = {}
    for r in _run_rows():
        if r["kind"] in ("decode", "verify", "sparse") and "us" in r:
            times.setdefault((r["kind"], r["D"], r["B"], r["L"]), {})[r["variant"]] = r["us"]
    assert len(times) == 15
    for (kind, D, B, L), t in times.items():
        sparse, T = kind == "sparse", 5 if kind == "verify" else 1
        cand = {"triton": t["triton"]}
        if not sparse:
            cand.update({p: t[p] for p in ("fa4",) if p in t})
            if "flashinfer_graph" in t:
                cand["flashinfer"] = t["flashinfer_graph"]
            elif kind == "decode" and "flashinfer" in t:
                cand["flashinfer"] = t["flashinfer"]
        if kind == "decode" and "sdpa_masked" in t:
            cand["sdpa"] = t["sdpa_masked"]
        got = peers.pick(kind, D, B * L, graph=True)
        assert peers.capturable(got, T, sparse), (kind, D, B, L, got)
        assert got in cand and cand[got] <= 1.05 * min(cand.values()), (kind, D, B, L, got, cand)


def test_derive_picks_keeps_ours_on_a_tie():
    derive = _bench_module().derive_picks

    def rows(kind, us):
        return [dict(kind=kind, D=64, B=1, L=1000, variant=v, us=x, parity_ok=True) for v, x in us.items()]

    assert derive(rows("decode", dict(triton=102.0, sdpa=100.0, fa4=150.0))) == {("decode", 64): [(10**12, "triton")]}
    assert derive(rows("decode", dict(triton=104.0, sdpa=100.0))) == {("decode", 64): [(10**12, "sdpa")]}
    # SDPA is a candidate for decode only (the backend cannot hand it a verify or sparse call)
    assert derive(rows("verify", dict(triton=104.0, sdpa=50.0, flashinfer=110.0))) == {("verify", 64): [(10**12, "triton")]}
    # a failed parity check does not count
    bad = rows("verify", dict(triton=104.0, flashinfer=90.0))
    bad[1]["parity_ok"] = False
    assert derive(bad) == {("verify", 64): [(10**12, "triton")]}


def test_auto_sends_decode_to_sdpa_where_the_table_says(no_peers):
    be = TritonBackend(TritonConfig())
    assert be._peers == {"sdpa"}  # always there, with or without the peers
    be._peer_table = {("decode", 64): [(10**9, "sdpa")], ("verify", 64): [(10**9, "sdpa")],
                      ("sparse", 64): [(10**9, "sdpa")]}
    assert be.peer_for(_call(), _kc(), DENSE) == "sdpa"
    assert be.peer_for(_call(T=5), _kc(), DENSE) == "triton"  # SDPA serves one dense row only
    assert be.peer_for(_call(), _kc(), SPARSE) == "triton"
    assert be.peer_for(_call(), _kc(), DENSE.replace(static=True)) == "triton"  # capture: the graph table
    assert be.peer_for(_call(), _kc(), DENSE.replace(score_rows=[0])) == "triton"
    assert TritonBackend(TritonConfig(peers="off")).peer_for(_call(), _kc(), DENSE) == "triton"


@pytest.mark.parametrize("ragged", [False, True])
def test_sdpa_decode_through_attend_equals_reference(monkeypatch, ragged):
    be = TritonBackend(TritonConfig())
    monkeypatch.setattr(be, "peer_for", lambda q, k, meta: "sdpa")  # the CUDA condition relaxed to the CPU
    q, k, v, lengths = _case(3, 3, 3, 1, 40, 16, seed=11)
    lengths = torch.tensor([20, 31, 9]) if ragged else torch.full((3,), 25)
    meta = AttentionMetadata(lengths, 0.25)
    out, s = be.attend(q, k, v, meta)
    assert s is None
    torch.testing.assert_close(out, REF.attend(q, k, v, meta)[0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ under CUDA-graph capture
def test_static_calls_pick_from_the_graph_table(fakes):
    """A static call (under capture) reads the graph table and takes only a capturable kernel."""
    be = TritonBackend(TritonConfig())
    be._peer_table = {("decode", 64): [(10**9, "fa4")], ("verify", 64): [(10**9, "fa4")]}
    be._graph_table = {("decode", 64): [(10**9, "sdpa")], ("verify", 64): [(150, "flashinfer"), (10**9, "fa4")],
                       ("sparse", 64): [(10**9, "flashinfer")]}
    st = DENSE.replace(static=True)
    assert be.peer_for(_call(), _kc(), DENSE) == "fa4"  # eager: the eager table
    assert be.peer_for(_call(), _kc(), st) == "sdpa"  # its masked form (sdpa_decode_static)
    assert be.peer_for(_call(T=5), _kc(75), st) == "flashinfer"
    assert be.peer_for(_call(T=5), _kc(76), st) == "fa4"
    assert be.peer_for(_call(), _kc(), SPARSE.replace(static=True)) == "triton"  # FlashInfer's sparse path: host lists
    assert be.graph_fallbacks == {("flashinfer", "sparse", "triton"): 1}  # said
    be.graph_fallbacks.clear()
    assert be.peer_for(_call(T=5), _kc(), st.replace(score_rows=[0])) == "triton"
    be._graph_table = None  # the shipped GRAPH_PICKS: ours at head dim 64
    assert be.peer_for(_call(T=5), _kc(), st) == "triton"
    assert not be.graph_fallbacks  # FA4 (the eager pick) can be captured: the graph table just measured it slower
    be._peer_table = {("decode", 64): [(10**9, "sdpa")], ("sparse", 64): [(10**9, "flashinfer")]}
    assert be.peer_for(_call(), _kc(), st) == "triton" and be.peer_for(_call(), _kc(), SPARSE.replace(static=True)) == "triton"
    # said: the eager picks these calls gave up under capture (the eager SDPA decode slices on the host; its
    # masked, capturable form is another kernel, which the table measured for capture does not name)
    assert be.graph_fallbacks == {("flashinfer", "sparse", "triton"): 1, ("sdpa", "decode", "triton"): 1}
    fi = TritonBackend(TritonConfig(peers="flashinfer"))
    assert fi.peer_for(_call(T=5), _kc(), st) == "flashinfer"  # forced: wherever it can be captured
    assert fi.peer_for(_call(), _kc(), SPARSE.replace(static=True)) == "triton"
    assert fi.graph_fallbacks == {("flashinfer", "sparse", "triton"): 1}
    assert fi.peer_for(_call(), _kc(), SPARSE) == "flashinfer"  # eagerly it serves the sparse row
    assert TritonBackend(TritonConfig(peers="fa4")).peer_for(_call(), _kc(), st) == "fa4"
    for peer, T, sparse, ok in [("fa4", 5, False, True), ("fa4", 1, True, False), ("flashinfer", 1, True, False),
                                ("flashinfer", 5, False, True), ("sdpa", 1, False, True), ("sdpa", 5, False, False)]:
        assert peers.capturable(peer, T, sparse) is ok, (peer, T, sparse)


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("L,P", [(48, 16), (40, 16), (41, 16)])  # pages of 16, of 10 (40), one of 41 (prime)
def test_flashinfer_graph_mode_replans_before_replay(fakes, monkeypatch, T, L, P):
    """The capture protocol: a static FlashInfer call plans its CUDA-graph wrapper at the first call
    (the capture's warm-up), ``capture_end`` names the shape, ``before_replay`` re-plans it for new
    lengths, and the "replayed" kernel (reading the fixed buffers) then matches the reference at the
    new lengths — and not without the re-plan."""
    be = TritonBackend(TritonConfig(peers="flashinfer", block_n=16))
    monkeypatch.setattr(be, "peer_for", lambda q, k, meta: "flashinfer")  # the CUDA condition relaxed to the CPU
    B, Hkv, G, D = 3, 2, 3, 16
    q, k, v, lengths = _case(B, Hkv, G, T, L, D, seed=20 + T + L)
    be._fi_graph = peers.FlashInferGraphRunner(workspace_mb=1, page_size=P)
    be.capture_begin()
    meta = AttentionMetadata(lengths, 0.3, static=True)
    out, s = be.attend(q, k, v, meta)  # the first warm-up: plans
    out2, _ = be.attend(q, k, v, meta)  # the second warm-up / the capture: no new plan
    token = be.capture_end()
    assert s is None and token is not None and len(token) == 1 and be._fi_graph.plans_made == 1
    ref = REF.attend(q, k, v, AttentionMetadata(lengths, 0.3))[0]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2, ref, rtol=1e-5, atol=1e-5)
    (key,) = token
    w = be._fi_graph._plans[key]["wrapper"]
    assert w.graph and len(w.bufs["indices"]) == B * (L // peers.page_size_for(k, P))  # sized for the capacity
    new = torch.tensor([L - T - 1, 2, L // 2])
    new_ref = REF.attend(q, k, v, AttentionMetadata(new, 0.3))[0]
    stale = be._fi_graph.run(key, q, k, v)  # a replay without the re-plan reads the old page table
    assert (stale - new_ref).abs().max() > 1e-2
    be.before_replay(token, new)
    assert be._fi_graph.plans_made == 2
    torch.testing.assert_close(be._fi_graph.run(key, q, k, v), new_ref, rtol=1e-5, atol=1e-5)
    be.before_replay(None, new)  # a forward without planned peers: nothing
    assert be._fi_graph.plans_made == 2
    be.capture_begin()
    assert be.capture_end() is None  # nothing planned in this capture
    # another graph of the same shape captured now: planned again at its first warm-up for its own
    # lengths (the replay right after its capture reads them), once
    be.capture_begin()
    out3, _ = be.attend(q, k, v, meta)
    be.attend(q, k, v, meta)
    assert be.capture_end() == token and be._fi_graph.plans_made == 3
    torch.testing.assert_close(be._fi_graph.run(key, q, k, v), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ragged", [False, True])
def test_sdpa_decode_static_equals_reference(monkeypatch, ragged):
    """The capture-safe SDPA decode (mask over the whole capacity), through ``attend`` as a static call."""
    be = TritonBackend(TritonConfig())
    monkeypatch.setattr(be, "peer_for", lambda q, k, meta: "sdpa")
    q, k, v, _ = _case(3, 3, 3, 1, 40, 16, seed=12)
    lengths = torch.tensor([20, 31, 9]) if ragged else torch.full((3,), 25)
    meta = AttentionMetadata(lengths, 0.25)
    ref = REF.attend(q, k, v, meta)[0]
    out, s = be.attend(q, k, v, meta.replace(static=True))
    assert s is None
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(peers.sdpa_decode_static(q, k, v, lengths, 0.25), ref, rtol=1e-5, atol=1e-5)


def test_graph_cache_replans_before_each_replay():
    """``GraphCache.run`` hands the live lengths to the captured backend's ``before_replay`` before
    the replay (and not for a graph without planned peers)."""
    from specdec.cache import KVCache
    from specdec.graphs import GraphCache, _Graph, describe_step

    order = []

    class Backend:
        config = None

        def before_replay(self, token, lengths):
            order.append(("plan", token, lengths.tolist()))

    class Graph:
        def replay(self):
            order.append(("replay",))

    be = Backend()
    model = types.SimpleNamespace(backend=be, keep_hidden=False)
    cache = KVCache(2, 2, 1, 32, 8, torch.float32, "cpu")
    gc = GraphCache(model, pool=object())
    ids = torch.zeros(2, 5, dtype=torch.long)
    key = describe_step(model, ids, cache, None, (), 1)
    for replan in ("token", None):
        order.clear()
        gc.graphs[key] = _Graph(graph=Graph(), ids=ids.clone(), lengths=torch.zeros(2, dtype=torch.long), plan=None,
                                reqs=(), logits=torch.zeros(2, 1, 3), backend=be, replan=replan)
        gc.run(ids, cache, torch.tensor([7, 9]), None, (), 1)
        assert order == ([("plan", "token", [7, 9]), ("replay",)] if replan else [("replay",)])


def test_shipped_graph_table_is_the_run_derived():
    """``peers.GRAPH_PICKS`` is ``derive_picks(rows, graph=True)`` of the H200 run: capturable kernels only."""
    table = _bench_module().derive_picks(_run_rows(), graph=True)
    assert {k: [tuple(e) for e in v] for k, v in table.items()} == peers.GRAPH_PICKS
    for key, entries in peers.GRAPH_PICKS.items():
        for _, peer in entries:
            assert peers.capturable(peer, 1 if key[0] != "verify" else 5, key[0] == "sparse"), (key, peer)


def test_shipped_graph_table_routes_d128_decode(fakes):
    """With the shipped tables a captured 8B-shape decode of one sequence over 128k goes to the masked
    SDPA (144.7 vs ours 159.9 µs on the H200, 17:42 UTC), of 16 × 32k stays ours; the verify goes to ours
    at 1 × 128k and to FA4 at 16 × 32k; nothing is recorded as given up under capture."""
    be = TritonBackend(TritonConfig())
    st = DENSE.replace(static=True)
    assert be.peer_for(_call(B=1, D=128), _kc(131072), st) == "sdpa"
    assert be.peer_for(_call(B=16, D=128), _kc(32768), st) == "triton"
    assert be.peer_for(_call(T=5, B=1, D=128), _kc(131072), st) == "triton"
    assert be.peer_for(_call(T=5, B=16, D=128), _kc(32768), st) == "fa4"
    assert be.peer_for(_call(T=5, B=1, D=128), _kc(131072), DENSE) == "triton"  # eager: PICKS, ours (FI +1.8 %)
    assert not be.graph_fallbacks


def test_derive_graph_picks_takes_only_capturable_kernels():
    derive = _bench_module().derive_picks

    def rows(kind, us):
        return [dict(kind=kind, D=64, B=1, L=1000, variant=v, us=x, parity_ok=True) for v, x in us.items()]

    # the unmasked SDPA is not a candidate under capture; its masked form is (as "sdpa")
    assert derive(rows("decode", dict(triton=110.0, sdpa=50.0)), graph=True) == {("decode", 64): [(10**12, "triton")]}
    assert derive(rows("decode", dict(triton=110.0, sdpa=50.0, sdpa_masked=90.0)), graph=True) == {
        ("decode", 64): [(10**12, "sdpa")]}
    # FlashInfer's graph-mode row replaces its eager row; its sparse path is never a candidate
    assert derive(rows("verify", dict(triton=110.0, flashinfer=90.0, flashinfer_graph=120.0)), graph=True) == {
        ("verify", 64): [(10**12, "triton")]}
    # ... but an eager verify time does not stand in for the graph mode (measured 1.6-2.4x slower);
    # for decode it does (measured equal)
    assert derive(rows("verify", dict(triton=110.0, flashinfer=90.0)), graph=True) == {
        ("verify", 64): [(10**12, "triton")]}
    assert derive(rows("decode", dict(triton=110.0, flashinfer=90.0)), graph=True) == {
        ("decode", 64): [(10**12, "flashinfer")]}
    assert derive(rows("sparse", dict(triton=110.0, flashinfer=90.0)), graph=True) == {("sparse", 64): [(10**12, "triton")]}
    assert derive(rows("sparse", dict(triton=110.0, flashinfer=90.0))) == {("sparse", 64): [(10**12, "flashinfer")]}
