"""A layer-skipping draft with a trained adapter: the target's first ``k`` layers, the adapter, its last ``t``.

Built from an artifact of ``specdec train-draft`` (:mod:`specdec.train_draft`); the embedded model's
draft ships in ``specdec/draft_weights`` (Dustin's ``draft=skip``; its default there is the shipped EAGLE head).
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from specdec.drafters import EarlyExitDrafter, TruncatedModel
from specdec.errors import SpecdecError
from specdec.models import SpecdecModel, model_dims


def skip_model(model: SpecdecModel, k: int, t: int, adapter: nn.Module) -> TruncatedModel:
    """A view of ``model`` running ``layers[:k]``, ``adapter``, ``layers[N-t:]``, the final norm and the LM head.

    Weights are shared; each target layer keeps its ``layer_idx``, so the view reads and writes the
    target's cache at the target's layer numbers.
    """
    N = model.dims.n_layers
    if not (k >= 1 and t >= 1 and k + t < N):
        raise SpecdecError(f"a skip draft needs 1 <= k, 1 <= t and k + t < {N} layers (got k={k}, t={t}); "
                           "retrain it for this target with `specdec train-draft`.")
    hf = model.hf
    base_name = hf.base_model_prefix
    base = getattr(hf, base_name)
    cfg = copy.deepcopy(hf.config)
    layers = list(base.layers)
    cfg.num_hidden_layers = k + 1 + t
    if isinstance(getattr(cfg, "layer_types", None), list):
        lt = cfg.layer_types
        cfg.layer_types = lt[:k] + [lt[k - 1]] + lt[N - t:]
    inner = copy.copy(base)
    inner._modules = dict(base._modules)
    inner._modules["layers"] = nn.ModuleList(layers[:k] + [adapter] + layers[N - t:])
    inner.config = cfg
    outer = copy.copy(hf)
    outer._modules = dict(hf._modules)
    outer._modules[base_name] = inner
    outer.config = cfg
    return TruncatedModel(model, outer, model_dims(cfg))


class SkipLayerDrafter(EarlyExitDrafter):
    """Draft with ``layers[:k]`` + a trained adapter + ``layers[N-t:]`` of the target (weights shared).

    Layer skipping as in Draft & Verify / SWIFT, with a Kangaroo-style adapter trained by
    ``specdec train-draft``. Like :class:`EarlyExitDrafter` the draft lives in the **target's cache**:
    its first ``k`` layers compute exactly what the target computes, and its last ``t`` layers attend to
    the target's own K/V of the verified context. Draft rows are overwritten by the verification.
    Retrieval heads of the lookahead signal are taken from the first ``k`` layers (:attr:`n_layers` = k).

    Args:
        target: the target :class:`SpecdecModel`.
        path: a ``train-draft`` artifact trained for this target (its identity is checked).
        heads: draft retrieval heads ``{layer < k: [query heads]}``.
    """

    def __init__(self, target: SpecdecModel, path: str | Path, heads: dict[int, list[int]] | None = None) -> None:
        from specdec.train_draft import build_adapter

        meta, adapter = build_adapter(target, path)
        k, t = int(meta["k"]), int(meta["t"])
        self.draft_model = skip_model(target, k, t, adapter)
        self.heads = heads
        self.lookahead = None
        self.cache = None
        self.draft_len = None
        self.target = target
        self.exit_layers = k
        self.tail_layers = t
        self.adapter = adapter
        self.path = Path(path)

    @property
    def n_layers(self) -> int:
        """Layers whose heads may give the lookahead signal: the global (full-context) layers among the
        shared leading ``k`` (all ``k`` on a model without sliding-window layers)."""
        return sum(1 for layer in self.target.dims.global_layers if layer < self.exit_layers)

    def identity(self) -> dict:
        from specdec.artifacts import model_identity

        return {**model_identity(self.target), "early_exit_layers": self.exit_layers, "skip_tail_layers": self.tail_layers}

    def _draft_cache(self, state):
        """The target's cache itself: every layer the draft runs is a target layer at its own index."""
        return state.cache
