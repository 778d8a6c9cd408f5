"""Vegas presets for ``--method``: ``vegas`` (Collect-2-Query), ``vegas-all``, ``vegas-last`` and the
``quest`` baseline (MagicDec-Quest). Importing this module registers them (the presets module
imports it lazily the first time one of these names is asked for).

Every preset is self-speculative and lossless: the target drafts over a sparse plan and verifies
with full attention. They share the budget fields of :class:`~specdec.presets.PipelineConfig`;
``options`` passes selector-specific fields (e.g. ``{"score_kind": "logits", "per_kv_head": true}``
for the Vegas presets, ``{"page_size": 32}`` for ``quest``).
"""

from __future__ import annotations

from typing import Any

from specdec.presets import PipelineConfig, register_method

#: method name → (selector name, fixed selector fields)
VEGAS_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "vegas": ("verification_guided", {"rows": "collect2"}),
    "vegas-all": ("verification_guided", {"rows": "all"}),
    "vegas-last": ("verification_guided", {"rows": "last"}),
    "quest": ("quest", {}),
}


def build_vegas_engine(model, cfg: PipelineConfig, method: str, **kw: Any):
    """A :class:`~specdec.engine.SpeculativeEngine` drafting with the selector of ``method``."""
    from specdec.drafters import SparseSelfDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.errors import SpecdecError
    from specdec.registry import SELECTORS

    selector_name, fixed = VEGAS_METHODS[method]
    clash = sorted(set(fixed) & set(cfg.options))
    if clash:
        raise SpecdecError(f"option {clash[0]!r} is fixed by method {method!r}; pick another method instead.")
    selector = SELECTORS.build(selector_name, **cfg.budget_kwargs(), **fixed, **cfg.options)
    return SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=cfg.gamma, sampling=cfg.sampling,
                             method=method, **kw)


@register_method("vegas", "Vegas: drafter attends to the top-k of the last verification's scores (Collect-2-Query rows)")
def _vegas(model, cfg: PipelineConfig, **kw: Any):
    return build_vegas_engine(model, cfg, "vegas", **kw)


@register_method("vegas-all", "Vegas with scores of all γ+1 verify rows (the paper's full aggregation)")
def _vegas_all(model, cfg: PipelineConfig, **kw: Any):
    return build_vegas_engine(model, cfg, "vegas-all", **kw)


@register_method("vegas-last", "verification-guided drafting from the last accepted token's scores only (ablation)")
def _vegas_last(model, cfg: PipelineConfig, **kw: Any):
    return build_vegas_engine(model, cfg, "vegas-last", **kw)


@register_method("quest", "self-speculation, drafter picks pages by Quest's query-aware key bounds (MagicDec-Quest)")
def _quest(model, cfg: PipelineConfig, **kw: Any):
    return build_vegas_engine(model, cfg, "quest", **kw)
