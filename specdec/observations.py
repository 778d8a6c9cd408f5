"""Measurements behind Vegas' design choices (used by the benchmark, the docs and the tutorial).

* :func:`row_scores` — per-row, per-layer scores of a block of real tokens in one forward
  (``ScoreRequest(per_row=True)``), the raw material of the two observations below.
* :func:`overlap_vs_distance` — overlap of the top-k sets selected by rows ``t`` and ``t + d``
  as ``d`` grows (the observation behind Collect-2-Query).
* :func:`recall_of_future_rows` — how much of the attention mass of the *next* γ rows a set
  selected from past rows captures: from the last row only (``last``), from rows {t-γ, t}
  (``collect2``) or from all of t-γ..t (``all``) (the aggregated-vs-last-token observation).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.interfaces import ScoreRequest


@torch.no_grad()
def row_scores(model, prefilled, block: Sequence[int], kind: str = "softmax") -> torch.Tensor:
    """Scores of every row of ``block`` over the prompt positions, computed in one forward.

    Args:
        model: :class:`~specdec.models.SpecdecModel`.
        prefilled: :class:`~specdec.engine.Prefilled` of one prompt (``B = 1``), length ``P``.
        block: ``R`` token ids that follow the prompt (e.g. a greedy continuation).
        kind: ``"softmax"`` or ``"logits"``.

    Returns:
        ``(N, H_kv, R, P)`` float32 scores of each layer, KV head (summed over its query heads) and
        row, over the ``P`` prompt positions (the positions every row can see).
    """
    P = prefilled.k.shape[3]
    R = len(block)
    cache = model.new_cache(1, P + R)
    ring = (None, None) if prefilled.ring_k is None else (prefilled.ring_k[:, :1], prefilled.ring_v[:, :1])
    cache.copy_prefix_from(prefilled.k[:, :1], prefilled.v[:, :1], *ring)
    req = ScoreRequest(rows=list(range(R)), kind=kind, heads="group", per_row=True)
    ids = torch.tensor([list(block)], device=model.device)
    model.forward(ids, cache, torch.tensor([P], device=model.device), scores=req, logits_to_keep=1)
    return torch.stack([req.scores[layer][0, :, :, :P] for layer in sorted(req.scores)])


def _topk_mask(s: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` largest entries along the last dimension."""
    idx = torch.topk(s, k, dim=-1).indices
    return torch.zeros_like(s, dtype=torch.bool).scatter_(-1, idx, True)


def overlap_vs_distance(scores: torch.Tensor, k: int, max_distance: int, per_kv_head: bool = False) -> dict[int, float]:
    """Mean ``|S_t ∩ S_{t+d}| / k`` over rows ``t`` and layers (and KV heads), for ``d = 1..max_distance``.

    Args:
        scores: ``(N, H_kv, R, P)`` from :func:`row_scores`.
        k: size of each top-k set.
        per_kv_head: one set per KV head (else per layer, heads summed).
    """
    s = scores if per_kv_head else scores.sum(dim=1, keepdim=True)
    sel = _topk_mask(s, k).float()  # (N, H', R, P)
    R = s.shape[2]
    out = {}
    for d in range(1, min(max_distance, R - 1) + 1):
        inter = (sel[:, :, :-d] * sel[:, :, d:]).sum(-1)  # (N, H', R - d)
        out[d] = float(inter.mean() / k)
    return out


def recall_of_future_rows(
    scores: torch.Tensor, k: int, gamma: int, per_kv_head: bool = False
) -> dict[str, float]:
    """Share of the next γ rows' attention captured by sets chosen from past rows.

    For each anchor ``t`` (``γ <= t < R - γ``) a set of ``k`` positions is chosen from the
    aggregated scores of rows ``{t}`` (``last``), ``{t-γ, t}`` (``collect2``) or ``t-γ..t``
    (``all``), and scored by the softmax mass that rows ``t+1..t+γ`` put on it (``scores`` must be
    softmax weights). ``oracle`` chooses with the future rows themselves (the upper bound).

    Returns:
        ``{mode: mean recall}`` over anchors, layers (and KV heads).
    """
    s = scores if per_kv_head else scores.sum(dim=1, keepdim=True)  # (N, H', R, P)
    R = s.shape[2]
    acc: dict[str, list[torch.Tensor]] = {m: [] for m in ("last", "collect2", "all", "oracle")}
    for t in range(gamma, R - gamma):
        future = s[:, :, t + 1 : t + 1 + gamma].sum(2)  # (N, H', P)
        total = future.sum(-1).clamp(min=1e-12)
        srcs = {
            "last": s[:, :, t],
            "collect2": s[:, :, t - gamma] + s[:, :, t],
            "all": s[:, :, t - gamma : t + 1].sum(2),
            "oracle": future,
        }
        for m, src in srcs.items():
            acc[m].append(((future * _topk_mask(src, k)).sum(-1) / total).mean())
    return {m: float(torch.stack(v).mean()) if v else float("nan") for m, v in acc.items()}
