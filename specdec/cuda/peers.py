"""Peer attention kernels next to ours: FlashAttention-4 (``flash_attn.cute``) and FlashInfer.

The triton backend (``TritonConfig.peers``) sends a call to a peer when the peer is installed, can
serve the call, and the table :data:`PICKS` — filled from a measurement on the GPU — says it is the
fastest for that call kind and size. Everything else (score requests, fp32, the CPU, CUDA-graph
capture, shapes a peer cannot take) stays in our kernel.

What each peer can serve here (read from their sources: FA4 4.0.0b36, FlashInfer 0.7.4):

============  ===========================================  ==============================================
call kind     FlashAttention-4                             FlashInfer
============  ===========================================  ==============================================
decode (1)    ``flash_attn_varlen_func``, ``seqused_k``    ``BatchDecodeWithPagedKVCacheWrapper``, HND,
                                                           16-token pages = strided views of our cache
verify (T)    same, ``causal=True`` (bottom-right)         ``BatchPrefillWithPagedKVCacheWrapper``, causal
sparse (1)    no: its top-k gather needs ``qv`` (MLA,      page size 1, heads folded into the batch:
              SM100) and block sparsity is per tile        page ``(b·H_kv + h)·L + pos`` = our token gather
scores        no                                           no
============  ===========================================  ==============================================

FA4 on SM90 has no split-KV (``"SplitKV not supported on SM 9.0"``): one CTA per (sequence, KV head)
with packed GQA, so it can lose at small batch and long context; the table decides.

PyTorch SDPA is the fourth kernel measured and wins two decode shapes by more than 5 %; the table
can name it (``"sdpa"``: dense single row, no scores) and the backend then runs
:func:`sdpa_decode`. Its measured call reads a full cache without a mask; in the engine the cache is
longer than the context, so :func:`sdpa_decode` sizes the slice with one host read.

**Under CUDA-graph capture** (the engine's default path on CUDA) a call may only go to a kernel that
can be captured and replayed with new lengths, so the backend picks from a second table,
:data:`GRAPH_PICKS`, whose candidates are those kernels only (:func:`capturable`):

* ours;
* FA4: ``flash_attn_varlen_func`` with a device ``seqused_k`` launches on the current stream with no
  host read once its kernel is compiled; the capture's warm-up compiles it (``benchmarks/gpu/peers.py``
  captured it in every timed row);
* FlashInfer, dense decode and verify only: :class:`FlashInferGraphRunner` keeps wrappers in
  CUDA-graph mode (``use_cuda_graph=True``) whose indptr / page-list / last-page buffers are sized
  for the cache's capacity; ``plan()`` (host work: it needs the lengths on the host) runs at the
  capture's first warm-up and again before every replay (``GraphCache`` calls
  ``TritonBackend.before_replay``: one host read of the lengths per replayed forward that uses it),
  the way vLLM and SGLang drive FlashInfer under graphs. Its sparse path is not capturable (the page
  lists come from the plan's indices, built on the host);
* SDPA for one dense row in the masked form :func:`sdpa_decode_static` (a mask over the whole
  capacity, no host slice) — a different kernel from the measured unmasked call, so it is a
  candidate only where ``benchmarks/gpu/peers.py`` measured that form (variant ``sdpa_masked``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

from specdec.errors import SpecdecError

Peer = Literal["triton", "fa4", "flashinfer", "sdpa"]
Kind = Literal["decode", "verify", "sparse"]

#: Date of the measurements behind :data:`PICKS` and :data:`GRAPH_PICKS` (``benchmarks/gpu/peers.py`` on an
#: H200, 2026-12-01): ``benchmarks/results/gpu_peers_2026-12-01.json`` (12:54 UTC, every kind and shape),
#: its d 64 decode / verify rows replaced by ``gpu_peers_2026-12-01c.json`` (15:13 UTC re-run) and its d 128
#: decode / verify rows by ``gpu_scores_2026-12-01d.json`` (``benchmarks/gpu/s18.sh``, 17:42 UTC, the four
#: kernels and their capturable forms side by side); d 128 sparse rows from the first run. The shipped
#: tables are ``derive_picks`` of those rows (``tests/test_peers_glue.py`` pins it).
MEASURED: str | None = "2026-12-01"

#: Ours stays the pick unless the fastest kernel beats it by more than this fraction (fewer moving
#: parts on a tie); ``benchmarks/gpu/peers.py:derive_picks`` applies it.
TIE = 0.03

#: ``(kind, head_dim) -> [(max_tokens, peer), ...]``: the fastest kernel for calls whose ``B · L``
#: (cached tokens over the batch) is at most ``max_tokens`` (first match wins; no match: ours).
#: Measured sizes: d 64 at B·L = 8k, 128k, 512k (B = 1, 16, 64 × 8k), d 128 at 128k (B = 1 × 128k)
#: and 512k (B = 16 × 32k); boundaries at the geometric middle. Ours within :data:`TIE` of the
#: fastest keeps the call (d 64 decode at B = 64: SDPA 2.6 % faster in the 15:13 re-run; d 128 at
#: 17:42 UTC: decode at 16 × 32k SDPA 2.3 %, FA4 0.4 % faster, verify at 1 × 128k FlashInfer 1.8 %;
#: d 128 sparse at 1 × 128k: FlashInfer 0.1 %).
PICKS: dict[tuple[str, int], list[tuple[int, str]]] = {
    ("decode", 64): [(32768, "triton"), (262144, "sdpa"), (10**12, "triton")],  # B=16×8k: 30.5 vs 35.8 µs (re-run)
    ("verify", 64): [(10**12, "triton")],
    ("sparse", 64): [(10**12, "triton")],
    ("decode", 128): [(262144, "sdpa"), (10**12, "triton")],  # 1×128k: 132.6 vs 159.9 µs (17:42 UTC)
    ("verify", 128): [(262144, "triton"), (10**12, "fa4")],  # 152.3 vs FI 149.6; FA4 488.1 vs 516.4 µs
    ("sparse", 128): [(10**12, "triton")],
}


#: The same for calls under CUDA-graph capture: ``derive_picks(rows, graph=True)`` of the same rows,
#: capturable kernels only (:func:`capturable`): ours, FA4, FlashInfer's CUDA-graph wrapper and the
#: masked SDPA decode. d 64 (15:13 UTC re-run): ours is the fastest capturable kernel at every shape
#: (masked SDPA 41.3 vs 35.8 µs at B = 16 × 8k; FlashInfer's graph-mode verify 279.5 vs ours 102.6 µs
#: at B = 64 × 8k). d 128 (17:42 UTC): decode at 1 × 128k goes to the masked SDPA (144.7 vs ours
#: 159.9 µs), at 16 × 32k stays ours (491.8; FA4 489.6, masked SDPA 495.0 µs); verify at 1 × 128k stays
#: ours (152.3; FlashInfer's graph mode 152.2 µs), at 16 × 32k goes to FA4 (488.1 vs 516.4 µs).
GRAPH_PICKS: dict[tuple[str, int], list[tuple[int, str]]] = {
    ("decode", 64): [(10**12, "triton")],
    ("verify", 64): [(10**12, "triton")],
    ("sparse", 64): [(10**12, "triton")],
    ("decode", 128): [(262144, "sdpa"), (10**12, "triton")],
    ("verify", 128): [(262144, "triton"), (10**12, "fa4")],
    ("sparse", 128): [(10**12, "triton")],
}


def pick(kind: str, head_dim: int, tokens: int, table: dict | None = None, graph: bool = False) -> str:
    """The measured winner for a call kind, head dim and ``B · L`` (``"triton"`` when unmeasured);
    ``graph``: among the capturable kernels (:data:`GRAPH_PICKS`) when ``table`` is not given."""
    if table is None:
        table = GRAPH_PICKS if graph else PICKS
    for max_tokens, peer in table.get((kind, int(head_dim)), []):
        if tokens <= max_tokens:
            return peer
    return "triton"


def capturable(peer: str, T: int, sparse: bool) -> bool:
    """Whether ``peer`` serves this call kind under CUDA-graph capture (see the module docstring)."""
    if peer == "triton":
        return True
    if peer == "fa4":
        return not sparse
    if peer == "flashinfer":
        return not sparse  # the sparse page lists are built on the host from the plan
    if peer == "sdpa":
        return T == 1 and not sparse  # as sdpa_decode_static
    return False


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def fa4_installed() -> bool:
    """Whether FlashAttention-4 (``flash_attn.cute``) can be imported (looked up, not imported)."""
    if _spec("flash_attn") is None:
        return False
    return _spec("flash_attn.cute") is not None


def fa2_installed() -> bool:
    """Whether flash-attn **2** (``flash_attn.flash_attn_with_kvcache``) is installed.

    The ``flash-attn-4`` wheel also installs a ``flash_attn`` package, holding only ``cute``: a
    package whose files lack ``flash_attn_interface.py`` is not flash-attn 2.
    """
    spec = _spec("flash_attn")
    if spec is None:
        return False
    locs = list(spec.submodule_search_locations or [])
    if not locs:  # a module object registered by hand (tests): trust it
        return True
    return any(os.path.exists(os.path.join(p, "flash_attn_interface.py")) for p in locs)


def flashinfer_installed() -> bool:
    return _spec("flashinfer") is not None


INSTALLED = {"fa4": fa4_installed, "flashinfer": flashinfer_installed}
#: the module a peer's glue imports (``INSTALLED`` only looks it up: importing FA4 takes ~15 s)
MODULES = {"fa4": "flash_attn.cute", "flashinfer": "flashinfer"}


def import_error(peer: str) -> str | None:
    """Why ``peer``'s module, found by :data:`INSTALLED`, fails to import (``None``: it imports).

    A half-installed peer is found but does not import, e.g. ``flash_attn.cute`` without its CUTLASS DSL
    package on the path (``ModuleNotFoundError: No module named 'cutlass'``)."""
    try:
        importlib.import_module(MODULES[peer])
    except (ImportError, OSError) as e:  # a missing dependency, or a shared library that does not load
        return f"{type(e).__name__}: {e}"
    return None
HOW_TO_INSTALL = {
    "fa4": "pip install 'specdec[flash]' (flash-attn-4)",
    "flashinfer": "pip install 'specdec[flashinfer]' (flashinfer-python)",
}


def resolve(mode: str) -> frozenset[str]:
    """Peers a backend with ``peers=mode`` may call: ``"auto"`` the installed ones and SDPA (always
    there; through the table), ``"off"`` none, ``"fa4"`` / ``"flashinfer"`` that one, wherever it can serve (fails
    when it is not installed)."""
    if mode == "off":
        return frozenset()
    if mode == "auto":
        return frozenset(p for p, ok in INSTALLED.items() if ok()) | {"sdpa"}
    if mode in INSTALLED:
        if not INSTALLED[mode]():
            raise SpecdecError(f"peers={mode!r} needs {mode}, which is not installed; "
                               f"{HOW_TO_INSTALL[mode]} (or use peers='auto' or 'off').")
        return frozenset({mode})
    raise SpecdecError(f"unknown peers mode {mode!r}; use one of 'auto', 'off', 'fa4', 'flashinfer'.")


def can_serve(peer: str, T: int, sparse: bool) -> bool:
    """Whether ``peer`` computes this call kind at all (scores, dtype and device checked by the caller)."""
    if peer == "fa4":
        return not sparse
    if peer == "flashinfer":
        return not sparse or T == 1
    if peer == "sdpa":
        return T == 1 and not sparse
    return peer == "triton"


# --------------------------------------------------------------------------------------------------
# PyTorch SDPA (decode)
def sdpa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                scale: float) -> torch.Tensor:
    """One dense row per sequence through ``scaled_dot_product_attention``, q ``(B, H, 1, D)``.

    One host read sizes the KV slice ``[:max(lengths) + 1]`` (so not capture-safe); without a mask
    when every sequence has the same length (SDPA's fast path, the measured call), else with a
    boolean mask ``pos <= lengths[b]``. GQA through ``enable_gqa``.
    """
    B = q.shape[0]
    lo, hi = (int(x) for x in torch.stack(torch.aminmax(lengths)).tolist())
    n = hi + 1
    k, v = k_cache[:, :, :n], v_cache[:, :, :n]
    mask = None
    if lo != hi:
        mask = torch.arange(n, device=q.device).view(1, 1, 1, n) <= lengths.view(B, 1, 1, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def sdpa_decode_static(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """:func:`sdpa_decode` without the host read (capture-safe): the whole capacity with a boolean
    mask ``pos <= lengths[b]``, q ``(B, H, 1, D)``."""
    B, L = q.shape[0], k_cache.shape[2]
    mask = torch.arange(L, device=q.device).view(1, 1, 1, L) <= lengths.view(B, 1, 1, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, scale=scale,
                                                            enable_gqa=True)


# --------------------------------------------------------------------------------------------------
# FlashAttention-4
def fa4_dense(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
              scale: float) -> torch.Tensor:
    """Dense causal attention of the ``T`` new rows through ``flash_attn.cute.flash_attn_varlen_func``.

    q ``(B, H, T, D)`` goes in as a ``(B, T, H, D)`` copy (small), the caches ``(B, H_kv, L, D)`` as
    ``(B, L, H_kv, D)`` transposed views (FA4 needs only the last dimension contiguous); ``seqused_k = lengths + T``
    (int32) covers the new rows, already written; ``causal=True`` aligns the mask to the bottom
    right, so row ``t`` sees positions ``<= lengths + t``. GQA is native. Returns ``(B, H, T, D)``.
    """
    from flash_attn.cute import flash_attn_varlen_func

    T = q.shape[2]
    res = flash_attn_varlen_func(
        q.transpose(1, 2).contiguous(), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
        seqused_k=(lengths + T).to(torch.int32), softmax_scale=scale, causal=True,
    )
    out = res[0] if isinstance(res, tuple) else res
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# FlashInfer
class FlashInferRunner:
    """FlashInfer wrappers over our cache, planned per call (one host read of the lengths).

    Dense: HND layout, pages of ``page_size`` tokens that are strided views of the ``(B, H_kv, L, D)``
    cache (no copy; see :meth:`plan_dense`). Sparse (one row): the
    cache viewed as ``B · H_kv · L`` pages of one token and one KV head, each (sequence, KV head)
    a request of ``G`` query heads whose page list is its plan plus the dense tail.
    """

    def __init__(self, workspace_mb: int = 128, page_size: int = 16) -> None:
        self.workspace_mb = workspace_mb
        self.page_size = page_size
        self._ws: dict[str, torch.Tensor] = {}
        self._wrappers: dict[tuple, object] = {}

    def _wrapper(self, kind: str, dev: torch.device):
        import flashinfer

        key = (kind, str(dev))
        if key not in self._wrappers:
            if str(dev) not in self._ws:
                self._ws[str(dev)] = torch.zeros(self.workspace_mb << 20, dtype=torch.uint8, device=dev)
            ws = self._ws[str(dev)]
            if kind == "decode":
                self._wrappers[key] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
            else:
                self._wrappers[key] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
        return self._wrappers[key]

    def plan_dense(self, q: torch.Tensor, k_cache: torch.Tensor, lengths: torch.Tensor, scale: float):
        """Plan dense causal attention for q ``(B, H, T, D)`` over caches shaped like ``k_cache``;
        returns ``run(q, k_cache, v_cache) -> (B, H, T, D)`` (pure GPU work, reusable for every layer).

        Pages of ``P`` tokens (:func:`page_size_for`: ``page_size`` or the largest smaller divisor of
        ``L``) are strided views of our cache: page ``b·H_kv·(L/P) + j`` holds tokens ``j·P ..`` of
        sequence ``b`` (page stride ``P·D``, head stride ``L·D``), so FlashInfer can split a long
        sequence across CTAs. A non-contiguous cache, or no divisor of ``L`` down to
        :data:`MIN_PAGE`, falls back to one page of ``L`` tokens per sequence (no split inside it).
        """
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        dev = q.device
        i32 = dict(dtype=torch.int32, device=dev)
        P = page_size_for(k_cache, self.page_size)
        kv_indptr, kv_indices, last = page_table(lengths, T, Hkv, L, P)
        pages = page_views(B, Hkv, L, D, P)
        types = dict(q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale)
        if T == 1:
            w = self._wrapper("decode", dev)
            w.plan(kv_indptr, kv_indices, last, H, Hkv, D, P, **types)
            return lambda q, k, v: w.run(q.reshape(B, H, D), (pages(k), pages(v))).view(B, H, 1, D)
        w = self._wrapper("prefill", dev)
        qo_indptr = torch.arange(B + 1, **i32) * T
        w.plan(qo_indptr, kv_indptr, kv_indices, last, H, Hkv, D, P, causal=True, **types)
        # ragged (B·T, H, D) rows in, (B, H, T, D) out
        return lambda q, k, v: (w.run(q.transpose(1, 2).reshape(B * T, H, D), (pages(k), pages(v)))
                                .view(B, T, H, D).transpose(1, 2))

    def dense(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
              scale: float) -> torch.Tensor:
        """Dense causal attention, q ``(B, H, T, D)`` → ``(B, H, T, D)`` (plan, then run)."""
        return self.plan_dense(q, k_cache, lengths, scale)(q, k_cache, v_cache)

    def plan_sparse(self, q: torch.Tensor, k_cache: torch.Tensor, lengths: torch.Tensor, scale: float,
                    plan_indices: torch.Tensor, dense_from: torch.Tensor | None):
        """Plan one sparse row per sequence (a draft step); returns ``run(q, k_cache, v_cache)``
        (``(B, H, 1, D)`` → ``(B, H, 1, D)``; caches contiguous ``(B, H_kv, L, D)``)."""
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        G = H // Hkv
        assert T == 1, "FlashInfer's sparse path serves one row (a draft step)"
        indptr, indices = token_lists(plan_indices, dense_from, lengths, Hkv, L)
        n_req = B * Hkv
        w = self._wrapper("decode", q.device)
        w.plan(indptr, indices, torch.ones(n_req, dtype=torch.int32, device=q.device), G, 1, D, 1,
               q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale)

        def run(q, k, v):
            kc = k.view(B * Hkv * L, 1, 1, D)  # pages of one token, one KV head (a view of our cache)
            vc = v.view(B * Hkv * L, 1, 1, D)
            return w.run(q.reshape(n_req, G, D), (kc, vc)).view(B, H, 1, D)

        return run

    def sparse(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
               scale: float, plan_indices: torch.Tensor, dense_from: torch.Tensor | None) -> torch.Tensor:
        """One sparse row per sequence: q ``(B, H, 1, D)`` → ``(B, H, 1, D)`` (plan, then run)."""
        return self.plan_sparse(q, k_cache, lengths, scale, plan_indices, dense_from)(q, k_cache, v_cache)


#: smallest page a cache is cut into before it falls back to one page of ``L`` tokens per sequence
MIN_PAGE = 4


def page_size_for(k_cache: torch.Tensor, page_size: int) -> int:
    """Pages as strided views of a contiguous cache: the largest divisor of the capacity ``L`` from
    ``page_size`` down to :data:`MIN_PAGE` (the engine's capacity is rarely a multiple of 16: 8070 →
    15), else one page of ``L`` tokens per sequence (no split of a sequence inside FlashInfer)."""
    L = k_cache.shape[2]
    if not k_cache.is_contiguous():
        return L
    for P in range(min(page_size, L), MIN_PAGE - 1, -1):
        if L % P == 0:
            return P
    return L


def page_table(lengths: torch.Tensor, T: int, Hkv: int, L: int, P: int):
    """FlashInfer's ``(kv_indptr (B+1,), kv_indices, last_page_len (B,))`` int32, on ``lengths``' device,
    for ``T`` new rows per sequence (already written) over pages of :func:`page_views`: sequence ``b``
    sees its pages ``b · H_kv · (L/P) + j`` (``b`` when ``P == L``) for ``j < ⌈(lengths[b] + T) / P⌉``."""
    B = lengths.shape[0]
    dev = lengths.device
    nb = L // P
    n = lengths.long() + T  # visible tokens per sequence (the new rows are already written)
    counts = (n + P - 1) // P
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    kv_indptr[1:] = counts.cumsum(0).to(torch.int32)
    j = torch.arange(nb, device=dev).view(1, nb)
    stride_b = Hkv * nb if P < L else 1
    kv_indices = (torch.arange(B, device=dev).view(B, 1) * stride_b + j)[j < counts.view(B, 1)].to(torch.int32)
    last = (n - (counts - 1) * P).to(torch.int32)
    return kv_indptr, kv_indices, last


def page_views(B: int, Hkv: int, L: int, D: int, P: int):
    """``pages(cache)``: a ``(B, H_kv, L, D)`` cache as FlashInfer's HND pages ``(n, H_kv, P, D)`` (a
    view: page ``b·H_kv·(L/P) + j`` holds tokens ``j·P ..`` of sequence ``b``; page stride ``P·D``, head
    stride ``L·D``)."""
    nb = L // P
    stride_b = Hkv * nb if P < L else 1
    n_pages = (B - 1) * stride_b + nb

    def pages(c):
        if P == L:
            return c  # (B, H_kv, L, D) is already (num_pages, H_kv, page_size, D)
        return c.as_strided((n_pages, Hkv, P, D), (P * D, L * D, D, 1))

    return pages


class FlashInferGraphRunner:
    """FlashInfer's dense decode / verify under CUDA-graph capture.

    One wrapper per call shape ``(B, T, H, H_kv, D, L, page size, dtypes, scale, device)``, created in
    CUDA-graph mode (``use_cuda_graph=True``) with its own workspace and fixed ``indptr`` /
    ``indices`` / ``last_page_len`` (and, for verify, ``qo_indptr``) buffers sized for the capacity
    ``L``. :meth:`run` only launches the kernel (capturable); :meth:`plan` is host work on host
    lengths and must run outside capture: at the first call of a shape (the capture's first
    warm-up, where a host read is allowed) and, through :meth:`replan`, before every replay of a
    captured forward — the captured kernels read the buffers and the workspace the plan rewrote.
    """

    def __init__(self, workspace_mb: int = 128, page_size: int = 16) -> None:
        self.workspace_mb = workspace_mb
        self.page_size = page_size
        self._plans: dict[tuple, dict] = {}
        self.plans_made = 0  # plan() calls (tests, benchmarks)

    def key(self, q: torch.Tensor, k_cache: torch.Tensor, scale: float) -> tuple:
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        return (B, T, H, Hkv, D, L, page_size_for(k_cache, self.page_size), str(q.dtype), str(k_cache.dtype),
                float(scale), str(q.device))

    def _entry(self, key: tuple) -> dict:
        import flashinfer

        e = self._plans.get(key)
        if e is not None:
            return e
        B, T, H, Hkv, D, L, P, _, _, _, dev = key
        dev = torch.device(dev)
        i32 = dict(dtype=torch.int32, device=dev)
        ws = torch.zeros(self.workspace_mb << 20, dtype=torch.uint8, device=dev)
        nb = L // P
        bufs = dict(indptr=torch.zeros(B + 1, **i32), indices=torch.zeros(B * nb, **i32),
                    last=torch.ones(B, **i32))
        if T == 1:
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws, "HND", use_cuda_graph=True, paged_kv_indptr_buffer=bufs["indptr"],
                paged_kv_indices_buffer=bufs["indices"], paged_kv_last_page_len_buffer=bufs["last"])
        else:
            bufs["qo_indptr"] = torch.arange(B + 1, **i32) * T
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                ws, "HND", use_cuda_graph=True, qo_indptr_buf=bufs["qo_indptr"], paged_kv_indptr_buf=bufs["indptr"],
                paged_kv_indices_buf=bufs["indices"], paged_kv_last_page_len_buf=bufs["last"])
        e = self._plans[key] = dict(wrapper=w, bufs=bufs, ws=ws, pages=page_views(B, Hkv, L, D, P), planned=False)
        return e

    def planned(self, key: tuple) -> bool:
        e = self._plans.get(key)
        return e is not None and e["planned"]

    def plan(self, key: tuple, lengths_host: torch.Tensor) -> None:
        """Plan ``key``'s wrapper for these lengths (a CPU tensor: no host read here)."""
        B, T, H, Hkv, D, L, P, qdt, kdt, scale, _ = key
        assert lengths_host.device.type == "cpu" and lengths_host.shape == (B,)
        e = self._entry(key)
        indptr, indices, last = page_table(lengths_host, T, Hkv, L, P)
        types = dict(q_data_type=getattr(torch, qdt.split(".")[-1]), kv_data_type=getattr(torch, kdt.split(".")[-1]),
                     sm_scale=scale)
        w = e["wrapper"]
        if T == 1:
            w.plan(indptr, indices, last, H, Hkv, D, P, **types)
        else:
            qo_indptr = torch.arange(B + 1, dtype=torch.int32) * T
            w.plan(qo_indptr, indptr, indices, last, H, Hkv, D, P, causal=True, **types)
        e["planned"] = True
        self.plans_made += 1

    def run(self, key: tuple, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The planned call: q ``(B, H, T, D)`` → ``(B, H, T, D)`` (launches only; capturable)."""
        B, T, H, Hkv, D = key[:5]
        e = self._plans[key]
        w, pages = e["wrapper"], e["pages"]
        if T == 1:
            return w.run(q.reshape(B, H, D), (pages(k_cache), pages(v_cache))).view(B, H, 1, D)
        return (w.run(q.transpose(1, 2).reshape(B * T, H, D), (pages(k_cache), pages(v_cache)))
                .view(B, T, H, D).transpose(1, 2))

    def replan(self, keys, lengths: torch.Tensor) -> int:
        """Before replaying a captured forward that ran the shapes ``keys``: re-plan them for
        ``lengths`` (one host read, only when ``keys`` is not empty). Returns how many plans were made."""
        keys = [k for k in keys if k in self._plans]
        if not keys:
            return 0
        host = lengths.detach().to("cpu", torch.long)
        for k in keys:
            self.plan(k, host)
        return len(keys)


def token_lists(plan_indices: torch.Tensor, dense_from: torch.Tensor | None, lengths: torch.Tensor,
                Hkv: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Page lists (page size 1) of one sparse row per (sequence, KV head), for FlashInfer.

    Request ``r = b·H_kv + h`` sees the plan's positions ``p`` with ``0 <= p < dense_from[b]`` and
    ``p <= lengths[b]`` (the row's causal limit), then the dense tail ``dense_from[b] .. lengths[b]``
    — :func:`specdec.attention.reference.visibility_mask` for ``T = 1`` without counting a position
    twice. Page id = ``r · L + p``. Returns ``(indptr (B·H_kv + 1,), indices)`` int32 (one host read
    sizes the tail).
    """
    B = lengths.shape[0]
    dev = lengths.device
    idx = plan_indices.expand(B, Hkv, plan_indices.shape[-1]).long()
    limit = lengths.view(B, 1, 1) + 1 if dense_from is None else torch.minimum(
        dense_from.view(B, 1, 1), lengths.view(B, 1, 1) + 1)
    keep = (idx >= 0) & (idx < limit)
    if dense_from is None:
        tail_lo = lengths + 1
    else:
        tail_lo = dense_from.clamp(min=0)
    tail_n = (lengths + 1 - tail_lo).clamp(min=0)  # (B,)
    width = int(tail_n.max()) if B else 0
    tail = tail_lo.view(B, 1, 1) + torch.arange(width, device=dev).view(1, 1, width)
    tail = tail.expand(B, Hkv, width)
    tail_keep = torch.arange(width, device=dev).view(1, 1, width) < tail_n.view(B, 1, 1)
    pos = torch.cat([idx, tail], dim=2)
    ok = torch.cat([keep, tail_keep.expand(B, Hkv, width)], dim=2)
    req = torch.arange(B * Hkv, device=dev).view(B, Hkv, 1)
    pages = (req * L + pos)[ok]  # row-major: per request, plan first then tail
    counts = ok.sum(dim=2).view(-1)
    indptr = torch.zeros(B * Hkv + 1, dtype=torch.int32, device=dev)
    indptr[1:] = counts.cumsum(0).to(torch.int32)
    return indptr, pages.to(torch.int32)
