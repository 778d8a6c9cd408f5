"""Registries: unknown names list the known ones; plugins register through entry points."""

from importlib import metadata

import pytest
import torch

from specdec import SELECTORS, BudgetSelector
from specdec.errors import SpecdecError
from specdec.registry import Registry


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
