"""Vegas presets for ``--method``: ``vegas`` (Collect-2-Query), ``vegas-all``, ``vegas-last`` and the
``quest`` baseline (MagicDec-Quest). Importing this module registers them on
:data:`specdec.registry.METHODS` (the registry imports it the first time one of these names is asked for).

Every preset is self-speculative and lossless: the target drafts over a sparse plan and verifies
with full attention. They share the budget fields of :class:`~specdec.presets.PipelineConfig`;
``options`` are the selector's own fields (e.g. ``{"score_kind": "logits", "per_kv_head": true}``
for the Vegas presets, ``{"page_size": 32}`` for ``quest``): each method's options model is its
selector's config minus the budget fields and the fields the method fixes, so every default lives
in the selector's config.
"""

from __future__ import annotations

from typing import Any

from specdec.presets import PipelineConfig, register_method, selector_options
from specdec.registry import ComponentConfig
from specdec.selectors.quest import QuestConfig
from specdec.selectors.verification_guided import VerificationGuidedConfig

#: method name → (selector name, fixed selector fields)
VEGAS_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "vegas": ("verification_guided", {"rows": "collect2"}),
    "vegas-all": ("verification_guided", {"rows": "all"}),
    "vegas-last": ("verification_guided", {"rows": "last"}),
    "quest": ("quest", {}),
}


#: the options of each method: its selector's own fields (``rows`` is fixed by the method name)
VegasOptions = selector_options(VerificationGuidedConfig, "VegasOptions", exclude={"rows"})
QuestOptions = selector_options(QuestConfig, "QuestOptions")


@register_method("vegas", "Vegas: drafter attends to the top-k of the last verification's scores (Collect-2-Query rows)",
                 options=VegasOptions)
@register_method("vegas-all", "Vegas with scores of all γ+1 verify rows (the paper's full aggregation)",
                 options=VegasOptions)
@register_method("vegas-last", "verification-guided drafting from the last accepted token's scores only (ablation)",
                 options=VegasOptions)
@register_method("quest", "self-speculation, drafter picks pages by Quest's query-aware key bounds (MagicDec-Quest)",
                 options=QuestOptions)
def build_vegas_engine(model, cfg: PipelineConfig, options: ComponentConfig, **kw: Any):
    """A :class:`~specdec.engine.SpeculativeEngine` drafting with the selector of ``cfg.method``."""
    from specdec.drafters import SparseSelfDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.registry import SELECTORS

    selector_name, fixed = VEGAS_METHODS[cfg.method]
    fields = {**cfg.budget_kwargs(), **fixed, **options.model_dump(exclude_unset=True)}
    selector = SELECTORS.build(selector_name, **fields)
    return SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=cfg.gamma, sampling=cfg.sampling,
                             method=cfg.method, **kw)
