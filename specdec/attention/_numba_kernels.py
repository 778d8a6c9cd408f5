"""The numba kernel of :mod:`specdec.attention.numba_backend` (imported only when that backend is built).

Module-level so numba's on-disk cache (``cache=True``) keeps the compiled code between processes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_FM = {"reassoc", "contract", "arcp"}  # vectorise the reductions; keep inf/nan semantics


@njit(inline="always", fastmath=_FM)
def _gather(src, b, h, pos, nb, bf16, fdst, udst):
    """Rows ``src[b, h, pos[:nb], :]`` into the contiguous block ``fdst`` (float32; bf16 bits widened
    exactly through ``udst``, the uint32 view of the same buffer)."""
    D = fdst.shape[1]
    if bf16:
        for j in range(nb):
            p = pos[j]
            for d in range(D):
                udst[j, d] = np.uint32(src[b, h, p, d]) << np.uint32(16)
    else:
        for j in range(nb):
            p = pos[j]
            for d in range(D):
                fdst[j, d] = src[b, h, p, d]


@njit(inline="always", fastmath=_FM)
def _attend(q, k, v, lengths, dense_from, plan, out, scale, bf16, n_splits, block):
    """q ``(B, H, T, D)`` f32; k/v ``(B, Hkv, L, D)`` f32 or uint16 (bf16 bits); plan ``(B, Hp, K)``
    int64 (``K`` may be 0); out ``(B, H, T, D)`` f32, written. Inlined into the two entry points:
    the ``prange`` loops run in parallel in :func:`attend_parallel` and serially in :func:`attend_serial`."""
    B, H, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = H // Hkv
    R = G * T
    Hp, K = plan.shape[1], plan.shape[2]
    S = n_splits
    W = B * Hkv

    # 1. filter each (sequence, KV head)'s plan: drop padding / out of range / tail / duplicates
    lst = np.empty((W, max(K, 1)), dtype=np.int64)
    cnt = np.zeros(W, dtype=np.int64)
    if K > 0:
        for w in prange(W):
            b = w // Hkv
            h = w % Hkv
            hp = h if Hp > 1 else 0
            df = dense_from[b]
            seen = np.zeros(L, dtype=np.bool_)
            n = 0
            for i in range(K):
                p = plan[b, hp, i]
                if p >= 0 and p < L and p < df and not seen[p]:
                    seen[p] = True
                    lst[w, n] = p
                    n += 1
            cnt[w] = n

    # 2. split-K partials over the virtual list (filtered plan, then the dense tail)
    pm = np.empty((W, S, R), dtype=np.float32)
    pl = np.empty((W, S, R), dtype=np.float32)
    pacc = np.empty((W, S, R, D), dtype=np.float32)
    for ws in prange(W * S):
        w = ws // S
        s = ws % S
        b = w // Hkv
        h = w % Hkv
        lb = lengths[b]
        end = min(lb + T, L)  # positions < end can be visible to some row
        t0 = max(dense_from[b], 0)
        c = cnt[w]
        n_all = c + max(end - t0, 0)
        chunk = (n_all + S - 1) // S
        j0 = s * chunk
        j1 = min(n_all, j0 + chunk)

        qs = np.empty((R, D), dtype=np.float32)  # scaled queries of the group's rows, row r = g*T + t
        lim = np.empty(R, dtype=np.int64)  # last position row r sees
        for r in range(R):
            g = r // T
            t = r - g * T
            lim[r] = lb + t
            for d in range(D):
                qs[r, d] = q[b, h * G + g, t, d] * scale
        m = np.full(R, -np.inf, dtype=np.float32)
        l = np.zeros(R, dtype=np.float32)
        acc = np.zeros((R, D), dtype=np.float32)
        sc = np.empty((R, block), dtype=np.float32)
        pos = np.empty(block, dtype=np.int64)
        ubuf = np.empty((block, D), dtype=np.uint32)
        buf = ubuf.view(np.float32)

        for jb in range(j0, j1, block):
            nb = min(block, j1 - jb)
            for j in range(nb):
                jj = jb + j
                pos[j] = lst[w, jj] if jj < c else t0 + (jj - c)
            _gather(k, b, h, pos, nb, bf16, buf, ubuf)
            for r in range(R):
                lr = lim[r]
                mb = m[r]
                for j in range(nb):
                    if pos[j] <= lr:
                        x = np.float32(0.0)
                        for d in range(D):
                            x += qs[r, d] * buf[j, d]
                        sc[r, j] = x
                        if x > mb:
                            mb = x
                    else:
                        sc[r, j] = -np.inf
                if mb == -np.inf:  # nothing visible to this row in the block
                    for j in range(nb):
                        sc[r, j] = 0.0
                    continue
                alpha = np.float32(math.exp(m[r] - mb)) if m[r] != -np.inf else np.float32(0.0)
                tot = np.float32(0.0)
                for j in range(nb):
                    e = np.float32(math.exp(sc[r, j] - mb)) if sc[r, j] != -np.inf else np.float32(0.0)
                    sc[r, j] = e
                    tot += e
                l[r] = l[r] * alpha + tot
                m[r] = mb
                if alpha != 1.0:
                    for d in range(D):
                        acc[r, d] *= alpha
            _gather(v, b, h, pos, nb, bf16, buf, ubuf)
            for r in range(R):
                for j in range(nb):
                    pr = sc[r, j]
                    if pr != 0.0:
                        for d in range(D):
                            acc[r, d] += pr * buf[j, d]
        for r in range(R):
            pm[w, s, r] = m[r]
            pl[w, s, r] = l[r]
            for d in range(D):
                pacc[w, s, r, d] = acc[r, d]

    # 3. combine the chunks by log-sum-exp; a row that sees nothing gives 0 (as the reference)
    for wr in prange(W * R):
        w = wr // R
        r = wr % R
        b = w // Hkv
        h = w % Hkv
        g = r // T
        t = r % T
        hq = h * G + g
        mx = -np.inf
        for s in range(S):
            if pm[w, s, r] > mx:
                mx = pm[w, s, r]
        for d in range(D):
            out[b, hq, t, d] = 0.0
        if mx == -np.inf:
            continue
        den = 0.0
        for s in range(S):
            if pm[w, s, r] == -np.inf:
                continue
            f = math.exp(pm[w, s, r] - mx)
            den += f * pl[w, s, r]
            for d in range(D):
                out[b, hq, t, d] += f * pacc[w, s, r, d]
        inv = 1.0 / den
        for d in range(D):
            out[b, hq, t, d] *= inv


@njit(parallel=True, fastmath=_FM, cache=True)
def attend_parallel(q, k, v, lengths, dense_from, plan, out, scale, bf16, n_splits, block):
    """The kernel on numba's thread pool (``numba.set_num_threads`` threads)."""
    _attend(q, k, v, lengths, dense_from, plan, out, scale, bf16, n_splits, block)


@njit(fastmath=_FM, cache=True)
def attend_serial(q, k, v, lengths, dense_from, plan, out, scale, bf16, n_splits, block):
    """The kernel in the calling thread (no thread-pool launch: one thread, or a loaded machine)."""
    _attend(q, k, v, lengths, dense_from, plan, out, scale, bf16, n_splits, block)
