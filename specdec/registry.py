"""Registries map a name to ``(class, pydantic config class)``: selectors, backends and methods.

Unknown names are an error that lists the known ones. Plugins register through entry points,
loaded lazily the first time a name is looked up: ``specdec.selectors`` and ``specdec.backends``
(value ``"package.module:Class"``; the class carries its config class as ``Config``) and
``specdec.methods`` (value ``"package.module:builder"``, a function decorated with
:func:`specdec.presets.register_method`, which carries its options model as ``Config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module, metadata
from typing import Any, Callable, Generic, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from specdec.errors import SpecdecError

T = TypeVar("T")


class ComponentConfig(BaseModel):
    """Base of every component config: frozen, no unknown fields, finite floats, booleans are not numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _bool_is_not_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """``"gamma": true`` would silently become 1: a boolean is accepted only where the field takes one."""
        if isinstance(value, bool):
            ann = cls.model_fields[info.field_name].annotation
            if ann is not bool and bool not in get_args(ann) and ann is not Any:
                raise ValueError(f"must be a number, not a boolean ({str(value).lower()})")
        return value


def format_validation_error(where: str, exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One sentence naming the first bad field and what it needs (an unknown field lists the known ones)."""
    err = exc.errors()[0]
    msg = err.get("msg", "is invalid")
    msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg.lower()
    field = ".".join(str(p) for p in err.get("loc", ()))
    if err.get("type") == "extra_forbidden" and model is not None:
        known = ", ".join(sorted(model.model_fields)) or "none"
        return f"{where}: unknown field '{field}'; known: {known}."
    if not field:  # a rule over several fields: the input is the whole config, the message names the fields
        return f"{where}: {msg.rstrip('.')}."
    return f"{where}: field '{field}' {msg} (got {err.get('input')!r})."


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered component: its name, class and config class."""

    name: str
    cls: type[T]
    config_cls: type[ComponentConfig]


class Registry(Generic[T]):
    """Name → (class, config class), with an optional entry-point group for plugins."""

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.group = entry_point_group
        self._entries: dict[str, Entry[T]] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attr" for built-ins imported on demand
        self._plugins_loaded = False

    def register(self, name: str, config_cls: type[ComponentConfig] | None = None) -> Callable[[type[T]], type[T]]:
        """Class decorator: ``@SELECTORS.register("quest", QuestConfig)``."""

        def deco(cls: type[T]) -> type[T]:
            cfg = config_cls or getattr(cls, "Config", None)
            if cfg is None:
                raise TypeError(f"{cls.__name__} needs a config class (argument or `Config` attribute)")
            self._entries[name] = Entry(name, cls, cfg)
            return cls

        return deco

    def add_lazy(self, name: str, target: str) -> None:
        """Register a built-in by import path so the registry imports it only when used."""
        self._lazy[name] = target

    def _load_plugins(self) -> None:
        if self._plugins_loaded or self.group is None:
            return
        self._plugins_loaded = True
        for ep in metadata.entry_points(group=self.group):
            if ep.name in self._entries:
                continue
            cls = ep.load()
            if ep.name in self._entries:  # the module registered itself on import (a decorator)
                continue
            cfg = getattr(cls, "Config", None)
            if cfg is None:
                raise SpecdecError(f"plugin {ep.name!r} ({ep.value}) has no `Config` class attribute; add one.")
            self._entries[ep.name] = Entry(ep.name, cls, cfg)

    def names(self) -> list[str]:
        """Registered names, lazy built-ins whose module exists, and entry-point plugins."""
        import importlib.util

        self._load_plugins()
        lazy = {n for n, t in self._lazy.items() if importlib.util.find_spec(t.partition(":")[0]) is not None}
        return sorted(set(self._entries) | lazy)

    def get(self, name: str) -> Entry[T]:
        """The entry of ``name`` (importing a lazy built-in or loading plugins if needed)."""
        if name not in self._entries and name in self._lazy and name in self.names():
            mod, _, attr = self._lazy[name].partition(":")
            getattr(import_module(mod), attr)  # importing runs the module's @register decorator
        if name not in self._entries:
            self._load_plugins()
        if name not in self._entries:
            raise SpecdecError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}.")
        return self._entries[name]

    def config(self, name: str, **params: Any) -> ComponentConfig:
        """Validate ``params`` into ``name``'s config class (one-line error naming the bad field)."""
        entry = self.get(name)
        try:
            return entry.config_cls(**params)
        except ValidationError as exc:
            raise SpecdecError(format_validation_error(f"{self.kind} {name!r}", exc, entry.config_cls)) from None

    def build(self, name: str, config: ComponentConfig | None = None, **params: Any) -> T:
        """Instantiate ``name`` from a config object or keyword parameters."""
        entry = self.get(name)
        cfg = config if config is not None else self.config(name, **params)
        return entry.cls(cfg)  # type: ignore[call-arg]


SELECTORS: Registry = Registry("selector", "specdec.selectors")
BACKENDS: Registry = Registry("backend", "specdec.backends")
#: named pipelines (``--method``): builder functions ``(model, PipelineConfig, options, **engine_kw)``
#: with their options model; see :func:`specdec.presets.register_method`
METHODS: Registry = Registry("method", "specdec.methods")

SELECTORS.add_lazy("sliding_window", "specdec.selectors.sliding_window:SlidingWindow")
SELECTORS.add_lazy("verification_guided", "specdec.selectors.verification_guided:VerificationGuidedSelector")
SELECTORS.add_lazy("collect2", "specdec.selectors.verification_guided:Collect2Query")
SELECTORS.add_lazy("quest", "specdec.selectors.quest:Quest")
SELECTORS.add_lazy("hybrid_srh", "specdec.selectors.hybrid_srh:HybridSRHSelector")
BACKENDS.add_lazy("reference", "specdec.attention.reference:ReferenceBackend")
BACKENDS.add_lazy("torch", "specdec.attention.torch_backend:TorchBackend")
BACKENDS.add_lazy("numba", "specdec.attention.numba_backend:NumbaBackend")
BACKENDS.add_lazy("triton", "specdec.cuda.triton_backend:TritonBackend")
METHODS.add_lazy("dense", "specdec.presets:dense")
METHODS.add_lazy("magicdec", "specdec.presets:magicdec")
for _name in ("vegas", "vegas-all", "vegas-last", "quest"):
    METHODS.add_lazy(_name, "specdec.vegas:build_vegas_engine")
for _name in ("dustin", "dustin-adaptive"):
    METHODS.add_lazy(_name, "specdec.dustin:build_dustin")
