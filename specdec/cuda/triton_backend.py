"""``TritonBackend``: the GPU attention backend (split-K verify/decode, sparse, fused scores).

Select it with ``--backend triton`` or ``BACKENDS.build("triton")``. It runs on CUDA GPUs, and on
the CPU only under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported),
which is how the parity tests exercise it in CI.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from typing import Literal, Sequence

import torch
from pydantic import Field, field_validator

from specdec.cuda import peers
from specdec.errors import SpecdecError
from specdec.interfaces import AttentionBackend, AttentionMetadata
from specdec.registry import BACKENDS, ComponentConfig

try:  # triton is an optional extra
    from specdec.cuda.triton_attention import LaunchConfig, reduce_scores, splitk_attention

    _TRITON_ERROR: str | None = None
except ImportError as exc:  # pragma: no cover - depends on the environment
    LaunchConfig = None  # type: ignore[assignment,misc]
    splitk_attention = None  # type: ignore[assignment]
    reduce_scores = None  # type: ignore[assignment]
    _TRITON_ERROR = str(exc)


#: verify-sized forwards with more rows than one tile packs (``T * G > max_packed_rows``) and at most this many rows
#: run the split-K kernel in row chunks on the GPU, also dense without scores; longer ones (prefill chunks) use
#: PyTorch SDPA with a mask. Measured on the H200 (benchmarks/gpu/many_rows.py, 2026-12-02).
MANY_ROWS_SPLITK_MAX_T = 64


class TritonConfig(ComponentConfig):
    """Launch tunables of the Triton backend.

    Attributes:
        block_n: KV positions per tile (``None``: the row of ``triton_attention.LAUNCH_TABLE`` for
            the call: sparse or dense, head dim).
        num_warps / num_stages: Triton launch options of the split-K kernel (``None``: table).
        num_splits: fixed chunks per (sequence, KV head); ``None`` picks enough to fill the GPU.
        ctas_per_sm: programs per SM the automatic split count aims for (``None``: default).
        sdpa_decode: use ``torch.nn.functional.scaled_dot_product_attention`` for a dense single
            row without scores (costs one host synchronisation to size the KV slice; off by
            default: see docs/backends.md for the measurement).
        max_packed_rows: most ``T * G`` rows packed in one tile; longer forwards (prefill chunks)
            go through SDPA (dense, no scores, GPU) or through the kernel in chunks of rows.
        dense_single_split_at: dense attention runs in one split (no combine launch) once the
            (sequence, KV head) programs reach this many per SM; ``"auto"``: 1.0 at head dim <= 64
            (measured faster on an H200), never at head dim 128; ``None``: always split.
        sparse_single_split_at: sparse plans run in one split (no combine launch) once the
            (sequence, KV head) programs reach this many per SM; ``None``: always split.
        v_early: gather a tile's V rows right after its K rows (``True``) or after its softmax
            (``False``); ``None``: table (on for sparse plans, off for dense).
        min_tiles: at least this many tiles per split when the split count is automatic
            (``None``: table).
        fused_combine: with more than one split, the last program of each (sequence, KV head)
            merges the splits (one atomic counter per pair) instead of a second launch. ``None`` (the
            default): the launch table decides -- on for sparse plans at head dim <= 128 over caches of
            32k positions or more with more than 8 (sequence, KV head) pairs (with 2 programs per SM:
            the Llama-3.1-8B sparse step at B 16 x 32k took 6.05 vs 6.24 ms on an H200, 2026-12-01),
            off elsewhere (at the SmolLM2 shape it measured no faster); ``True`` / ``False`` force it.
        flash_attn: dense attention without scores on CUDA in fp16/bf16 through flash-attn's
            ``flash_attn_with_kvcache``: ``"auto"`` when flash-attn is installed (else our kernel,
            silently), ``"on"`` requires it (building the backend fails without it), ``"off"``
            never. Sparse plans and score requests always use our kernels. Untested against the
            real library (it cannot be installed on the machines here): see docs/backends.md.
        fused_softmax_scores: softmax scores summed over the rows (Vegas' request) of a dense call
            that runs in one split are normalised by the attention kernel itself, once it knows each
            row's log-sum-exp, instead of by a second kernel over the raw logits. Off by default:
            on the H200 it was slower (190 vs 134 us at SmolLM2 B=64 x 8k, 2026-12-01).
        score_reduce: how the fused kernel reduces logits scores summed over rows: ``"colsum"`` (the
            default: a row-weighted column sum of the logit tile the kernel computes anyway; on the H200
            +2..11 % over the verify without scores vs +5..24 % for ``"mma"``, 2026-12-01) or ``"mma"``
            (suffix sums of the weighted queries, one extra 16-row MMA per tile and an in-warp pick).
            ``sink_softmax`` scores always use the column sum.
        score_dtype: dtype of the fused score buffers (logits and ``sink_softmax``: ``"bfloat16"``
            halves their writes; the selector sums them in float32) and of the raw logits that exact
            softmax scores are rebuilt from (the reduce kernel still returns float32).
        sink_anchors: where the per-row normaliser of ``sink_softmax`` scores (the log-sum-exp over the
            anchor positions) is computed: ``"tile"`` (each split program, from one extra K tile before
            its loop), ``"pre"`` (a small kernel, once per (sequence, KV head), before the split kernel;
            with one split the kernel computes it itself) or ``"loop"`` (each split program, in its loop's
            first iteration, once its first K/V tiles are in flight). The same scores. ``None`` (the
            default): the launch table's pick for the call (``triton_attention.SCORE_PATHS``): ``"tile"``
            everywhere (``"pre"`` won at B 1 x 128k in one H200 run and lost by ~1.5 % in the next two).
        score_store: how the fused column-sum scores (logits and ``sink_softmax``) of a tile are stored:
            ``"shared"`` (``tl.store``, which moves the vector through shared memory first) or ``"direct"``
            (inline PTX stores from the registers the row reduction leaves them in, no shared memory, two
            barriers fewer per tile in the sm_90 SASS; CUDA only, the CPU interpreter runs the plain
            store). The same scores. ``"lean"`` (opt-in): ``"direct"`` with ``sink_softmax``'s per-row factor
            folded (``log2 w`` and ``ref log2 e`` computed before the loop) and a dense call's store mask one
            compare shorter: fewer instructions per tile, the same scores up to rounding (row weights must be
            >= 0, as the backend's are); on the H200 (2026-12-01 23:12 UTC) level with ``"direct"`` at 8B
            B 1 x 128k and slower than the table's pick elsewhere. ``None`` (the default): the launch table's
            pick, ``"direct"`` for dense head dim 128 ``sink_softmax`` calls of at most 8 (sequence, KV head)
            pairs over >= 64k positions (``SINK_FEW_LONG``, e.g. an 8B model at B 1 x 128k), ``"shared"``
            everywhere else.
        fast_loop: the split kernel's tile loop keeps its running max in log2 units (a tile's softmax weights
            are one FFMA and an exp2 per element) and, for dense calls whose splits span at least
            ``triton_attention.FAST_LOOP_MIN_TILES`` tiles, runs the tiles every row sees whole, without masks,
            before the masked rest (the causal diagonal, a split's ragged end): 40-45 % fewer instructions per tile
            in the sm_90 SASS (``benchmarks/sass_mix.py``). ``None`` (the default):
            ``triton_attention.FAST_LOOP`` (``True``); ``False`` runs the single masked loop of before 2026-12-02
            (the same results up to rounding; kept for side-by-side timing).
        row_block: packed rows per program of a call without scores: a call of more packed rows (``T G``, e.g. a
            draft tree's 21 rows x 3 heads) runs in row blocks of this many (a power of two >= 16), each reading the
            split's K/V tiles again (mostly from L2), instead of one tile of ``next_power_of_2(T G)`` rows.
            ``None`` (the default): ``triton_attention.ROW_BLOCK`` (0: one tile; on an H200 row blocks of 16 or 32
            were slower than one tile for the default tree at B 1, 16 and 64).
        tree_bits: a draft tree's mask reaches the kernel as one 64-bit word per row, tested in registers, instead
            of a ``(T, T)`` byte mask gathered in the tiles that reach the new rows (a tree of more than 64 rows
            always takes the byte mask). ``None`` (the default): ``triton_attention.TREE_BITS`` (``True``: on an
            H200 the default tree's verify call at 8k, B 16, took 50 us with it, 128 us without, as a 21-row chain).
        peers: FlashAttention-4 / FlashInfer for the calls they serve (:mod:`specdec.cuda.peers`):
            ``"auto"`` the installed ones (and PyTorch SDPA for decode) where the measured table
            ``peers.PICKS`` says they are the fastest (ours elsewhere), ``"off"`` never,
            ``"fa4"`` / ``"flashinfer"`` that peer for every call it can serve (benchmarks, parity
            tests; building the backend fails when it is not installed). Never for score requests,
            fp32 or the CPU. Under CUDA-graph capture only the capturable kernels are candidates
            (``peers.GRAPH_PICKS`` for ``"auto"``; FA4 and FlashInfer's dense calls, SDPA's masked
            form: :func:`specdec.cuda.peers.capturable`); FlashInfer is then re-planned before every
            replay (one host read of the lengths per replayed forward that uses it).
    """

    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None
    ctas_per_sm: int | None = None
    sdpa_decode: bool = False
    max_packed_rows: int = 64
    sparse_single_split_at: float | None = 1.0
    v_early: bool | None = None
    min_tiles: int | None = Field(default=None, ge=1)
    fused_combine: bool | None = None
    dense_single_split_at: float | Literal["auto"] | None = "auto"
    flash_attn: Literal["auto", "off", "on"] = "auto"
    fused_softmax_scores: bool = False
    peers: Literal["auto", "off", "fa4", "flashinfer"] = "auto"
    score_reduce: Literal["mma", "colsum"] = "colsum"
    score_dtype: Literal["float32", "bfloat16"] = "float32"
    sink_anchors: Literal["tile", "pre", "loop"] | None = None
    score_store: Literal["shared", "direct", "lean"] | None = None
    fast_loop: bool | None = None
    row_block: int | None = Field(default=None, ge=0)
    tree_bits: bool | None = None

    @field_validator("row_block")
    @classmethod
    def _row_block_power_of_two(cls, v: int | None) -> int | None:
        if v and (v < 16 or v & (v - 1)):
            raise ValueError(f"row_block must be 0 (one tile) or a power of two >= 16 (16, 32, 64), not {v}")
        return v


def _to_device(t: torch.Tensor, dev) -> tuple[torch.Tensor, ...]:
    """Copy a small host-built tensor to ``dev``, also while a CUDA graph is being captured.

    Returns ``(device tensor, pinned source)``; keep both alive (the graph replays the copy).
    """
    dev = torch.device(dev)
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        pinned = t.pin_memory()
        out = torch.empty(t.shape, dtype=t.dtype, device=dev)
        out.copy_(pinned, non_blocking=True)
        return out, pinned
    return t.to(dev), t


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _flash_attn_installed() -> bool:
    """Whether flash-attn 2 can be imported (looked up, not imported: importing it loads CUDA code).

    A ``flash_attn`` package holding only FlashAttention-4's ``cute`` is not flash-attn 2."""
    return peers.fa2_installed()


def _resolve_flash_attn(mode: str) -> bool:
    """Whether a backend with ``flash_attn=mode`` sends eligible dense calls to flash-attn."""
    if mode == "off":
        return False
    if _flash_attn_installed():
        return True
    if mode == "on":
        raise SpecdecError("flash_attn='on' needs flash-attn 2 (flash_attn_with_kvcache), which is not installed; "
                           "pip install 'flash-attn>=2.6' (or use flash_attn='auto' or 'off'; FlashAttention-4 "
                           "is peers='fa4').")
    return False


def _flash_dense(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """Dense causal attention of the ``T`` new rows through ``flash_attn.flash_attn_with_kvcache``.

    flash-attn wants q ``(B, T, H, D)`` and a cache ``(B, L, H_kv, D)`` with a contiguous last
    dimension (other strides are free), so the ``(B, H, ., D)`` tensors go in as transposed views.
    The new rows' K/V are already in the cache (written before ``attend``), so ``k``/``v`` are not
    passed and ``cache_seqlens = lengths + T`` (int32) covers them; ``causal=True`` aligns the mask to
    the bottom right: row ``t`` sees positions ``<= cache_seqlens - T + t = lengths + t``. GQA is
    native (query head ``h`` reads KV head ``h // G``). Returns ``(B, H, T, D)`` (a transposed view).
    """
    from flash_attn import flash_attn_with_kvcache

    T = q.shape[2]
    out = flash_attn_with_kvcache(
        q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
        cache_seqlens=(lengths + T).to(torch.int32), causal=True, softmax_scale=scale,
    )
    return out.transpose(1, 2)


@BACKENDS.register("triton", TritonConfig)
class TritonBackend(AttentionBackend):
    """Split-K (flash-decoding) attention with GQA row packing, sparse index lists and fused scores."""

    name = "triton"
    Config = TritonConfig
    #: sliding-window rings and soft-capping are delegated to the torch backend (static, i.e. capture-safe,
    #: when this backend is): a local layer reads only its window, so SDPA over the ring is cheap
    supports_window = True
    supports_softcap = True
    #: draft-tree rows (``meta.tree``) through the split-K kernel with the tree mask where they fit one packed tile
    #: and ask no scores; otherwise through the torch backend (SDPA with the mask; scores: the reference)
    supports_tree = True

    def __init__(self, config: TritonConfig | None = None) -> None:
        self.config = config or TritonConfig()
        c = self.config
        self._launch = (
            LaunchConfig(block_n=c.block_n, num_warps=c.num_warps, num_stages=c.num_stages,
                         num_splits=c.num_splits, ctas_per_sm=c.ctas_per_sm,
                         sparse_single_split_at=c.sparse_single_split_at,
                         dense_single_split_at=c.dense_single_split_at, v_early=c.v_early,
                         min_tiles=c.min_tiles, fused_combine=c.fused_combine,
                         sink_anchors=c.sink_anchors, score_store=c.score_store, fast_loop=c.fast_loop,
                         row_block=c.row_block, tree_bits=c.tree_bits)
            if LaunchConfig is not None
            else None
        )
        self._row_cache: dict[tuple, tuple] = {}
        self._flash = _resolve_flash_attn(c.flash_attn)  # resolved once, when the backend is built
        self._peers = peers.resolve(c.peers)
        self._imported: set[str] = set()  # peers whose module imported (checked at their first pick)
        self._peer_table: dict | None = None  # None: peers.PICKS (tests and benchmarks pass their own)
        self._graph_table: dict | None = None  # None: peers.GRAPH_PICKS (calls under capture)
        self._flashinfer: peers.FlashInferRunner | None = None
        self._fi_graph: peers.FlashInferGraphRunner | None = None
        self._touched: set | None = None  # FlashInfer graph shapes run since capture_begin()
        #: ``(kernel, call kind, static)`` → Python-level calls (a captured call counts once, at its capture)
        self.peer_calls: Counter = Counter()
        #: ``(eager pick, call kind, kernel run instead)`` → calls under capture whose eager pick cannot be
        #: captured (e.g. FlashInfer's sparse row, the unmasked SDPA decode): what the graph path gave up
        self.graph_fallbacks: Counter = Counter()
        # decode- and verify-sized forwards launch one or two kernels sized by tensor shapes only: no
        # host synchronisation, so they can be captured in a CUDA graph (not with ``sdpa_decode``,
        # which syncs; prefill-sized forwards sync too and are never captured)
        self.capture_safe = not c.sdpa_decode

    def uses_flash_attn(self, q: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Whether this call goes to flash-attn: dense, no scores, CUDA, fp16/bf16, flash-attn in use."""
        return (
            self._flash and not meta.sparse and not meta.wants_scores
            and q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16)
        )

    def peer_for(self, q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> str:
        """The kernel this call runs on: ``"triton"`` (ours), ``"fa4"``, ``"flashinfer"`` or ``"sdpa"``.

        A peer needs: no scores, CUDA, fp16/bf16, a call kind it serves, and (``"auto"``) the measured
        table naming it for this kind, head dim and ``B · L``. A static call (under CUDA-graph
        capture) reads :data:`peers.GRAPH_PICKS` instead and takes only a kernel that can be captured
        (:func:`peers.capturable`)."""
        if not self._peers or meta.wants_scores:
            return "triton"
        if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
            return "triton"
        B, _, T, D = q.shape
        if meta.sparse and not k_cache.is_contiguous():
            return "triton"
        kind = "sparse" if meta.sparse else ("decode" if T == 1 else "verify")
        if self.config.peers == "auto":
            table = self._graph_table if meta.static else self._peer_table
            want = peers.pick(kind, D, B * k_cache.shape[2], table, graph=meta.static)
            if meta.static:  # say where the eager pick cannot be captured (SDPA's eager form slices on the host)
                eager = peers.pick(kind, D, B * k_cache.shape[2], self._peer_table)
                lost = eager == "sdpa" or not peers.capturable(eager, T, meta.sparse)
                if eager != want and eager in self._peers and lost:
                    self.graph_fallbacks[(eager, kind, want)] += 1
        else:
            want = self.config.peers
        if want in self._peers and peers.can_serve(want, T, meta.sparse) and self._imports(want):
            if not meta.static or peers.capturable(want, T, meta.sparse):
                return want
            self.graph_fallbacks[(want, kind, "triton")] += 1
        return "triton"

    def _imports(self, peer: str) -> bool:
        """Whether ``peer`` imports, tried at its first pick (an eager call: graph capture warms up first).

        ``peers="auto"``: a peer that is found but fails to import is dropped with one warning, and our
        kernel runs; a forced peer (``peers="fa4"``) raises."""
        if peer not in peers.MODULES or peer in self._imported:
            return True
        err = peers.import_error(peer)
        if err is None:
            self._imported.add(peer)
            return True
        fix = f"repair the install ({peers.HOW_TO_INSTALL[peer]})"
        if self.config.peers != "auto":
            raise SpecdecError(f"peers={peer!r}: {peer} is installed but does not import ({err}); {fix} "
                               "or use peers='auto' or 'off'.")
        warnings.warn(f"peers='auto': {peer} is installed but does not import ({err}); our Triton kernel "
                      f"runs instead. To use it, {fix}; to silence this, pass peers='off'.", RuntimeWarning,
                      stacklevel=3)
        self._peers = self._peers - {peer}
        return False

    def _run_peer(self, peer: str, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        if peer == "sdpa":
            if meta.static:
                return peers.sdpa_decode_static(q, k_cache, v_cache, meta.lengths, meta.scale)
            return peers.sdpa_decode(q, k_cache, v_cache, meta.lengths, meta.scale)
        if peer == "fa4":
            return peers.fa4_dense(q, k_cache, v_cache, meta.lengths, meta.scale)
        if meta.static:  # FlashInfer's dense call in CUDA-graph mode (peer_for keeps sparse calls ours)
            if self._fi_graph is None:
                self._fi_graph = peers.FlashInferGraphRunner()
            key = self._fi_graph.key(q, k_cache, meta.scale)
            first = self._touched is not None and key not in self._touched
            if first or not self._fi_graph.planned(key):
                # the first call of this shape in this capture: its first warm-up (a host read is
                # allowed there), planned for these lengths even when another graph planned the shape
                # (the replay right after the capture must see them); replays re-plan in before_replay
                if q.is_cuda and torch.cuda.is_current_stream_capturing():
                    raise SpecdecError("FlashInfer was first called under CUDA-graph capture without a plan; "
                                       "capture through GraphCache (it warms the forward up first).")
                self._fi_graph.plan(key, meta.lengths.detach().to("cpu", torch.long))
            if self._touched is not None:
                self._touched.add(key)
            return self._fi_graph.run(key, q, k_cache, v_cache)
        if self._flashinfer is None:
            self._flashinfer = peers.FlashInferRunner()
        if meta.sparse:
            return self._flashinfer.sparse(q, k_cache, v_cache, meta.lengths, meta.scale, meta.plan_indices,
                                           meta.dense_from)
        return self._flashinfer.dense(q, k_cache, v_cache, meta.lengths, meta.scale)

    # -- CUDA-graph protocol (specdec.graphs.GraphCache): peers whose plan is host work --
    def capture_begin(self) -> None:
        """A forward is about to be warmed up and captured: start recording the planned peer shapes it runs."""
        self._touched = set()

    def capture_end(self):
        """The captured forward's planned peer shapes (``None``: none), for :meth:`before_replay`."""
        keys, self._touched = self._touched, None
        return tuple(sorted(keys, key=repr)) if keys else None

    def before_replay(self, token, lengths: torch.Tensor) -> None:
        """Re-plan what a captured forward runs (``token`` from :meth:`capture_end`) for ``lengths``:
        FlashInfer's CUDA-graph wrappers (one host read of the lengths)."""
        if token and self._fi_graph is not None:
            self._fi_graph.replan(token, lengths)

    def validate(self, device: torch.device, dtype: torch.dtype) -> str | None:
        if _TRITON_ERROR is not None:
            return f"the triton backend needs the 'triton' package ({_TRITON_ERROR}); pip install 'specdec[triton]'."
        if torch.device(device).type != "cuda" and not _interpreting():
            return "the triton backend runs on a CUDA GPU (or on the CPU with TRITON_INTERPRET=1, slowly)."
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"the triton backend supports float32, bfloat16 and float16, not {dtype}."
        return None

    # -- score bookkeeping (cached per shape/request so graph replays reuse the same tensors) --
    def _row_weights(self, H: int, T: int, rows: Sequence[int], heads: Sequence[int] | None, dev) -> torch.Tensor:
        key = ("w", H, T, tuple(rows), None if heads is None else tuple(heads), str(dev))
        if key not in self._row_cache:
            w = torch.zeros(H, T, dtype=torch.float32)
            for r in rows:
                w[:, int(r)] += 1.0
            if heads is not None:
                keep = torch.zeros(H, dtype=torch.bool)
                keep[list(heads)] = True
                w[~keep] = 0.0
            self._row_cache[key] = _to_device(w, dev)
        return self._row_cache[key][0]

    def _row_queries(self, H: int, Hkv: int, T: int, rows: Sequence[int], heads: Sequence[int] | None, dev):
        """``(H_kv, 16, G*T)`` weights turning the packed rows into per-request rows, ``(16,)`` row ids."""
        key = ("q", H, Hkv, T, tuple(rows), None if heads is None else tuple(heads), str(dev))
        if key not in self._row_cache:
            G = H // Hkv
            keep = set(range(H)) if heads is None else {int(h) for h in heads}
            rq = torch.zeros(Hkv, 16, G * T, dtype=torch.float32)
            rid = torch.full((16,), -1, dtype=torch.int32)
            for r_i, r in enumerate(rows):
                rid[r_i] = int(r)
                for h in keep:
                    rq[h // G, r_i, (h % G) * T + int(r)] = 1.0
            self._row_cache[key] = (_to_device(rq, dev), _to_device(rid, dev))
        (rq_d, _), (rid_d, _) = self._row_cache[key]
        return rq_d, rid_d

    def _row_slots(self, H: int, Hkv: int, T: int, rows: Sequence[int], heads: Sequence[int] | None, dev):
        """Slots for raw per-(head, row) logits and the ``(H_kv, n_slots, R)`` map back to rows.

        Returns ``(slots (H, T) int32, n_slots, to_rows (H_kv, n, R) fp32, flat (H_kv, n) long,
        to_one (H_kv, n, 1) fp32)`` where ``flat`` indexes the slot's (head, row) in ``lse.view(B, H * T)``
        and ``to_one`` sums the rows (the output when the rows are not kept apart).
        """
        key = ("s", H, Hkv, T, tuple(rows), None if heads is None else tuple(heads), str(dev))
        if key not in self._row_cache:
            G = H // Hkv
            keep = set(range(H)) if heads is None else {int(h) for h in heads}
            uniq = sorted({int(r) for r in rows})
            slots = torch.full((H, T), -1, dtype=torch.int32)
            per_kv: list[list[tuple[int, int]]] = [[] for _ in range(Hkv)]
            for h in sorted(keep):
                for t in uniq:
                    per_kv[h // G].append((h, t))
            n = max((len(x) for x in per_kv), default=0)
            to_rows = torch.zeros(Hkv, max(n, 1), len(rows), dtype=torch.float32)
            flat = torch.zeros(Hkv, max(n, 1), dtype=torch.long)
            for kv, items in enumerate(per_kv):
                for i, (h, t) in enumerate(items):
                    slots[h, t] = i
                    flat[kv, i] = h * T + t
                    for r_i, r in enumerate(rows):
                        if int(r) == t:
                            to_rows[kv, i, r_i] = 1.0
            # the rows summed (one output row): the reduction writes (B, H_kv, L) at once, no per-row
            # buffer and no separate sum over the rows
            to_one = to_rows[:, :max(n, 1)].sum(-1, keepdim=True).contiguous()
            self._row_cache[key] = (_to_device(slots, dev), n, _to_device(to_rows[:, :max(n, 1)].contiguous(), dev),
                                    _to_device(flat[:, :max(n, 1)].contiguous(), dev), _to_device(to_one, dev))
        (slots_d, _), n, (to_rows_d, _), (flat_d, _), (to_one_d, _) = self._row_cache[key]
        return slots_d, n, to_rows_d, flat_d, to_one_d

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        if splitk_attention is None:  # pragma: no cover
            raise RuntimeError(self.validate(q.device, q.dtype))
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        dev = q.device
        rows, kind, heads, per_row = meta.score_rows, meta.score_kind, meta.score_heads, meta.score_per_row
        if meta.window is not None or meta.softcap is not None:
            return self._window_delegate().attend(q, k_cache, v_cache, meta)
        if meta.tree is not None:  # no peer, FlashAttention or chunked path knows the tree mask
            if rows is None and T * (H // Hkv) <= self.config.max_packed_rows:
                out, _, _, _ = splitk_attention(q, k_cache, v_cache, meta, cfg=self._launch, tree=meta.tree)
                return out, None
            return self._window_delegate().attend(q, k_cache, v_cache, meta)

        peer = self.peer_for(q, k_cache, meta)
        self.peer_calls[(peer, "sparse" if meta.sparse else ("decode" if T == 1 else "verify"), bool(meta.static))] += 1
        if peer != "triton":
            return self._run_peer(peer, q, k_cache, v_cache, meta), None
        if self.uses_flash_attn(q, meta):
            return _flash_dense(q, k_cache, v_cache, meta.lengths, meta.scale), None
        if self.config.sdpa_decode and T == 1 and not meta.sparse and rows is None and dev.type == "cuda":
            return self._sdpa_decode(q, k_cache, v_cache, meta.lengths, meta.scale), None

        if T * (H // Hkv) > self.config.max_packed_rows:
            return self._many_rows(q, k_cache, v_cache, meta)
        if rows is None:
            few = meta.live_order is not None and not meta.sparse  # a valve's re-run: programs for the live only
            out, _, _, _ = splitk_attention(q, k_cache, v_cache, meta, cfg=self._launch,
                                            live_order=meta.live_order if few else None,
                                            live_count=meta.live_count if few else None,
                                            live_bound=(meta.live_bound or None) if few else None)
            return out, None
        if kind not in ("logits", "softmax", "sink_softmax"):
            raise ValueError(f"unknown score kind {kind!r}; use 'logits', 'softmax' or 'sink_softmax'.")
        if kind == "sink_softmax" and per_row:
            raise ValueError("sink_softmax scores are summed over the rows; per-row scores (per_row=True) "
                             "need kind 'logits' or 'softmax'.")
        R = len(rows)
        if R == 0 or (heads is not None and len(heads) == 0):
            out, _, _, _ = splitk_attention(q, k_cache, v_cache, meta, cfg=self._launch)
            shape = (B, Hkv, R, L) if per_row else (B, Hkv, L)
            return out, torch.zeros(shape, dtype=torch.float32, device=dev)
        sdt = torch.bfloat16 if self.config.score_dtype == "bfloat16" else torch.float32
        if kind in ("logits", "sink_softmax") and not per_row:  # fused: reduced in registers, one pass
            w = self._row_weights(H, T, rows, heads, dev)
            out, _, scores, _ = splitk_attention(q, k_cache, v_cache, meta, row_weights=w, cfg=self._launch,
                                                 colsum=self.config.score_reduce == "colsum",
                                                 sink_softmax=kind == "sink_softmax", score_dtype=sdt)
            return out, scores
        if kind == "logits" and R <= 16:  # per-row logits, in the kernel
            rq, rid = self._row_queries(H, Hkv, T, rows, heads, dev)
            out, _, scores, _ = splitk_attention(q, k_cache, v_cache, meta, row_queries=rq, row_ids=rid, n_slots=R,
                                                 cfg=self._launch, score_dtype=sdt)
            return out, scores
        # raw logits of each requested (head, row), reduced after the combine (softmax needs the
        # final log-sum-exp; per-row output keeps the rows apart)
        slots, n, to_rows, flat, to_one = self._row_slots(H, Hkv, T, rows, heads, dev)
        # summed softmax scores of a dense one-split call come out of the attention kernel itself
        fuse = (self._row_weights(H, T, rows, heads, dev)
                if kind == "softmax" and not per_row and self.config.fused_softmax_scores else None)
        out, lse, fused, raw = splitk_attention(q, k_cache, v_cache, meta, row_slots=slots, n_slots=n,
                                                cfg=self._launch, softmax_weights=fuse, score_dtype=sdt)
        if fused is not None:
            return out, fused
        scores = reduce_scores(raw, lse, flat, to_rows if per_row else to_one, meta.lengths, T,
                               dense=not meta.sparse, softmax=kind == "softmax")  # (B, H_kv, R or 1, L)
        return out, (scores if per_row else scores.view(B, Hkv, L))

    def _window_delegate(self):
        """The torch backend that computes sliding-window / soft-capped calls and draft trees past one tile (built
        once)."""
        if getattr(self, "_torch_delegate", None) is None:
            from specdec.attention.torch_backend import TorchBackend, TorchConfig

            self._torch_delegate = TorchBackend(TorchConfig(static=self.capture_safe))
        return self._torch_delegate

    def _many_rows(self, q, k_cache, v_cache, meta: AttentionMetadata):
        """Prefill-sized forwards (more rows than one packed tile holds).

        Dense without scores on a GPU, more than :data:`MANY_ROWS_SPLITK_MAX_T` rows (a prefill chunk): PyTorch
        SDPA with a causal mask (one host sync to size the KV slice). Otherwise: the split-K kernel over chunks
        of rows (row ``t`` of a chunk starting at ``t0`` is row ``t0 + t`` of the forward, i.e. the same kernel
        with ``lengths + t0``); each chunk reads the KV once, so a verify of γ + 1 rows just past one tile costs
        two passes (the masked SDPA cost ~6 on the H200: 141.7 vs 22.1 ms per 8B verify at γ 16 vs 8).
        """
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        lengths, score_rows = meta.lengths, meta.score_rows
        if not meta.sparse and score_rows is None and q.device.type == "cuda" and T > MANY_ROWS_SPLITK_MAX_T:
            n = min(L, int(lengths.max()) + T)
            pos = torch.arange(n, device=q.device).view(1, 1, 1, n)
            rowpos = lengths.view(B, 1, 1, 1) + torch.arange(T, device=q.device).view(1, 1, T, 1)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k_cache[:, :, :n], v_cache[:, :, :n], attn_mask=pos <= rowpos, scale=meta.scale, enable_gqa=True
            ), None
        chunk = max(1, self.config.max_packed_rows // (H // Hkv))
        outs = []
        # every score kind is per row (each row normalised on its own), so summed scores are the sum of each
        # chunk's summed scores; per-row scores land in their rows' slices
        per_row = meta.score_per_row
        R = 0 if score_rows is None else len(score_rows)
        total = None if score_rows is None else torch.zeros((B, Hkv, R, L) if per_row else (B, Hkv, L),
                                                             dtype=torch.float32, device=q.device)
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            picked = [] if score_rows is None else [i for i, r in enumerate(score_rows) if t0 <= r < t1]
            rows = [score_rows[i] - t0 for i in picked] if picked else None
            o, s = self.attend(q[:, :, t0:t1], k_cache, v_cache,
                               meta.replace(lengths=lengths + t0, score_rows=rows, score_per_row=per_row and bool(rows)))
            outs.append(o)
            if s is not None:
                if per_row:
                    total[:, :, picked] += s
                else:
                    total += s
        return torch.cat(outs, dim=2), total

    @staticmethod
    def _sdpa_decode(q, k_cache, v_cache, lengths, scale):
        """One dense row through PyTorch SDPA (:func:`specdec.cuda.peers.sdpa_decode`)."""
        return peers.sdpa_decode(q, k_cache, v_cache, lengths, scale)
