"""Named methods (``--method``): one place maps a name to a drafter/verifier/selector pipeline.

Each preset is a function ``(model, PipelineConfig) -> SpeculativeEngine`` registered with
:func:`register_method`. Built-ins: ``dense`` (plain autoregressive decoding on the same engine)
and ``magicdec`` (self-speculation with a sinks + sliding-window drafter). Vegas, Quest and
Dustin add theirs from their own modules (lazy entries below).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Callable

from pydantic import Field, ValidationError, model_validator

from specdec.errors import SpecdecError
from specdec.registry import ComponentConfig, format_validation_error
from specdec.sampling import SamplingConfig


class PipelineConfig(ComponentConfig):
    """Everything ``specdec generate`` needs besides the model and the prompt.

    ``budget`` counts every KV entry a sparse attention step sees (sinks + recent + selected),
    the same meaning for every method; ``budget_ratio`` is that budget as a share of the context.
    """

    method: str = "magicdec"
    gamma: int = Field(default=4, ge=1, le=64, description="draft length γ")
    budget: int | None = Field(default=None, gt=0)
    budget_ratio: float | None = Field(default=None, gt=0, le=1)
    min_budget: int = Field(default=0, ge=0)
    sinks: int = Field(default=4, ge=0)
    recent: int = Field(default=16, ge=0)
    sampling: SamplingConfig = SamplingConfig()
    adaptive: bool = Field(default=True, description="adaptive γ per iteration and dense fall-back (specdec.adaptive)")
    options: dict[str, Any] = Field(default_factory=dict, description="method-specific options")

    @model_validator(mode="after")
    def _one_budget(self):
        if self.budget is not None and self.budget_ratio is not None:
            raise ValueError("set either budget or budget_ratio, not both")
        if self.budget is not None and {"sinks", "recent"} & self.model_fields_set and self.sinks + self.recent > self.budget:
            raise ValueError(f"sinks {self.sinks} + recent {self.recent} exceed the budget {self.budget}; "
                             f"use sinks + recent <= budget")
        return self

    def budget_kwargs(self) -> dict[str, Any]:
        """The budget fields every :class:`~specdec.selectors.base.BudgetConfig` takes."""
        kw: dict[str, Any] = dict(sinks=self.sinks, recent=self.recent, min_budget=self.min_budget)
        if self.budget is not None:
            kw["budget"] = self.budget
        else:
            kw["budget_ratio"] = self.budget_ratio if self.budget_ratio is not None else 0.05
        return kw

    @classmethod
    def make(cls, **kw: Any) -> "PipelineConfig":
        """Build with one-line errors naming the bad field."""
        try:
            return cls(**kw)
        except ValidationError as exc:
            raise SpecdecError(format_validation_error("pipeline config", exc)) from None


Builder = Callable[..., Any]


@dataclass(frozen=True)
class MethodSpec:
    """A named method: its builder ``(model, PipelineConfig, **engine_kw) -> SpeculativeEngine``."""

    name: str
    build: Builder
    description: str
    lossless: bool = True


_METHODS: dict[str, MethodSpec] = {}
_LAZY: dict[str, str] = {
    # name -> module that registers it on import
    "vegas": "specdec.vegas",
    "vegas-all": "specdec.vegas",
    "vegas-last": "specdec.vegas",
    "quest": "specdec.vegas",
    "dustin": "specdec.dustin",
    "dustin-adaptive": "specdec.dustin",
}


def register_method(name: str, description: str, lossless: bool = True) -> Callable[[Builder], Builder]:
    """Decorator registering a preset builder under ``name`` (see the ``magicdec`` preset below)."""
    def deco(fn: Builder) -> Builder:
        _METHODS[name] = MethodSpec(name, fn, description, lossless)
        return fn

    return deco


def add_lazy_method(name: str, module: str) -> None:
    """Declare that importing ``module`` registers method ``name`` (imported on first use)."""
    _LAZY[name] = module


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def method_names() -> list[str]:
    """Registered methods plus lazy ones whose module exists."""
    return sorted(set(_METHODS) | {n for n, mod in _LAZY.items() if _importable(mod)})


def get_method(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``name``; an unknown name raises an error listing the known ones."""
    if name not in _METHODS and name in _LAZY and _importable(_LAZY[name]):
        import_module(_LAZY[name])
    if name not in _METHODS:
        raise SpecdecError(f"unknown method {name!r}; known: {', '.join(method_names())}.")
    return _METHODS[name]


def build_engine(model, config: PipelineConfig, **engine_kw: Any):
    """Build the :class:`~specdec.engine.SpeculativeEngine` of ``config.method`` on ``model``."""
    engine = get_method(config.method).build(model, config, **engine_kw)
    if "adaptive" not in engine_kw:
        engine.adaptive = config.adaptive
    return engine


@register_method("dense", "plain autoregressive decoding on the specdec engine")
def _dense(model, cfg: PipelineConfig, **kw: Any):
    from specdec.engine import SpeculativeEngine

    return SpeculativeEngine(model, None, gamma=cfg.gamma, sampling=cfg.sampling, method="dense", **kw)


@register_method("magicdec", "self-speculation, drafter sees sinks + a sliding window (MagicDec-Stream / StreamingLLM)")
def _magicdec(model, cfg: PipelineConfig, **kw: Any):
    from specdec.drafters import SparseSelfDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.registry import SELECTORS

    selector = SELECTORS.build("sliding_window", **cfg.budget_kwargs(), **cfg.options)
    return SpeculativeEngine(
        model, SparseSelfDrafter(model, selector), gamma=cfg.gamma, sampling=cfg.sampling, method="magicdec", **kw
    )
