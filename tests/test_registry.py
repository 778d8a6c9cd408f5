"""Registries: unknown names list the known ones; plugins register through entry points."""

from importlib import metadata

import pytest
import torch

from specdec import SELECTORS, BudgetSelector
from specdec.errors import SpecdecError
from specdec.registry import ComponentConfig, Registry


class KeyNormSelector(BudgetSelector):
    """A plugin selector that only scores tokens (kvpress' KnormPress idea): low key norm = important."""

    def score(self, cache, lengths):
        L = int(lengths.max())
        return -cache.k[:, :, :, :L].float().norm(dim=-1).mean(dim=0, keepdim=True)  # (1, B, H_kv, L)


def test_unknown_name_lists_known_ones():
    with pytest.raises(SpecdecError, match="known: .*sliding_window"):
        SELECTORS.get("does-not-exist")


def test_entry_point_plugin_is_found(monkeypatch):
    reg = Registry("selector", "specdec.selectors")
    ep = metadata.EntryPoint(name="keynorm", value=f"{__name__}:KeyNormSelector", group="specdec.selectors")
    real = metadata.entry_points

    def fake(**kw):
        return [ep] if kw.get("group") == "specdec.selectors" else real(**kw)

    monkeypatch.setattr(metadata, "entry_points", fake)
    assert "keynorm" in reg.names()
    sel = reg.build("keynorm", budget=8, sinks=1, recent=2)
    assert isinstance(sel, KeyNormSelector)
    from specdec.cache import KVCache

    cache = KVCache(2, 1, 2, 32, 4)
    cache.k.normal_()
    plan = sel.plan(cache, torch.tensor([20]))
    assert int((plan.indices >= 0).sum(-1).max()) == 8


def test_config_errors_name_the_field():
    with pytest.raises(SpecdecError, match="budget_ratio"):
        SELECTORS.build("sliding_window", budget_ratio=1.5)
    with pytest.raises(SpecdecError, match="extra|not permitted|sink"):
        SELECTORS.build("sliding_window", sink=3)


class _PlugOptions(ComponentConfig):
    gamma_bonus: int = 0


def plug_method(model, cfg, options, **kw):
    """self-speculation from a plugin package (a whole method through an entry point)"""
    from specdec import SparseSelfDrafter, SpeculativeEngine

    selector = SELECTORS.build("sliding_window", cfg.budget_config())
    return SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=cfg.gamma + options.gamma_bonus,
                             sampling=cfg.sampling, method=cfg.method, **kw)


plug_method.Config = _PlugOptions


def test_entry_point_method_plugin(monkeypatch):
    from specdec import PipelineConfig, build_engine
    from specdec.presets import get_method
    from specdec.registry import METHODS
    from specdec.testing import tiny_model

    ep = metadata.EntryPoint(name="plug", value=f"{__name__}:plug_method", group="specdec.methods")
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points", lambda **kw: [ep] if kw.get("group") == "specdec.methods" else real(**kw))
    monkeypatch.setattr(METHODS, "_plugins_loaded", False)
    monkeypatch.setattr(METHODS, "_entries", dict(METHODS._entries))
    assert "plug" in METHODS.names()
    assert get_method("plug").description.startswith("self-speculation from a plugin")
    eng = build_engine(tiny_model(), PipelineConfig.make(method="plug", budget=8, options={"gamma_bonus": 1}))
    assert eng.gamma == 5 and eng.method == "plug"
    with pytest.raises(SpecdecError, match="unknown plug option 'bogus'; known: gamma_bonus"):
        build_engine(tiny_model(), PipelineConfig.make(method="plug", options={"bogus": 1}))


def test_method_options_are_validated_once():
    from specdec import PipelineConfig, build_engine
    from specdec.testing import tiny_model

    with pytest.raises(SpecdecError, match="unknown vegas option 'rows'; known: per_kv_head, score_every, score_kind, spread"):
        build_engine(tiny_model(), PipelineConfig.make(method="vegas", options={"rows": "all"}))
    with pytest.raises(SpecdecError, match="unknown magicdec option 'sinks'; known: none"):
        build_engine(tiny_model(), PipelineConfig.make(method="magicdec", options={"sinks": 2}))
    with pytest.raises(SpecdecError, match="field 'page_size'"):
        build_engine(tiny_model(), PipelineConfig.make(method="quest", options={"page_size": 0}))
