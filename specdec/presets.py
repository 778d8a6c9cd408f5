"""Named methods (``--method``): one registry maps a name to a drafter/verifier/selector pipeline.

A method is a builder ``(model, PipelineConfig, options, **engine_kw) -> SpeculativeEngine`` registered
on :data:`specdec.registry.METHODS` with :func:`register_method`, together with its options model (the
pydantic model that validates ``PipelineConfig.options``; unknown options list the known ones).
Built-ins: ``dense`` (plain autoregressive decoding on the same engine) and ``magicdec``
(self-speculation with a sinks + sliding-window drafter) here; Vegas, Quest and Dustin in their own
modules (:mod:`specdec.vegas`, :mod:`specdec.dustin`), imported the first time one of their names is
asked for. A plugin package adds a whole method through the entry-point group ``specdec.methods``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import Field, ValidationError, create_model

from specdec.adaptive import ADAPTIVE_DEFAULT
from specdec.errors import SpecdecError
from specdec.registry import METHODS, ComponentConfig, format_validation_error
from specdec.sampling import SamplingConfig
from specdec.selectors.base import BudgetConfig


class PipelineConfig(BudgetConfig):
    """Everything ``specdec generate`` needs besides the model and the prompt.

    The budget fields (``budget``, ``budget_ratio``, ``min_budget``, ``sinks``, ``recent``) and their
    rule (exactly one budget; ``budget_ratio`` 0.05 when neither is given) are
    :class:`~specdec.selectors.base.BudgetConfig`'s: ``budget`` counts every KV entry a sparse attention
    step sees (sinks + recent + selected), the same meaning for every method. ``options`` are the
    method's own fields, validated by its options model (``specdec methods`` lists them).
    """

    method: str = "magicdec"
    gamma: int = Field(default=4, ge=1, le=64, description="draft length γ")
    sampling: SamplingConfig = SamplingConfig()
    adaptive: bool = Field(default=ADAPTIVE_DEFAULT, description="adaptive γ per iteration and dense fall-back (specdec.adaptive); default: specdec.adaptive.ADAPTIVE_DEFAULT")
    options: dict[str, Any] = Field(default_factory=dict, description="method-specific options")

    def budget_config(self) -> BudgetConfig:
        """The budget part, as the :class:`~specdec.selectors.base.BudgetConfig` every selector takes."""
        return BudgetConfig(**self.budget_kwargs())

    def budget_kwargs(self) -> dict[str, Any]:
        """The budget fields given to this config, as keyword arguments (for a selector config that extends
        ``BudgetConfig``): the others keep the selector config's defaults, the same values, so its rules read
        "given" as the user gave it (explicit sinks + recent must fit an explicit budget; defaults shrink)."""
        return {name: getattr(self, name) for name in BudgetConfig.model_fields if name in self.model_fields_set}

    @classmethod
    def make(cls, **kw: Any) -> "PipelineConfig":
        """Build with one-line errors naming the bad field."""
        try:
            return cls(**kw)
        except ValidationError as exc:
            raise SpecdecError(format_validation_error("pipeline config", exc, cls)) from None


class NoOptions(ComponentConfig):
    """Options model of a method that takes none (``dense``, ``magicdec``)."""


def selector_options(config_cls: type[ComponentConfig], name: str, exclude: Any = (), include: Any = None,
                     base: type[ComponentConfig] = ComponentConfig) -> type[ComponentConfig]:
    """An options model made of a selector config's own fields (their types, defaults and rules stay in
    that config, written once): the budget fields (they live on :class:`PipelineConfig`) and ``exclude``
    are left out; ``include`` keeps only those names."""
    skip = set(BudgetConfig.model_fields) | set(exclude)
    fields = {n: (f.annotation, f) for n, f in config_cls.model_fields.items()
              if n not in skip and (include is None or n in include)}
    return create_model(name, __base__=base, **fields)  # type: ignore[call-overload]


Builder = Callable[..., Any]


@dataclass(frozen=True)
class MethodSpec:
    """A named method: its builder ``(model, PipelineConfig, options, **engine_kw) -> SpeculativeEngine``,
    its options model and what it promises."""

    name: str
    build: Builder
    options: type[ComponentConfig]
    description: str
    lossless: bool = True


def register_method(
    name: str, description: str, lossless: bool = True, options: type[ComponentConfig] = NoOptions
) -> Callable[[Builder], Builder]:
    """Decorator registering ``builder(model, cfg, options, **engine_kw)`` under ``name`` on
    :data:`~specdec.registry.METHODS` (see the ``magicdec`` preset below). One builder may serve several
    names (it receives ``cfg.method``)."""

    def deco(fn: Builder) -> Builder:
        specs = dict(getattr(fn, "methods", {}))
        specs[name] = MethodSpec(name, fn, options, description, lossless)
        fn.methods = specs  # type: ignore[attr-defined]
        fn.Config = options  # type: ignore[attr-defined] - what an entry-point loader looks for
        METHODS.register(name, options)(fn)
        return fn

    return deco


def method_names() -> list[str]:
    """Registered methods (built-in, lazy built-in and entry-point plugins)."""
    return METHODS.names()


def get_method(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``name``; an unknown name raises an error listing the known ones."""
    entry = METHODS.get(name)
    spec = getattr(entry.cls, "methods", {}).get(name)
    if spec is None:  # an entry-point builder that was not decorated: its attributes describe it
        doc = (entry.cls.__doc__ or name).strip().splitlines()[0]
        spec = MethodSpec(name, entry.cls, entry.config_cls, getattr(entry.cls, "description", doc),
                          getattr(entry.cls, "lossless", True))
    return spec


def method_options(cfg: PipelineConfig) -> ComponentConfig:
    """``cfg.options`` validated by the method's options model (one line naming the bad option)."""
    spec = get_method(cfg.method)
    try:
        return spec.options(**cfg.options)
    except ValidationError as exc:
        raise SpecdecError(format_validation_error(f"{cfg.method} option", exc, spec.options)
                           .replace(f"{cfg.method} option: unknown field", f"unknown {cfg.method} option")) from None


def build_engine(model, config: PipelineConfig, **engine_kw: Any):
    """Build the :class:`~specdec.engine.SpeculativeEngine` of ``config.method`` on ``model``."""
    spec = get_method(config.method)
    engine = spec.build(model, config, method_options(config), **engine_kw)
    # ``adaptive=`` here wins over the pipeline's setting; set after the build, so it holds for every method (a
    # plugin's builder too, even one that does not pass ``**engine_kw`` on to the engine)
    wanted = engine_kw.get("adaptive")
    engine.adaptive = config.adaptive if wanted is None else wanted
    return engine


@register_method("dense", "plain autoregressive decoding on the specdec engine")
def dense(model, cfg: PipelineConfig, options: NoOptions, **kw: Any):
    from specdec.engine import SpeculativeEngine

    return SpeculativeEngine(model, None, gamma=cfg.gamma, sampling=cfg.sampling, method="dense", **kw)


@register_method("magicdec", "self-speculation, drafter sees sinks + a sliding window (MagicDec-Stream / StreamingLLM)")
def magicdec(model, cfg: PipelineConfig, options: NoOptions, **kw: Any):
    from specdec.drafters import SparseSelfDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.registry import SELECTORS

    selector = SELECTORS.build("sliding_window", cfg.budget_config())
    return SpeculativeEngine(
        model, SparseSelfDrafter(model, selector), gamma=cfg.gamma, sampling=cfg.sampling, method="magicdec", **kw
    )
