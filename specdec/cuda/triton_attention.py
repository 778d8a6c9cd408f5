"""Triton kernels: split-K attention of a few query rows over a long ragged KV cache.

One kernel serves three uses (``SPARSE`` and ``SCORE_MODE`` are compile-time switches):

* **verify / decode** (dense): the ``T`` new rows of a sequence attend causally to positions
  ``<= lengths[b] + t`` (a draft tree's rows: to the cached positions and the new rows ``tree[t]`` allows). The
  ``T`` rows times the ``G`` query heads of one KV group are packed into the ``BLOCK_M`` rows of one tile (row
  ``m = g * T + t``), so each K/V tile is read from memory once per KV head, not once per query head and row.
* **sparse** (draft steps, sparse verification): the positions come from an index list per
  (sequence, KV head) (page size 1) followed by the dense tail ``dense_from[b] ..
  lengths[b] + T - 1``. Plan entries ``>= dense_from[b]`` are skipped (the tail covers them), so
  a position is never counted twice; the plan itself must not repeat a position.
* **scores**: ``SCORE_MODE == 1`` emits the pre-softmax logits of the requested rows summed over
  the group's (kept) heads, ``(B, H_kv, L)`` fp32, without a second pass: row ``m`` sees position
  ``p`` iff ``p <= lengths[b] + t_m``, so with the suffix sums ``qs_j = sum_{t_m >= j} w_m q_m``
  the score of ``p`` is ``qs_{max(0, p - lengths[b])} . k_p`` -- one extra 16-row MMA per tile
  and an in-warp pick of one row per column. ``SCORE_MODE == 3`` does the same per requested row
  (``(B, H_kv, R, L)``, ``score_per_row``). ``SCORE_MODE == 2`` stores the raw logits of each
  requested (head, row) so that softmax weights can be rebuilt after the combine, once the final
  log-sum-exp is known (``reduce_scores``). ``SCORE_MODE == 4`` reduces the tile the kernel has
  anyway: ``sum_m w_m s[m, p]`` over the visible rows (logits, the same as mode 1, no extra MMA), or
  with ``SCORE_EXP`` the one-pass softmax ``sum_m w_m exp(s[m, p] - ref_m)`` where ``ref_m`` is row
  ``m``'s log-sum-exp over its *anchor* positions (the first and the last ``NA = 16`` positions of the
  sequence that it sees: attention sinks and recent tokens), computed before the loop from one extra
  tile of K; in the loop it is the tile's ``p`` times one factor ``exp(m_running - ref_m)`` per row,
  so no second pass and no per-row buffer. It equals the softmax weights times ``exp(lse_m - ref_m)``
  (>= 1: one over the share of row ``m``'s attention on its anchors) (``sink_softmax`` scores).

The sequence (or its virtual index list) is cut into ``num_splits`` chunks per (sequence, KV head)
so that enough programs run at batch 1 (flash-decoding); a second small kernel combines the chunks
by log-sum-exp. With one chunk (``DIRECT_OUT``: sparse plans at large batch, or a forced
``num_splits=1``) the split kernel normalises and writes the output and its log-sum-exp itself,
skipping the combine launch and the fp32 partials. Dense score buffers are written in full by the
kernel (0 at positions no requested row sees), so they need no fill. Every launch size depends
only on tensor shapes, never on the values of ``lengths``: no host synchronisation, and the
launches can be captured in a CUDA graph.

This module imports nothing from specdec (the GPU benchmarks import it alone).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specdec.interfaces import AttentionMetadata
from specdec.cuda.triton_pdl import pdl_args

LOG2E = 1.4426950408889634
#: ``sink_softmax`` anchors: the first and the last this many positions (``reference.SINK_ANCHORS``)
SINK_ANCHORS = 16


@triton.jit
def _sink_anchor_ref(q, k_base, stride_kl, n_ctx, row_pos, sm_scale, offs_d, NA: tl.constexpr,
                     DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """Each packed row's ``sink_softmax`` reference: the log-sum-exp of its logits over the anchor
    positions -- the first ``NA`` (attention sinks) and the last ``NA`` of the sequence (recent tokens),
    those the row sees -- from one ``(D, 2 NA)`` tile of K. ``(BLOCK_M,)`` fp32; position 0 is always
    seen, so every entry is finite."""
    offs_a = tl.arange(0, 2 * NA)
    apos = tl.where(offs_a < NA, offs_a, n_ctx - 2 * NA + offs_a)
    a_ok = tl.where(offs_a < NA, offs_a < n_ctx, apos >= NA)  # the recent half skips the sinks
    apos = tl.where(a_ok, apos, 0)
    ka = tl.load(k_base + apos[None, :] * stride_kl + offs_d[:, None], mask=a_ok[None, :], other=0.0)
    if UPCAST:
        ka = ka.to(tl.float32)
    sa = tl.dot(q, ka, input_precision=DOT_PREC) * sm_scale
    sa = tl.where(a_ok[None, :] & (apos[None, :] <= row_pos[:, None]), sa, float("-inf"))
    ma = tl.max(sa, axis=1)
    return ma + tl.log(tl.sum(tl.math.exp2((sa - ma[:, None]) * 1.4426950408889634), axis=1))


@triton.jit
def _packed_rows_q(Q, Lens, pid_bh, stride_qb, stride_qh, stride_qt, HKV: tl.constexpr, T: tl.constexpr,
                   G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, UPCAST: tl.constexpr, row0=0):
    """The prologue of a program of (sequence, KV head) ``pid_bh`` over its packed rows (row ``m`` = query head
    ``h G + m // T`` at draft row ``m % T``): ``(b, b64, h, length, n_ctx, offs_m, g, t, row_valid, offs_d, q)``
    with ``q`` the ``(BLOCK_M, D)`` queries (zero past the ``G T`` rows; fp32 under ``UPCAST``); ``row0``: the first
    packed row of this program (a row block, see ``LaunchConfig.row_block``)."""
    b = pid_bh // HKV
    h = pid_bh % HKV
    b64 = b.to(tl.int64)
    length = tl.load(Lens + b)
    n_ctx = length + T
    offs_m = row0 + tl.arange(0, BLOCK_M)
    g = offs_m // T
    t = offs_m % T
    row_valid = offs_m < T * G
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b64 * stride_qb + (h * G + g)[:, None] * stride_qh + t[:, None] * stride_qt + offs_d[None, :],
                mask=row_valid[:, None], other=0.0)
    if UPCAST:  # Triton's CPU interpreter miscomputes bf16 dots: do them in fp32 there
        q = q.to(tl.float32)
    return b, b64, h, length, n_ctx, offs_m, g, t, row_valid, offs_d, q


@triton.jit
def _tree_visible(TreeMask, tree_row, t, row_valid, pos, valid, length, T: tl.constexpr, TREE_BITS: tl.constexpr):
    """``(BLOCK_M, BLOCK_N)`` bool: which positions ``pos`` of a tile the packed rows (draft-tree row ``t``) see: the
    valid cached ones (``< length``) and new row ``j`` (position ``length + j``) where the tree says so -- bit ``j``
    of the row's word ``tree_row`` (``TREE_BITS``) or ``TreeMask[t, j]`` (a gather)."""
    if TREE_BITS:
        jn = tl.minimum(tl.maximum(pos - length, 0), 63)
        seen = (tree_row[:, None] >> jn[None, :]) & 1
    else:
        jn = pos - length
        new_row = valid & (jn >= 0) & (jn < T)
        seen = tl.load(TreeMask + t[:, None] * T + jn[None, :], mask=row_valid[:, None] & new_row[None, :], other=0)
    return valid[None, :] & ((pos[None, :] < length) | (seen != 0))


@triton.jit
def _sink_anchor_kernel(
    Q, K, Lens, Ref, sm_scale,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kl,
    HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    NA: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    """``sink_anchors="pre"``: the anchors of one (sequence, KV head), once, before the split kernel:
    ``Ref[(b * H_kv + h) * BLOCK_M + m]`` for the packed rows ``m`` (the same rows as the split kernel)."""
    pid_bh = tl.program_id(0)
    b, b64, h, length, n_ctx, offs_m, g, t, row_valid, offs_d, q = _packed_rows_q(
        Q, Lens, pid_bh, stride_qb, stride_qh, stride_qt, HKV, T, G, D, BLOCK_M, UPCAST)
    k_base = K + b64 * stride_kb + h * stride_kh
    ref = _sink_anchor_ref(q, k_base, stride_kl, n_ctx, length + t, sm_scale, offs_d, NA, DOT_PREC, UPCAST)
    tl.store(Ref + pid_bh.to(tl.int64) * BLOCK_M + offs_m, ref)


@triton.jit
def _splitk_attn_kernel(
    Q, K, V, Lens, Idx, DenseFrom, RowW, RowSlot,
    PartO, PartLse, Scores, RawLogits, Out, OutLse,
    sm_scale,
    stride_qb, stride_qh, stride_qt,
    stride_ob, stride_oh, stride_ot,
    stride_kb, stride_kh, stride_kl,
    stride_vb, stride_vh, stride_vl,
    stride_ib, stride_ih,
    L, NUM_SPLITS, KPLAN, NSLOT,
    HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr, SCORE_MODE: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
    NOUT: tl.constexpr = 1, DIRECT_OUT: tl.constexpr = False, ZERO_TAIL: tl.constexpr = False,
    V_EARLY: tl.constexpr = False, Sem=None, FUSED_COMBINE: tl.constexpr = False,
    FUSED_SOFTMAX: tl.constexpr = False, SCORE_EXP: tl.constexpr = False, SINK_CLAMP: tl.constexpr = 60.0, NA: tl.constexpr = 16,
    SinkRef=None, ANCHOR_IN: tl.constexpr = False, DIRECT_STORE: tl.constexpr = False,
    ANCHOR_LOOP: tl.constexpr = False, PDL: tl.constexpr = False, SINK_FOLD: tl.constexpr = False,
    LOG2_FOLD: tl.constexpr = False, SPLIT_TILES: tl.constexpr = False,
    TreeMask=None, TREE: tl.constexpr = False, TREE_BITS: tl.constexpr = False, PART_M: tl.constexpr = None,
    Order=None, NLive=None, ORDERED: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    if ORDERED:  # few live sequences (a valve's re-run): program slot i serves the i-th live one, the rest exit
        slot = pid_bh // HKV
        if slot >= tl.load(NLive):
            return
        pid_bh = tl.load(Order + slot) * HKV + pid_bh % HKV
    # row blocks (PART_M > BLOCK_M): program (., ., r) takes packed rows [r BLOCK_M, (r + 1) BLOCK_M); the partials
    # of a split hold all PART_M rows (PART_M = BLOCK_M: one block)
    b, b64, h, length, n_ctx, offs_m, g, t, row_valid, offs_d, q = _packed_rows_q(
        Q, Lens, pid_bh, stride_qb, stride_qh, stride_qt, HKV, T, G, D, BLOCK_M, UPCAST,
        tl.program_id(2) * BLOCK_M)
    row_pos = length + t
    if TREE_BITS:  # a draft tree as one int64 per row: bit j set where row t sees new row j (no gather in the loop)
        tree_row = tl.load(TreeMask + t, mask=row_valid, other=0)
    else:
        tree_row = 0  # (unused)

    if SPARSE:
        df = tl.maximum(tl.load(DenseFrom + b), 0)
        tail = tl.maximum(n_ctx - df, 0)
        vlen = KPLAN + tail
    else:
        df = n_ctx  # unused
        vlen = n_ctx
    per_split = tl.cdiv(tl.cdiv(vlen, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = pid_s * per_split
    end = tl.minimum(start + per_split, vlen)

    k_base = K + b64 * stride_kb + h * stride_kh
    v_base = V + b64 * stride_vb + h * stride_vh
    offs16 = tl.arange(0, 16)
    if SCORE_MODE == 1:
        # sum_m w_m [row m sees p] (q_m . k_p): row m sees p iff p <= length + t_m, so with the
        # suffix sums qs_j = sum_{m: t_m >= j} w_m q_m the score of p is qs_{max(0, p - length)} . k_p.
        # One extra 16-row MMA per tile and a store that picks one row per column: no reduction.
        w = tl.load(RowW + h * (G * T) + offs_m, mask=row_valid, other=0.0)
        amat = tl.where((t[None, :] >= offs16[:, None]) & row_valid[None, :], w[None, :], 0.0)
        qs = tl.dot(amat, q.to(tl.float32), input_precision="ieee").to(q.dtype)  # (16, D)
    if SCORE_MODE == 3:
        # per requested row r (< 16): sum over the group's kept heads of q_{g, t_r} . k_p, p <= length + t_r
        amat = tl.load(RowW + (h * 16 + offs16[:, None]) * (G * T) + offs_m[None, :],
                       mask=row_valid[None, :], other=0.0)
        qs = tl.dot(amat, q.to(tl.float32), input_precision="ieee").to(q.dtype)  # (16, D)
    if SCORE_MODE == 2:
        slot = tl.load(RowSlot + h * (G * T) + offs_m, mask=row_valid, other=-1)
    if SCORE_MODE == 4:
        # row-weighted column sum of the tile the kernel computes anyway: no extra MMA, no pick
        w = tl.load(RowW + h * (G * T) + offs_m, mask=row_valid, other=0.0)
        if SCORE_EXP:
            if ANCHOR_IN:  # computed once per (sequence, KV head) by _sink_anchor_kernel (sink_anchors="pre")
                ref = tl.load(SinkRef + pid_bh.to(tl.int64) * BLOCK_M + offs_m)
            elif ANCHOR_LOOP:  # computed in the loop's first iteration, once its first tiles are in flight
                ref = tl.zeros([BLOCK_M], tl.float32)
            else:  # one extra (D, 2 NA) tile of K per program, before the loop
                ref = _sink_anchor_ref(q, k_base, stride_kl, n_ctx, row_pos, sm_scale, offs_d, NA, DOT_PREC, UPCAST)
            if SINK_FOLD:  # score_store "lean": w and log2(e) folded out of the loop (w = 0: -inf, a 0 factor)
                ref2 = ref * 1.4426950408889634
                lw2 = tl.where(w > 0.0, tl.log2(tl.where(w > 0.0, w, 1.0)), float("-inf"))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if LOG2_FOLD:
        # the running max m_i is kept in log2 units of the scaled logits (m_i = max(q.k) sm_scale log2 e): a
        # tile's weights are then one FFMA and an exp2 per element, exp2(q.k c - m_i), instead of a scale, a
        # subtract and a second scale; the max is taken over the raw products (c > 0)
        qk_scale = sm_scale * 1.4426950408889634
        if SCORE_MODE == 4:
            if SCORE_EXP:
                if not SINK_FOLD:  # ("lean" made ref2 above)
                    ref2 = ref * 1.4426950408889634
    if SPLIT_TILES:
        # dense: positions below the cache length are seen by every row and lie inside [start, end) up to
        # min(end, length): those whole tiles run without any mask (loads, visibility, store masks, the -inf
        # guard of the max); the rest (the causal diagonal, the split's ragged end) runs masked afterwards
        full_end = start + tl.maximum(tl.minimum(end, length) - start, 0) // BLOCK_N * BLOCK_N
    else:
        full_end = start

    for phase in tl.static_range(2 if SPLIT_TILES else 1):
        # masked tiles: `not SPLIT_TILES or phase == 1` (spelled out in each test: a static_range body cannot
        # name a constexpr, and a plain local would be a runtime value)
        if SPLIT_TILES and phase == 0:
            lo = start
            hi = full_end
        else:
            lo = full_end
            hi = end
        for j0 in range(lo, hi, BLOCK_N):
            offs_n = j0 + tl.arange(0, BLOCK_N)
            if SPARSE:
                in_rng = offs_n < end
                is_plan = offs_n < KPLAN
                ip = tl.load(Idx + b64 * stride_ib + h * stride_ih + offs_n, mask=in_rng & is_plan, other=-1)
                ok_plan = (ip >= 0) & (ip < df) & (ip < L)
                pos = tl.where(is_plan, ip, (df + offs_n - KPLAN).to(tl.int64))
                valid = in_rng & (ok_plan | (~is_plan))
                pos = tl.where(valid, pos, 0)
            else:
                pos = offs_n
                valid = offs_n < end
            k_ptrs = k_base + pos[None, :] * stride_kl + offs_d[:, None]
            v_ptrs = v_base + pos[:, None] * stride_vl + offs_d[None, :]
            if not SPLIT_TILES or phase == 1:
                kt = tl.load(k_ptrs, mask=valid[None, :], other=0.0)
            else:
                kt = tl.load(k_ptrs)
            if V_EARLY:
                # the V rows of the same positions are gathered right after the K rows: both requests are in
                # flight together instead of the V gather waiting for the softmax of the tile
                if not SPLIT_TILES or phase == 1:
                    vt = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
                else:
                    vt = tl.load(v_ptrs)
            if UPCAST:
                kt = kt.to(tl.float32)
            s = tl.dot(q, kt, input_precision=DOT_PREC)
            if not LOG2_FOLD:
                s = s * sm_scale
            if not SPLIT_TILES or phase == 1:
                if TREE:  # (TREE_BITS implies TREE)
                    if SPARSE:  # (a plan's positions are not ordered: every tile takes the tree's test)
                        vis = _tree_visible(TreeMask, tree_row, t, row_valid, pos, valid, length, T, TREE_BITS)
                    elif j0 + BLOCK_N > length:  # dense: only the tiles that reach the new rows take it
                        vis = _tree_visible(TreeMask, tree_row, t, row_valid, pos, valid, length, T, TREE_BITS)
                    else:  # the tiles below see every valid position, as in a chain
                        vis = valid[None, :] & (t[:, None] >= 0)
                else:
                    vis = valid[None, :] & (pos[None, :] <= row_pos[:, None])
                s = tl.where(vis, s, float("-inf"))
                s_ok = valid & (pos < n_ctx)  # where a position's score is stored
            if SCORE_MODE == 1:
                sc2 = tl.dot(qs, kt, input_precision=DOT_PREC) * sm_scale  # row j: qs_j . k
                jpos = tl.maximum(pos - length, 0)
                sc = tl.sum(tl.where(offs16[:, None] == jpos[None, :], sc2, 0.0), axis=0)  # 16 rows: in-warp
                if not SPLIT_TILES or phase == 1:
                    tl.store(Scores + pid_bh.to(tl.int64) * L + pos, sc, mask=s_ok)
                else:
                    tl.store(Scores + pid_bh.to(tl.int64) * L + pos, sc)
            if SCORE_MODE == 3:
                sc2 = tl.dot(qs, kt, input_precision=DOT_PREC) * sm_scale
                for r in tl.static_range(NOUT):  # one row at a time: a 2-D pointer tile costs ~70 registers
                    sc_r = tl.sum(tl.where(offs16[:, None] == r, sc2, 0.0), axis=0)
                    r_ptr = Scores + (pid_bh.to(tl.int64) * NOUT + r) * L + pos
                    if not SPLIT_TILES or phase == 1:
                        t_r = tl.load(RowSlot + r)
                        # positions row r cannot see get an explicit 0 (the buffer is not zero-filled)
                        tl.store(r_ptr, tl.where(pos <= length + t_r, sc_r, 0.0), mask=s_ok)
                    else:  # every row sees every position of the tile
                        tl.store(r_ptr, sc_r)
            if SCORE_MODE == 2:
                r_ptrs = RawLogits + (pid_bh.to(tl.int64) * NSLOT + slot[:, None]) * L + pos[None, :]
                s_nat = s * sm_scale if LOG2_FOLD else s  # the raw logits, natural units
                if not SPLIT_TILES or phase == 1:
                    tl.store(r_ptrs, s_nat.to(RawLogits.dtype.element_ty), mask=(slot >= 0)[:, None] & valid[None, :])
                else:
                    tl.store(r_ptrs, s_nat.to(RawLogits.dtype.element_ty), mask=(slot >= 0)[:, None])
            if LOG2_FOLD:
                m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            else:
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
            if not SPLIT_TILES or phase == 1:  # a row that sees nothing yet keeps m = -inf: exponents against 0 instead
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_safe = m_new
            if LOG2_FOLD:
                alpha = tl.math.exp2(m_i - m_safe)
                p = tl.math.exp2(s * qk_scale - m_safe[:, None])
            else:
                alpha = tl.math.exp2((m_i - m_safe) * 1.4426950408889634)
                p = tl.math.exp2((s - m_safe[:, None]) * 1.4426950408889634)
            if SCORE_MODE == 4:
                if SCORE_EXP:
                    if ANCHOR_LOOP:
                        if j0 == start:
                            ref = _sink_anchor_ref(q, k_base, stride_kl, n_ctx, row_pos, sm_scale, offs_d, NA,
                                                   DOT_PREC, UPCAST)
                            if SINK_FOLD or LOG2_FOLD:
                                ref2 = ref * 1.4426950408889634
                    # exp(s - ref) = p * exp(m - ref): the tile's p times one factor per row (16 exps, not 16 x N)
                    if SINK_FOLD:
                        # w exp(min(m - ref, C)) = exp2(min(m log2e - ref log2e, C log2e) + log2 w): per row one
                        # FFMA, one min, one add and the exp2 (no multiply by log2e after the min, none by w)
                        m2 = m_safe if LOG2_FOLD else m_safe * 1.4426950408889634
                        cw = tl.math.exp2(tl.minimum(m2 - ref2, SINK_CLAMP * 1.4426950408889634) + lw2)
                    elif LOG2_FOLD:
                        cw = w * tl.math.exp2(tl.minimum(m_safe - ref2, SINK_CLAMP * 1.4426950408889634))
                    else:
                        cw = w * tl.math.exp2(tl.minimum(m_safe - ref, SINK_CLAMP) * 1.4426950408889634)
                    sc = tl.sum(p * cw[:, None], axis=0)
                else:
                    if not SPLIT_TILES or phase == 1:
                        sc = tl.sum(tl.where(vis, s, 0.0) * w[:, None], axis=0)
                    else:
                        sc = tl.sum(s * w[:, None], axis=0)
                    if LOG2_FOLD:
                        sc = sc * sm_scale
                s_ptr = Scores + pid_bh.to(tl.int64) * L + pos
                if not SPLIT_TILES or phase == 1:
                    if SINK_FOLD and not SPARSE:
                        st_ok = valid  # dense: pos = offs_n < end <= n_ctx already ("lean": one compare less)
                    else:
                        st_ok = s_ok
                else:
                    st_ok = tl.full([BLOCK_N], 1, tl.int1)
                if DIRECT_STORE:
                    # score_store="direct" / "lean": each thread stores the sums the row reduction left in its
                    # registers (lanes holding the same column store the same value) -- tl.store would first move
                    # the vector into a coalesced layout through shared memory, two barriers per tile (sm_90 SASS)
                    if Scores.dtype.element_ty == tl.bfloat16:
                        _ = tl.inline_asm_elementwise(
                            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b16 [$1], $2; mov.u32 $0, 0; }",
                            "=r,l,h,r", [s_ptr.to(tl.int64), sc.to(tl.bfloat16), st_ok.to(tl.int32)],
                            dtype=tl.int32, is_pure=False, pack=1)
                    else:
                        _ = tl.inline_asm_elementwise(
                            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, 0; }",
                            "=r,l,r,r", [s_ptr.to(tl.int64), sc, st_ok.to(tl.int32)],
                            dtype=tl.int32, is_pure=False, pack=1)
                elif not SPLIT_TILES or phase == 1:
                    tl.store(s_ptr, sc.to(Scores.dtype.element_ty), mask=st_ok)
                else:
                    tl.store(s_ptr, sc.to(Scores.dtype.element_ty))
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if not V_EARLY:
                if not SPLIT_TILES or phase == 1:
                    vt = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
                else:
                    vt = tl.load(v_ptrs)
            pv = p.to(vt.dtype)
            if UPCAST:
                pv = pv.to(tl.float32)
                vt = vt.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(pv, vt, input_precision=DOT_PREC)
            m_i = m_new

    has = l_i > 0.0
    if LOG2_FOLD:  # back to natural units: lse = m ln 2 + log l
        lse = tl.where(has, m_i * 0.6931471805599453 + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    else:
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    if DIRECT_OUT:  # one split: this program owns the rows, no partials and no combine launch
        o_ptrs = Out + b64 * stride_ob + (h * G + g)[:, None] * stride_oh + t[:, None] * stride_ot + offs_d[None, :]
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_valid[:, None])
        tl.store(OutLse + (b64 * (HKV * G) + h * G + g) * T + t, lse, mask=row_valid)
        if FUSED_SOFTMAX:
            # softmax scores without a second launch (dense, one split): this program now knows each
            # row's final log-sum-exp, so it re-reads the raw logits it just wrote (mostly still in L2)
            # and stores sum_m w_m exp(raw_m - lse_m) per position: (B, H_kv, L), no reduce kernel
            tl.debug_barrier()  # the raw stores of other threads of this program are visible
            wf = tl.load(RowW + h * (G * T) + offs_m, mask=row_valid, other=0.0)
            use = (slot >= 0) & has
            lse_u = tl.where(use, lse, 0.0)
            for j0 in range(start, end, BLOCK_N):
                pos_e = j0 + tl.arange(0, BLOCK_N)
                ok = pos_e < end
                raw = tl.load(RawLogits + (pid_bh.to(tl.int64) * NSLOT + slot[:, None]) * L + pos_e[None, :],
                              mask=use[:, None] & ok[None, :], other=float("-inf"))
                pe = tl.where(raw == float("-inf"), 0.0, tl.exp(raw - lse_u[:, None]))
                sc = tl.sum(tl.where(use[:, None], wf[:, None] * pe, 0.0), axis=0)
                tl.store(Scores + pid_bh.to(tl.int64) * L + pos_e, sc, mask=ok)
    else:
        part = pid_bh.to(tl.int64) * NUM_SPLITS + pid_s
        tl.store(PartO + (part * PART_M + offs_m)[:, None] * D + offs_d[None, :], o)
        tl.store(PartLse + part * PART_M + offs_m, lse)
        if FUSED_COMBINE:
            # the last program of this (sequence, KV head) to finish merges the splits: no combine launch.
            # Partials are stored, the block synchronises, then one thread's acq_rel atomic publishes
            # them (the pattern of CUTLASS's semaphore); the last one reads them from L2 (.cg) and sets
            # its counter back to 0 for the next launch (graph replays included)
            tl.debug_barrier()
            done = tl.atomic_add(Sem + pid_bh, 1, sem="acq_rel", scope="gpu")
            if done == NUM_SPLITS - 1:
                base = pid_bh.to(tl.int64) * NUM_SPLITS
                m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
                den = tl.zeros([BLOCK_M], tl.float32)
                acc_c = tl.zeros([BLOCK_M, D], tl.float32)
                for sp in range(0, NUM_SPLITS):
                    lse_s = tl.load(PartLse + (base + sp) * BLOCK_M + offs_m, cache_modifier=".cg")
                    o_s = tl.load(PartO + ((base + sp) * BLOCK_M + offs_m)[:, None] * D + offs_d[None, :],
                                  cache_modifier=".cg")
                    m_new_c = tl.maximum(m_run, lse_s)
                    m_safe_c = tl.where(m_new_c == float("-inf"), 0.0, m_new_c)
                    scale_old = tl.exp(m_run - m_safe_c)
                    wgt = tl.exp(lse_s - m_safe_c)
                    acc_c = acc_c * scale_old[:, None] + wgt[:, None] * o_s
                    den = den * scale_old + wgt
                    m_run = m_new_c
                has_c = den > 0.0
                o_fin = acc_c / tl.where(has_c, den, 1.0)[:, None]
                m_fin = tl.where(m_run == float("-inf"), 0.0, m_run)
                lse_fin = tl.where(has_c, m_fin + tl.log(tl.where(has_c, den, 1.0)), float("-inf"))
                o_ptrs = (Out + b64 * stride_ob + (h * G + g)[:, None] * stride_oh + t[:, None] * stride_ot
                          + offs_d[None, :])
                tl.store(o_ptrs, o_fin.to(Out.dtype.element_ty), mask=row_valid[:, None])
                tl.store(OutLse + (b64 * (HKV * G) + h * G + g) * T + t, lse_fin, mask=row_valid)
                tl.atomic_xchg(Sem + pid_bh, 0)

    if ZERO_TAIL:
        # dense scores: positions >= lengths + T are seen by no row; the splits share writing their 0s
        # (the buffer comes from torch.empty: no separate fill kernel)
        zlen = tl.maximum(L - n_ctx, 0)
        zper = tl.cdiv(zlen, NUM_SPLITS)
        zs = n_ctx + pid_s * zper
        ze = tl.minimum(zs + zper, L)
        zero = tl.zeros([BLOCK_N], tl.float32).to(Scores.dtype.element_ty)
        for z0 in range(zs, ze, BLOCK_N):
            offs_z = z0 + tl.arange(0, BLOCK_N)
            for r in tl.static_range(NOUT):
                tl.store(Scores + (pid_bh.to(tl.int64) * NOUT + r) * L + offs_z, zero, mask=offs_z < ze)


@triton.jit
def _combine_kernel(
    PartO, PartLse, Out, Lse,
    stride_ob, stride_oh, stride_ot,
    NUM_SPLITS,
    HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr, PDL: tl.constexpr = False, Order=None, NLive=None, ORDERED: tl.constexpr = False,
):
    """One program per (sequence, KV head, packed row): log-sum-exp merge of the chunks (``ORDERED``: as the split
    kernel, program slot ``i`` merges the ``i``-th live sequence's)."""
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_bh = tl.program_id(0)
    if ORDERED:
        slot = pid_bh // HKV
        if slot >= tl.load(NLive):
            return
        pid_bh = tl.load(Order + slot) * HKV + pid_bh % HKV
    m_row = tl.program_id(1)
    b = pid_bh // HKV
    h = pid_bh % HKV
    g = m_row // T
    t = m_row % T
    offs_d = tl.arange(0, D)
    offs_s = tl.arange(0, BLOCK_S)
    base = pid_bh.to(tl.int64) * NUM_SPLITS

    m_run = float("-inf")
    den = 0.0
    acc = tl.zeros([D], tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        sidx = s0 + offs_s
        smask = sidx < NUM_SPLITS
        lse_s = tl.load(PartLse + (base + sidx) * BLOCK_M + m_row, mask=smask, other=float("-inf"))
        m_new = tl.maximum(m_run, tl.max(lse_s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale_old = tl.exp(m_run - m_safe)
        wgt = tl.exp(lse_s - m_safe)
        o_s = tl.load(PartO + ((base + sidx) * BLOCK_M + m_row)[:, None] * D + offs_d[None, :],
                      mask=smask[:, None], other=0.0)
        acc = acc * scale_old + tl.sum(wgt[:, None] * o_s, axis=0)
        den = den * scale_old + tl.sum(wgt, axis=0)
        m_run = m_new
    has = den > 0.0
    out = acc / tl.where(has, den, 1.0)
    o_ptrs = Out + b.to(tl.int64) * stride_ob + (h * G + g) * stride_oh + t * stride_ot + offs_d
    tl.store(o_ptrs, out.to(Out.dtype.element_ty))
    m_fin = tl.where(m_run == float("-inf"), 0.0, m_run)
    lse = tl.where(has, m_fin + tl.log(tl.where(has, den, 1.0)), float("-inf"))
    tl.store(Lse + (b * (HKV * G) + h * G + g) * T + t, lse)


@triton.jit
def _softmax_scores_kernel(
    Raw, Lse, Flat, ToRows, Lens, Out,
    L, NSLOT, R,
    T: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr,
    R_PAD: tl.constexpr, BLOCK_L: tl.constexpr, DENSE: tl.constexpr, SOFTMAX: tl.constexpr,
):
    """``Out[b, kv, r, l] = sum_slot ToRows[kv, slot, r] * exp(Raw[b, kv, slot, l] - lse(slot))``
    (``SOFTMAX``) or ``... * Raw[b, kv, slot, l]`` (logits); ``-inf`` (not visible) counts 0.

    Dense forwards only wrote positions ``< lengths[b] + T``: the rest is masked here (no fill).
    """
    pid_bh = tl.program_id(0)
    pid_l = tl.program_id(1)
    b = pid_bh // HKV
    kv = pid_bh % HKV
    offs_l = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, R_PAD)
    lmask = offs_l < L
    if DENSE:
        lmask = lmask & (offs_l < tl.load(Lens + b) + T)
    acc = tl.zeros([R_PAD, BLOCK_L], tl.float32)
    for sl in range(0, NSLOT):
        f = tl.load(Flat + kv * NSLOT + sl)
        lse = tl.load(Lse + b.to(tl.int64) * (H * T) + f)
        raw = tl.load(Raw + (pid_bh.to(tl.int64) * NSLOT + sl) * L + offs_l, mask=lmask, other=float("-inf"))
        if SOFTMAX:
            p = tl.where(raw == float("-inf"), 0.0, tl.exp(raw - lse))
        else:
            p = tl.where(raw == float("-inf"), 0.0, raw)
        wr = tl.load(ToRows + (kv * NSLOT + sl) * R + offs_r, mask=offs_r < R, other=0.0)
        # slots a KV head does not use were never written (garbage, maybe NaN): weight 0 must win
        acc += tl.where(wr[:, None] != 0.0, wr[:, None] * p[None, :], 0.0)
    o_ptrs = Out + (pid_bh.to(tl.int64) * R + offs_r[:, None]) * L + offs_l[None, :]
    tl.store(o_ptrs, acc, mask=(offs_r < R)[:, None] & (offs_l < L)[None, :])


def reduce_scores(raw: torch.Tensor, lse: torch.Tensor, flat: torch.Tensor, to_rows: torch.Tensor,
                  lengths: torch.Tensor, T: int, dense: bool, softmax: bool) -> torch.Tensor:
    """Per-row scores ``(B, H_kv, R, L)`` from raw logits ``(B, H_kv, n, L)`` (and ``lse (B, H, T)``)."""
    B, Hkv, n, L = raw.shape
    R = to_rows.shape[-1]
    out = torch.empty((B, Hkv, R, L), dtype=torch.float32, device=raw.device)
    block_l = 256
    _softmax_scores_kernel[(B * Hkv, triton.cdiv(L, block_l))](
        raw, lse, flat.contiguous(), to_rows.contiguous(), lengths, out,
        L, n, R,
        T=T, H=lse.shape[1], HKV=Hkv, R_PAD=max(2, triton.next_power_of_2(R)), BLOCK_L=block_l, DENSE=dense,
        SOFTMAX=softmax, num_warps=4,
    )
    return out


#: Launch table: the first row whose key matches picks the tunables that a ``LaunchConfig`` leaves at
#: ``None``. Key: ``(sparse, largest head dim, raw_scores, sink_scores, verify, most (sequence, KV head)
#: pairs, least cache length)`` (``raw_scores`` / ``sink_scores`` ``None`` match both; ``verify``: ``True``
#: for calls of ``T > 1`` query rows per sequence, ``False`` for decode (``T == 1``), ``None`` both;
#: ``None`` pairs any batch; length 0 any cache); value:
#: ``(block_n, num_warps, num_stages, ctas_per_sm, v_early, min_tiles)``.
#:
#: * sparse plans (measured on an H200 on 2026-12-01 by ``benchmarks/gpu/sparse_attn.sh``,
#:   ``benchmarks/results/gpu_sparse_attn_2026-12-01b.md``): head dim <= 64 (SmolLM2 B 64 x 8k):
#:   128-position tiles, 3 stages, V gathered next to K: 13.0 us vs 13.4 us for ``SPARSE_LEGACY``;
#:   head dim 128 (Llama-3.1-8B, B 16 x 32k and B 1 x 128k): ``SPARSE_LEGACY`` was the fastest of 15
#:   launches (38.9 us; a 3-stage 64-position row reasoned from Triton's pipeliner took 52.6 us).
#: * dense (measured on an H200, ``benchmarks/results/gpu_kernels_2026-11-29.md``): head dim <= 64:
#:   3 stages and 8 programs per SM; head dim 128: 64-position tiles, 2 stages, 2 programs per SM;
#:   softmax scores at head dim 128: 737 us vs 944 us with the plain default.
#: * dense, head dim 128, few sequences over a long cache (measured on an H200 on 2026-12-01 by
#:   ``benchmarks/gpu/scores_e14.sh``, ``benchmarks/results/gpu_scores_2026-12-01c.md``): at
#:   Llama-3.1-8B B 1 x 128k verify (T = 5, 8 KV heads) 128-position tiles, 2 stages, 4 programs per
#:   SM took 150.6 us vs 165.7 us for the 64-position row (FlashInfer 148.1 us), 161.4 vs 181.5 us with
#:   ``sink_softmax`` scores; at B 16 x 32k 128-position tiles were slower (611 vs 516 us), so the row is
#:   keyed to at most 8 (sequence, KV head) pairs (one 8B sequence) and caches of 64k positions or more
#:   (only 128k measured).
#: * dense head dim 128 verify with ``sink_softmax`` scores (measured on an H200 on 2026-12-01 17:42 UTC
#:   by ``benchmarks/gpu/s18.sh``, ``benchmarks/results/gpu_scores_2026-12-01d.md``): at Llama-3.1-8B
#:   B 1 x 128k 64-position tiles, 3 stages, 4 programs per SM took 158.9 us vs 161.9 us at
#:   ``DENSE_FEW_LONG`` (``SINK_FEW_LONG``); at B 16 x 32k 128-position tiles, 3 stages, 2 programs
#:   per SM 538.5 vs 561.3 us at the any-batch row (``SINK_LONG``, keyed to caches of 32k positions or
#:   more: only 32k measured).
#: * dense head dim 128 **verify** (``T > 1``) without scores (the same run): the same two launches won
#:   over the table's: B 1 x 128k 149.5 vs 152.3 us at ``DENSE_FEW_LONG`` (FlashInfer 149.6 us), B 16 x 32k
#:   502.4 vs 516.4 us at the any-batch row; keyed like the ``SINK_`` rows (``VERIFY_FEW_LONG``,
#:   ``VERIFY_LONG``) to verify calls only: decode (``T == 1``) was not timed at those launches and keeps
#:   its rows, as does a call whose row count is not given. A verify with logits scores (not
#:   ``sink_softmax``, not raw) takes them too; it was not timed at them.
#:   In the 20:42 UTC run of the same day (``gpu_scores_2026-12-01e.md``) the B 1 x 128k verify took
#:   141.4 us at 2 programs per SM (one wave) against 149.1 us at 4 (FlashInfer 149.1 us):
#:   ``VERIFY_FEW_LONG`` is now 64-position tiles, 3 stages, 2 per SM (as ``SINK_FEW_LONG``).
#: * dense head dim 128 verify with ``sink_softmax`` scores at few pairs over a long cache, again (measured
#:   on an H200 on 2026-12-01 20:42 UTC by ``benchmarks/gpu/s18.sh``, ``benchmarks/results/gpu_scores_2026-12-01e.md``):
#:   at 8B B 1 x 128k 2 programs per SM (one wave of 33 splits) beat 4 for every score path (``sink_tile``
#:   153.3 vs 163.1 us), and the anchors from the pre-kernel with direct stores were the fastest there
#:   (149.8 us; FlashInfer without scores 149.1 us): ``SINK_FEW_LONG`` is now 64-position tiles, 3 stages,
#:   2 per SM, with ``SCORE_PATHS`` ``("pre", "direct")``. Every other row keeps ``("tile", "shared")``: at
#:   B 16 x 32k "direct" was slower (544.3 / 548.8 vs 538.4 us) and "pre" level (537.8), at SmolLM2 B 1 x 8k
#:   "pre" slower (12.4 vs 11.1 us), and "loop" never won.
#: * the same class, re-timed in place twice (H200, 2026-12-01 22:53 and 23:12 UTC, ``benchmarks/gpu/s18.sh``,
#:   ``benchmarks/results/gpu_scores_2026-12-01h.md`` / ``-01i.md``): ``("pre", "direct")`` was ~1.5 % slower than
#:   the tile anchors with direct stores in both (22:53 side by side 151.3 vs 148.2 us; 23:12 interleaved 148.4 vs
#:   146.2 us, side by side 149.6 vs 146.3 us; FlashInfer without scores 149.4 us at 23:12; the tile anchors with
#:   ``tl.store`` 146.3 us interleaved): ``SINK_FEW_LONG``'s ``SCORE_PATHS`` entry is now ``("tile", "direct")``.
#: the sparse launch before the table (2026-12-01): 128-position tiles, 2 stages, V after the softmax
SPARSE_LEGACY = (128, 4, 2, 4, False, 1)
#: sparse head dim 128 over a long cache (>= 32k positions) at more than one 8B sequence's 8 (sequence, KV
#: head) pairs: ``SPARSE_LEGACY`` with 2 programs per SM (3 splits instead of 5 at B 16 x 8 KV heads on 132
#: SMs) and the combine merged into the split kernel (``FUSED_COMBINE_ROWS``). Measured inside the graph-
#: replayed Llama-3.1-8B sparse 5 % step at B 16 x 32k on an H200 (2026-12-01 20:41 UTC,
#: ``benchmarks/results/gpu_8b_steps_2026-12-01e.md``): 6.05 ms vs 6.24 ms for ``SPARSE_LEGACY`` with a
#: combine launch (2 per SM alone 6.11 ms, the fused combine alone 6.07 ms; the isolated layer of 2026-12-01b
#: had ranked ``SPARSE_LEGACY`` first). One sequence (<= 8 pairs, B 1 x 128k) was not timed: it keeps
#: ``SPARSE_LEGACY`` and the combine launch.
SPARSE_LONG = (128, 4, 2, 2, False, 1)
#: rows whose calls merge the splits inside the split kernel when ``LaunchConfig.fused_combine`` is None
FUSED_COMBINE_ROWS = (SPARSE_LONG,)
#: dense head dim 128 at few (sequence, KV head) pairs over a long cache (see above)
DENSE_FEW_LONG = (128, 4, 2, 4, False, 1)
#: dense head dim 128 with ``sink_softmax`` scores: few pairs over a long cache / any batch over >= 32k
SINK_FEW_LONG = (64, 4, 3, 2, False, 1)
SINK_LONG = (128, 4, 3, 2, False, 1)
#: dense head dim 128 verify (``T > 1``): few pairs over a long cache / any batch over >= 32k (see above)
VERIFY_FEW_LONG = (64, 4, 3, 2, False, 1)
VERIFY_LONG = (128, 4, 3, 2, False, 1)
LaunchKey = tuple[bool, int, bool | None, bool | None, bool | None, int | None, int]
#: the key of ``SINK_FEW_LONG``: dense, head dim > 64, ``sink_softmax`` scores, <= 8 pairs, >= 64k positions
SINK_FEW_LONG_KEY: LaunchKey = (False, 1 << 30, None, True, None, 8, 1 << 16)
LAUNCH_TABLE: tuple[tuple[LaunchKey, tuple[int, int, int, int, bool, int]], ...] = (
    ((True, 64, None, None, None, None, 0), (128, 4, 3, 4, True, 1)),
    ((True, 128, None, None, None, 8, 1 << 15), SPARSE_LEGACY),
    ((True, 128, None, None, None, None, 1 << 15), SPARSE_LONG),
    ((True, 1 << 30, None, None, None, None, 0), SPARSE_LEGACY),
    ((False, 64, None, None, None, None, 0), (128, 4, 3, 8, False, 1)),
    ((False, 1 << 30, True, None, None, None, 0), (128, 4, 2, 4, False, 1)),
    (SINK_FEW_LONG_KEY, SINK_FEW_LONG),
    ((False, 1 << 30, None, False, True, 8, 1 << 16), VERIFY_FEW_LONG),
    ((False, 1 << 30, None, None, None, 8, 1 << 16), DENSE_FEW_LONG),
    ((False, 1 << 30, None, True, None, None, 1 << 15), SINK_LONG),
    ((False, 1 << 30, None, False, True, None, 1 << 15), VERIFY_LONG),
    ((False, 1 << 30, None, None, None, None, 0), (64, 4, 2, 2, False, 1)),
)


#: the score path (``sink_anchors``, ``score_store``) of the calls a ``LAUNCH_TABLE`` row serves, by the
#: row's key; rows not listed take ``DEFAULT_SCORE_PATH`` (see the table's notes above for the measurements)
SCORE_PATHS: dict[LaunchKey, tuple[str, str]] = {SINK_FEW_LONG_KEY: ("tile", "direct")}
DEFAULT_SCORE_PATH = ("tile", "shared")
#: the ``score_store`` values (see :func:`splitk_attention`)
SCORE_STORES = ("shared", "direct", "lean")


def _table_row(sparse: bool, head_dim: int, raw_scores: bool, pairs: int | None, length: int,
               sink_scores: bool, rows: int | None) -> tuple[LaunchKey, tuple[int, int, int, int, bool, int]]:
    for key, entry in LAUNCH_TABLE:
        sp, dmax, raw, sink, verify, most, least = key
        if (sp == sparse and head_dim <= dmax and (raw is None or raw == raw_scores)
                and (sink is None or sink == sink_scores) and length >= least
                and (verify is None or (rows is not None and (rows > 1) == verify))
                and (most is None or (pairs is not None and pairs <= most))):
            return key, entry
    raise LookupError(f"no launch table row for sparse={sparse}, head_dim={head_dim}")  # pragma: no cover


def table_entry(sparse: bool, head_dim: int, raw_scores: bool = False, pairs: int | None = None, length: int = 0,
                sink_scores: bool = False, rows: int | None = None) -> tuple[int, int, int, int, bool, int]:
    """The ``LAUNCH_TABLE`` row for a launch of ``pairs`` (sequence, KV head) programs over a cache of
    ``length`` positions (``pairs=None``: unknown, only rows for any batch match), ``rows`` query rows per
    sequence (``T``; ``None``: unknown, only rows for decode and verify alike match), emitting
    ``sink_softmax`` scores or not: ``(block_n, num_warps, num_stages, ctas_per_sm, v_early, min_tiles)``."""
    return _table_row(sparse, head_dim, raw_scores, pairs, length, sink_scores, rows)[1]


def score_path(sparse: bool, head_dim: int, raw_scores: bool = False, pairs: int | None = None, length: int = 0,
               sink_scores: bool = False, rows: int | None = None) -> tuple[str, str]:
    """``(sink_anchors, score_store)`` of the ``LAUNCH_TABLE`` row that serves the call (the arguments of
    :func:`table_entry`): ``SCORE_PATHS`` of that row's key, else ``DEFAULT_SCORE_PATH``."""
    key = _table_row(sparse, head_dim, raw_scores, pairs, length, sink_scores, rows)[0]
    return SCORE_PATHS.get(key, DEFAULT_SCORE_PATH)


#: ``LaunchConfig.fast_loop`` where a config leaves it at ``None`` (read at each launch, so a CUDA graph keeps the
#: loop it was captured with)
FAST_LOOP = True
#: the fast loop's unmasked pass runs only where a split spans at least this many tiles of the cache: each of the
#: two loops has its own pipeline prologue and drain, which a split of a few tiles pays twice (measured on an H200,
#: 2026-12-02 12:20 UTC: SmolLM2 verify at B 16 x 8k, ~3 tiles per split, 39.4 vs 37.1 us, at B 1 x 8k, 1 tile,
#: 10.7 vs 9.8 us; 86 tiles per split at 8B B 16 x 32k level without scores, -2.6 % with sink scores)
FAST_LOOP_MIN_TILES = 8
#: ``LaunchConfig.row_block`` / ``tree_bits`` where a config leaves them at ``None`` (0: no row blocks). Measured on
#: an H200 (2026-12-05 12:43 UTC, ``benchmarks/gpu/tree_kernel_sweep.py``, SmolLM2's attention, 8k, bf16, the kernel
#: replayed from CUDA graphs; ``benchmarks/results/gpu_tree_kernel_2026-12-05.md``): the default tree (21 rows) took
#: 50.3 / 104.8 / 13.0 us a call with bit words at B 16 / 64 / 1 against 128.4 / 119.9 / 23.9 with the byte mask and a
#: 21-row causal chain's 50.4 / 100.9 / 10.9; row blocks of 16 or 32 were slower everywhere (76-334 us at B 16 / 64)
ROW_BLOCK = 0
TREE_BITS = True
#: a dense call for few live sequences (``splitk_attention(live_order=...)``, the confidence valve's re-run) without a
#: ``live_bound`` sizes its splits as if this share of the batch were live (the count is on the device; a valve fires
#: for ~1 in 8 sequences per pass at B = 64 x 8k with ``margin=0.1``) and keeps a program slot for every sequence
FEW_LIVE_SHARE = 0.125


@dataclass(frozen=True)
class LaunchConfig:
    """Tunables of the split-K launch; ``None`` picks the row of ``LAUNCH_TABLE`` for the call."""

    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None  # None: enough programs to fill the GPU
    ctas_per_sm: int | None = None
    combine_warps: int = 2
    # sparse plans run in ONE split (output written by the split kernel, no combine launch, no fp32
    # partials) once the (sequence, KV head) programs alone reach this many per SM; None: never
    sparse_single_split_at: float | None = 1.0
    # the output is a (B, H, T, D) view of a (B, T, H, D) buffer (the kernels write through strides):
    # the layout transformers' o_proj reads, so the attention function's transpose(1, 2).contiguous()
    # copies nothing (one elementwise kernel per layer less when T > 1); False: a contiguous (B, H, T, D)
    out_bthd: bool = True
    # dense attention likewise runs in one split once the (sequence, KV head) programs reach this many
    # per SM; "auto": 1.0 at head dim <= 64 (measured on an H200 at B = 64 x 8k, SmolLM2 geometry: a
    # dense step 3.88 ms in one split vs 4.04-4.16 ms with 3-6 splits + combine, verify T = 5 4.13 vs
    # 4.50 ms; benchmarks/results/gpu_launch_reductions_2026-11-29.md), never at head dim 128 (not measured)
    dense_single_split_at: float | str | None = "auto"
    # gather V right after K in each tile (True) or after the tile's softmax (False); None: table
    v_early: bool | None = None
    # at least this many tiles per split when the split count is chosen automatically; None: table
    min_tiles: int | None = None
    # with more than one split, the last program of each (sequence, KV head) merges the splits (an
    # atomic counter per pair) instead of a second combine launch; None: on for the calls whose table row
    # is in FUSED_COMBINE_ROWS (sparse head dim 128 over >= 32k positions, more than 8 pairs), off elsewhere
    fused_combine: bool | None = None
    # the fused column-sum score path (see ``splitk_attention``): where ``sink_softmax``'s anchors come
    # from ("tile" / "pre" / "loop") and how a tile's scores are stored ("shared" / "direct"); None: the
    # table row's ``SCORE_PATHS`` entry
    sink_anchors: str | None = None
    score_store: str | None = None
    # the split kernel's tile loop: True keeps the running max in log2 units (a tile's weights are one
    # FFMA + exp2 per element) and, for dense calls, runs the tiles that every row sees whole without
    # masks, the causal diagonal and a split's ragged end masked after them; False: one masked loop in
    # natural units (the kernel before 2026-12-02, kept for side-by-side timing); None: ``FAST_LOOP``
    fast_loop: bool | None = None
    # packed rows per program: a call of more than this many packed rows (T G, a draft tree's 63) runs in row
    # blocks of this many (a third grid dimension; each block reads the split's K/V tiles again, mostly from L2)
    # instead of one tile of next_power_of_2(T G) rows; calls without scores only. None: ``ROW_BLOCK``
    row_block: int | None = None
    # a draft tree's mask as one int64 bit word per row, tested in registers (True; trees of <= 64 rows, a larger
    # one takes the byte mask), or gathered from the (T, T) mask in the tiles that reach the new rows (False);
    # None: ``TREE_BITS`` (True)
    tree_bits: bool | None = None

    def resolve(self, sparse: bool, head_dim: int, raw_scores: bool = False, pairs: int | None = None,
                length: int = 0, sink_scores: bool = False, rows: int | None = None) -> "LaunchConfig":
        auto = table_entry(sparse, head_dim, raw_scores, pairs, length, sink_scores, rows)
        anchors, store = self.sink_anchors, self.score_store
        if anchors is None or store is None:
            anchors, store = score_path(sparse, head_dim, raw_scores, pairs, length, sink_scores, rows)
        pick = lambda v, a: a if v is None else v  # noqa: E731
        dense_one = self.dense_single_split_at
        if dense_one == "auto":
            dense_one = 1.0 if head_dim <= 64 else None
        return LaunchConfig(pick(self.block_n, auto[0]), pick(self.num_warps, auto[1]),
                            pick(self.num_stages, auto[2]), self.num_splits, pick(self.ctas_per_sm, auto[3]),
                            self.combine_warps, self.sparse_single_split_at, self.out_bthd, dense_one,
                            pick(self.v_early, auto[4]), pick(self.min_tiles, auto[5]),
                            pick(self.fused_combine, sparse and auto in FUSED_COMBINE_ROWS),
                            pick(self.sink_anchors, anchors), pick(self.score_store, store),
                            pick(self.fast_loop, FAST_LOOP), pick(self.row_block, ROW_BLOCK),
                            pick(self.tree_bits, TREE_BITS))  # explicit wins


_SM_COUNT: dict[int, int] = {}
_SEMAPHORES: dict[str, torch.Tensor] = {}


def _semaphores(n: int, device: torch.device) -> torch.Tensor:
    """``(>= n,)`` int32 zeros, one counter per (sequence, KV head), kept per device (``fused_combine``).

    Every launch leaves its counters at 0 again, so one buffer serves all layers, steps and graph
    replays that run one after another on a stream (not two fused launches running concurrently).
    A buffer first made while a CUDA graph is captured comes from the graph's pool, its zero-fill
    is captured with it and replayed (harmless: the counters are 0 then anyway).
    """
    key = str(device)
    buf = _SEMAPHORES.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _SEMAPHORES[key] = buf
    return buf


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few splits so the combine path is exercised
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


#: shared memory the split kernel's pipelined K/V tiles may take (an H200 / H100 program gets at most 227 KB; the
#: rest is the kernel's other buffers)
SHARED_TILE_BYTES = 200 * 1024


def fit_shared(block_n: int, num_stages: int, head_dim: int, elem_bytes: int) -> tuple[int, int]:
    """``(block_n, num_stages)`` whose pipelined K and V tiles, ``(num_stages - 1) x 2 x block_n x head_dim`` elements
    (what Triton's pipeliner buffers), fit ``SHARED_TILE_BYTES``: fewer stages first (not below 2), then smaller
    tiles. The launch table's rows are measured in bf16; a float32 cache at head dim 128 doubles their tiles (128
    positions x 3 stages asked for 280 KB on an H200 and failed to launch)."""
    need = lambda bn, st: (st - 1) * 2 * bn * head_dim * elem_bytes  # noqa: E731
    while num_stages > 2 and need(block_n, num_stages) > SHARED_TILE_BYTES:
        num_stages -= 1
    while block_n > 16 and need(block_n, num_stages) > SHARED_TILE_BYTES:
        block_n //= 2
    return block_n, num_stages


def choose_splits(bh: int, virtual_len: int, device: torch.device, cfg: LaunchConfig, sparse: bool = False) -> int:
    """Chunks per (sequence, KV head): fill ``ctas_per_sm`` programs per SM, ``min_tiles`` tiles each.

    A sparse plan reads only a few tiles per (sequence, KV head); once ``bh`` programs alone give
    ``cfg.sparse_single_split_at`` programs per SM it runs in one split, whose program writes the
    output itself (no combine launch, no partials). A function of shapes only (CUDA-graph safe).
    """
    if cfg.num_splits is not None:
        return max(1, cfg.num_splits)
    sms = _sm_count(device)
    if sparse and cfg.sparse_single_split_at is not None and bh >= cfg.sparse_single_split_at * sms:
        return 1
    one = cfg.dense_single_split_at
    # (on a GPU only: the interpreter's 4 pretend SMs would otherwise route the CPU tests' small
    # batches past the split + combine path they are there to check; both paths have forced-split tests)
    if not sparse and isinstance(one, (int, float)) and device.type == "cuda" and bh >= one * sms:
        return 1
    target = sms * (cfg.ctas_per_sm or 4)
    s = max(1, math.ceil(target / max(bh, 1)))
    tiles = math.ceil(max(virtual_len, 1) / (cfg.block_n or 128))
    return max(1, min(s, math.ceil(tiles / max(1, cfg.min_tiles or 1))))


_TREE_BITS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def tree_bit_rows(tree: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``(T,)`` int64: bit ``j`` of word ``t`` set where ``tree[t, j]`` (``T <= 64``), kept per mask tensor (a
    :class:`~specdec.tree.DraftTree` makes its mask once per device, so a decode round converts nothing)."""
    T = tree.shape[0]
    if T > 64:
        raise ValueError(f"a tree of {T} rows has no 64-bit row words; at most 64 rows.")
    key = (tree.data_ptr(), str(device), T)
    hit = _TREE_BITS.get(key)
    if hit is not None and hit[0] is tree:
        return hit[1]
    weights = torch.ones(T, dtype=torch.int64, device=device) << torch.arange(T, device=device)
    bits = (tree.to(device=device, dtype=torch.int64) * weights).sum(-1)
    _TREE_BITS[key] = (tree, bits)
    return bits


def splitk_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    row_weights: torch.Tensor | None = None,
    row_slots: torch.Tensor | None = None,
    n_slots: int = 0,
    row_queries: torch.Tensor | None = None,
    row_ids: torch.Tensor | None = None,
    cfg: LaunchConfig = LaunchConfig(),
    softmax_weights: torch.Tensor | None = None,
    colsum: bool = False,
    sink_softmax: bool = False,
    score_dtype: torch.dtype = torch.float32,
    sink_anchors: str | None = None,
    score_store: str | None = None,
    tree: torch.Tensor | None = None,
    live_order: torch.Tensor | None = None,
    live_count: torch.Tensor | None = None,
    live_bound: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Launch the split-K kernel and (with more than one split) the combine.

    Args:
        q: ``(B, H, T, D)`` (last dim contiguous); k_cache/v_cache ``(B, H_kv, L, D)``.
        meta: lengths ``(B,)``, scale and sparse plan (``plan_indices`` ``(B, H_kv or 1, K)``, 1: one
            list shared by the KV heads, and ``dense_from`` ``(B,)``; ``None``: dense) of the call;
            its score fields are read by the backend, which encodes them in the arguments below.
        row_weights: ``(H, T)`` fp32 weight of each (head, row) in the fused logits sum, or ``None``.
        row_slots: ``(H, T)`` int32 slot of each (head, row) whose raw logits to keep (-1: none),
            with ``n_slots`` slots per KV head; exclusive with ``row_weights``.
        row_queries: per-row logits in the kernel: ``(H_kv, 16, G * T)`` fp32 weights
            combining the packed query rows into (at most 16) output rows, with ``n_slots = R``;
            scores come back ``(B, H_kv, R, L)``.
        row_ids: with ``row_queries``: ``(16,)`` int32 row index of each output (-1 = unused).
        softmax_weights: with ``row_slots``: ``(H, T)`` fp32 weight of each (head, row) in a softmax
            score sum. When the call is dense and runs in one split, the kernel itself then returns
            ``scores`` ``(B, H_kv, L)`` = ``sum w · exp(logit − lse)`` (no reduce launch); otherwise
            ``scores`` is ``None`` and the caller reduces ``raw`` (``reduce_scores``).
        colsum: with ``row_weights``: reduce the scores as a row-weighted column sum of the logit
            tile the kernel computes anyway (``SCORE_MODE`` 4) instead of the suffix-sum MMA and
            in-warp pick (``SCORE_MODE`` 1); the same logits.
        sink_softmax: with ``row_weights`` (implies ``colsum``): ``sum w · exp(min(logit − ref, 60))``
            where ``ref`` is each row's log-sum-exp over its anchor positions (the first and last 16
            it sees, known before the loop): softmax weights up to one factor per row, in one pass
            (see the module docstring).
        score_dtype: dtype of the fused score buffer (``SCORE_MODE`` 1/3/4) and of the raw logits
            (``SCORE_MODE`` 2): float32 or bfloat16.
        sink_anchors: with ``sink_softmax``, where each row's anchor log-sum-exp comes from:
            ``"tile"`` (every split program computes it from one extra K tile before its loop) or
            ``"pre"`` (``_sink_anchor_kernel`` computes it once per (sequence, KV head) before the split
            kernel, which loads it: one small launch more, one anchor tile per pair instead of one per
            split; with a single split the kernel computes it itself, as with ``"tile"``) or ``"loop"``
            (each split program computes it in its loop's first iteration, once the pipeline's first K/V
            tiles are in flight, instead of before the loop, where its K load and reductions delay them);
            ``None``: ``cfg.sink_anchors``, else the launch table's (``SCORE_PATHS``: ``"tile"``).
        score_store: how ``SCORE_MODE`` 4 stores a tile's scores: ``"shared"`` (``tl.store``, which first
            moves the reduced vector to a coalesced layout through shared memory) or ``"direct"`` (inline
            PTX stores from the registers the reduction leaves it in; on CUDA only -- Triton's CPU
            interpreter runs no PTX, so there the plain store runs) or ``"lean"`` (``"direct"``, and
            ``sink_softmax``'s per-row factor ``w exp(min(m - ref, 60))`` computed as
            ``exp2(min(m log2 e - ref log2 e, 60 log2 e) + log2 w)`` with ``ref log2 e`` and ``log2 w`` known
            before the loop; a dense call's store mask drops the compare that ``pos < end`` already implies:
            fewer instructions per tile, the same scores up to rounding; the fold also runs in the interpreter);
            ``None``: ``cfg.score_store``, else the launch table's (``"direct"`` for the ``SINK_FEW_LONG``
            class, ``"shared"`` elsewhere).
        tree: ``(T, T)`` bool, a draft tree's visibility among the new rows (:attr:`AttentionMetadata.tree`): row
            ``t`` sees new row ``j`` where ``tree[t, j]`` instead of where ``j <= t`` (the cached positions as
            always); no scores with it.
        live_order: a dense call for few live sequences (:attr:`AttentionMetadata.live_order`): ``(B,)`` int32
            sequence ids, the live ones first. The grid's program slots serve the live sequences only (slots past
            ``live_count`` exit at once); the other sequences' rows come back 0. No scores, plan or tree with it.
        live_count: with ``live_order``: ``(1,)`` int32, how many sequences are live.
        live_bound: with ``live_order``, at most this many sequences are live (the caller's promise; a host int,
            so a captured graph is one per bound): the grid holds that many program slots per KV head and the splits
            are sized for them. ``None``: a slot for every sequence, splits sized for :data:`FEW_LIVE_SHARE` of them.

    Returns:
        ``(out (B, H, T, D) (with ``cfg.out_bthd``, the default, a transposed view of a contiguous
        ``(B, T, H, D)`` buffer), lse (B, H, T) fp32, scores (B, H_kv, L) fp32 or None,
        raw logits (B, H_kv, n_slots, L) fp32 or None)``.
    """
    lengths, scale, plan_indices, dense_from = meta.lengths, meta.scale, meta.plan_indices, meta.dense_from
    B, H, T, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    dev = q.device
    cfg = cfg.resolve(plan_indices is not None, D, raw_scores=row_slots is not None, pairs=B * Hkv,
                      length=k_cache.shape[2], sink_scores=bool(sink_softmax), rows=T)
    bn, st = fit_shared(cfg.block_n, cfg.num_stages, D, k_cache.element_size())
    if (bn, st) != (cfg.block_n, cfg.num_stages):
        cfg = dataclasses.replace(cfg, block_n=bn, num_stages=st)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache/v_cache need a contiguous last dimension")
    block_m = max(16, triton.next_power_of_2(T * G))
    scored = row_weights is not None or row_slots is not None or row_queries is not None
    n_rb = 1
    ordered = live_order is not None
    if cfg.row_block and not scored and not ordered and block_m > cfg.row_block:
        if cfg.row_block < 16 or cfg.row_block & (cfg.row_block - 1):
            raise ValueError(f"row_block must be a power of two >= 16, not {cfg.row_block}.")
        n_rb = triton.cdiv(T * G, cfg.row_block)
        part_m = n_rb * cfg.row_block  # the partials' rows per split: every block's
        block_m = cfg.row_block
    else:
        part_m = block_m
    sparse = plan_indices is not None
    if ordered and (sparse or scored or tree is not None or live_count is None):
        raise ValueError("a few-live call (live_order) is dense, without scores or a tree, and needs live_count.")
    if sparse:
        idx = plan_indices
        if idx.stride(-1) != 1:
            idx = idx.contiguous()
        kplan = idx.shape[-1]
        df = dense_from if dense_from is not None else torch.full((B,), L + T, dtype=torch.long, device=dev)
        virtual = kplan + cfg.block_n
    else:
        idx, df, kplan = lengths, lengths, 0
        virtual = L
    # few live: the grid holds live_bound program slots per KV head (a slot for every sequence without a bound) and
    # the splits are sized for the bound (FEW_LIVE_SHARE of the batch without one) -- shapes only: a captured graph
    # replays one launch whatever the count on the device
    if ordered and live_bound is not None and not 1 <= live_bound <= B:
        raise ValueError(f"live_bound must be 1 to the batch ({B}), not {live_bound}.")
    slots = (live_bound or B) if ordered else B  # program slots per KV head
    pairs = (live_bound or max(1, math.ceil(B * FEW_LIVE_SHARE))) * Hkv if ordered else B * Hkv
    S = choose_splits(pairs, virtual, dev, cfg, sparse=sparse)
    direct = S == 1
    # the unmasked pass of the fast loop: dense calls whose splits span FAST_LOOP_MIN_TILES tiles or more (shapes
    # only: the cache capacity, not the lengths)
    split_tiles = (bool(cfg.fast_loop) and not sparse
                   and math.ceil(math.ceil(virtual / S) / cfg.block_n) >= FAST_LOOP_MIN_TILES)

    new = torch.zeros if ordered else torch.empty  # few live: the rows no program writes read 0
    if cfg.out_bthd:  # (B, H, T, D) view of a (B, T, H, D) buffer: see LaunchConfig.out_bthd
        out = new((B, T, H, D), dtype=q.dtype, device=dev).transpose(1, 2)
    else:
        out = new((B, H, T, D), dtype=q.dtype, device=dev)
    lse = new((B, H, T), dtype=torch.float32, device=dev)
    fused = bool(cfg.fused_combine) and not direct and n_rb == 1
    sem = _semaphores(B * Hkv, dev) if fused else lse  # lse: a dummy, never touched
    if direct:  # the split kernel writes out/lse itself: no partials, no combine
        part_o = part_lse = lse  # dummies, never touched
    else:
        part_o = torch.empty((B * Hkv * S, part_m, D), dtype=torch.float32, device=dev)
        part_lse = torch.empty((B * Hkv * S, part_m), dtype=torch.float32, device=dev)

    score_mode = 0
    scores = raw = None
    rw = rs = part_lse  # dummies
    # dense: the kernel writes every score position itself (0 where no requested row sees it), so
    # the buffer needs no fill; sparse: unselected positions are never visited and must read 0
    alloc = torch.zeros if sparse else torch.empty
    if score_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"score_dtype must be torch.float32 or torch.bfloat16, not {score_dtype}.")
    bits = False
    if tree is not None:
        if tree.shape != (T, T):
            raise ValueError(f"a tree mask for {T} rows is ({T}, {T}), not {tuple(tree.shape)}.")
        if row_weights is not None or row_slots is not None or row_queries is not None:
            raise ValueError("draft-tree rows take no scores; score them with the reference backend.")
        bits = bool(cfg.tree_bits) and T <= 64  # (a tree of more rows: the byte mask)
        tree = tree_bit_rows(tree, dev) if bits else tree.to(device=dev, dtype=torch.int8).contiguous()
    if sink_softmax and row_weights is None:
        raise ValueError("sink_softmax scores need row_weights (the weight of each (head, row)).")
    if row_weights is not None:
        score_mode = 4 if (colsum or sink_softmax) else 1
        scores = alloc((B, Hkv, L), dtype=score_dtype, device=dev)
        rw = row_weights
    elif row_queries is not None:
        score_mode = 3  # n_slots = number of output rows R
        scores = alloc((B, Hkv, n_slots, L), dtype=score_dtype, device=dev)
        rw, rs = row_queries, row_ids
    elif row_slots is not None and n_slots > 0:
        score_mode = 2
        if sparse:  # unvisited positions must read as -inf
            raw = torch.full((B, Hkv, n_slots, L), float("-inf"), dtype=score_dtype, device=dev)
        else:  # the kernel writes every position < lengths + T; the reader masks the rest
            raw = torch.empty((B, Hkv, n_slots, L), dtype=score_dtype, device=dev)
        rs = row_slots
    sink_anchors = cfg.sink_anchors if sink_anchors is None else sink_anchors
    score_store = cfg.score_store if score_store is None else score_store
    if sink_anchors not in ("tile", "pre", "loop"):
        raise ValueError(f"sink_anchors must be 'tile', 'pre' or 'loop', not {sink_anchors!r}.")
    if score_store not in SCORE_STORES:
        raise ValueError(f"score_store must be 'shared', 'direct' or 'lean', not {score_store!r}.")
    anchor_in = score_mode == 4 and bool(sink_softmax) and sink_anchors == "pre" and not direct
    anchor_loop = score_mode == 4 and bool(sink_softmax) and sink_anchors == "loop"
    # "lean" = "direct" + the sink factor folded (w, log2 e out of the loop) + the dense store mask without the
    # redundant compare
    sink_fold = score_mode == 4 and score_store == "lean"
    direct_store = score_mode == 4 and score_store in ("direct", "lean") and dev.type == "cuda"
    fused_softmax = score_mode == 2 and direct and not sparse and softmax_weights is not None
    if fused_softmax:
        scores = torch.empty((B, Hkv, L), dtype=torch.float32, device=dev)  # every position written
        rw = softmax_weights
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    upcast = dev.type != "cuda" and q.dtype == torch.bfloat16
    sink_ref = None
    if anchor_in:  # the anchors once per (sequence, KV head), read by every split program
        sink_ref = torch.empty((B * Hkv, block_m), dtype=torch.float32, device=dev)
        _sink_anchor_kernel[(B * Hkv,)](
            q, k_cache, lengths, sink_ref, float(scale),
            q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            HKV=Hkv, T=T, G=G, D=D, BLOCK_M=block_m, NA=SINK_ANCHORS, DOT_PREC=dot_prec, UPCAST=upcast,
            num_warps=4,
        )

    _splitk_attn_kernel[(slots * Hkv, S, n_rb)](
        q, k_cache, v_cache, lengths, idx, df, rw, rs,
        part_o, part_lse, scores if scores is not None else lse, raw if raw is not None else lse, out, lse,
        float(scale),
        q.stride(0), q.stride(1), q.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        idx.stride(0) if sparse else 0, (idx.stride(1) if idx.shape[1] > 1 else 0) if sparse else 0,
        L, S, kplan, max(n_slots, 1),
        HKV=Hkv, T=T, G=G, D=D, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        SPARSE=sparse, SCORE_MODE=score_mode, DOT_PREC=dot_prec, UPCAST=upcast,
        NOUT=1 if fused_softmax else max(1, n_slots),
        DIRECT_OUT=direct, ZERO_TAIL=(not sparse) and (score_mode in (1, 3, 4) or fused_softmax),
        SCORE_EXP=bool(sink_softmax), NA=SINK_ANCHORS,
        V_EARLY=bool(cfg.v_early), Sem=sem, FUSED_COMBINE=fused, FUSED_SOFTMAX=fused_softmax,
        SinkRef=sink_ref if sink_ref is not None else lse, ANCHOR_IN=anchor_in, DIRECT_STORE=direct_store,
        ANCHOR_LOOP=anchor_loop, SINK_FOLD=sink_fold,
        LOG2_FOLD=bool(cfg.fast_loop), SPLIT_TILES=split_tiles,
        TreeMask=tree if tree is not None else lse, TREE=tree is not None,
        TREE_BITS=bits, PART_M=part_m,
        Order=live_order if ordered else lse, NLive=live_count if ordered else lse, ORDERED=ordered,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(dev),
    )
    if direct or fused:
        return out, lse, scores, raw
    _combine_kernel[(slots * Hkv, T * G)](
        part_o, part_lse, out, lse,
        out.stride(0), out.stride(1), out.stride(2),
        S,
        HKV=Hkv, T=T, G=G, D=D, BLOCK_M=part_m, BLOCK_S=min(32, triton.next_power_of_2(S)),
        Order=live_order if ordered else lse, NLive=live_count if ordered else lse, ORDERED=ordered,
        num_warps=cfg.combine_warps, **pdl_args(dev),
    )
    return out, lse, scores, raw
