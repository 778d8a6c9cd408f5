"""Memory of ``specdec bench``: one KV cache per setting, and a cache that is replaced is freed before
the next one is allocated (at the Llama-3.1-8B shape, B 16 x 32k, one cache is 64 GiB: two next to the
model do not fit on an H200). No ``gc.collect()`` here: a cache kept alive by a reference cycle until the
next collection would hold its memory at allocation time just the same."""

from __future__ import annotations

import weakref

import pytest

import specdec.models as models_mod
from specdec import PipelineConfig, build_engine

from conftest import make_tiny


@pytest.fixture
def allocations(monkeypatch):
    """Every KVCache the model allocates, as ``(weakref, batch, capacity, live earlier caches at that moment)``."""
    made: list = []

    class Recording(models_mod.KVCache):
        def __init__(self, n, batch, heads, capacity, *a, **kw):
            live = [(b, c) for r, b, c, _ in made if r() is not None]
            super().__init__(n, batch, heads, capacity, *a, **kw)
            made.append((weakref.ref(self), batch, capacity, live))

    monkeypatch.setattr(models_mod, "KVCache", Recording)
    return made


def test_new_cache_lets_go_of_the_reused_cache_before_allocating(allocations):
    m = make_tiny("llama")
    first = m.new_cache(2, 40, reuse=True)
    assert m.new_cache(2, 30, reuse=True) is first  # fits: reused
    del first
    m.new_cache(2, 50, reuse=True)  # does not fit: the first one must be gone before this allocates
    big = [a for a in allocations if a[1] == 2]  # (make_tiny runs a batch of 1 to check itself)
    assert [(b, c) for _, b, c, _ in big] == [(2, 40), (2, 50)]
    assert big[1][3] == [], f"caches alive when the second was allocated: {big[1][3]}"


def test_dense_then_speculative_engine_frees_the_dense_cache(allocations):
    """The replayed 8B bench's failure: dense (γ = 0) sized its cache 4 positions short of magicdec's; the
    model kept the dense cache for reuse while magicdec allocated a second one."""
    m = make_tiny("llama")
    prompt = [[5, 6, 7, 8, 9] * 8] * 2
    eng = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1)
    eng.generate(prompt, max_new_tokens=6)
    eng = None
    eng = build_engine(m, PipelineConfig.make(method="magicdec", gamma=3, budget=12, sinks=2, recent=4,
                                              adaptive=False), eos_token_id=-1)
    eng.generate(prompt, max_new_tokens=6)
    big = [a for a in allocations if a[1] == 2]
    assert len(big) == 2 and big[1][2] > big[0][2]
    assert big[1][3] == [], f"caches alive when magicdec's was allocated: {big[1][3]}"


def test_bench_one_cache_per_setting_and_the_previous_freed_first(allocations, tmp_path):
    from specdec.bench import run_bench

    run_bench(["dense", "magicdec", "vegas"], [40, 72], [2], ["ignored"], 6, 16, None, 3, "x", "reference",
              "float32", "cpu", False, tmp_path, "mem", repeats=1, shape="tiny", adaptive=False)
    big = [a for a in allocations if a[1] == 2]
    # one cache per (context, batch), shared by dense, magicdec and vegas
    assert [c for _, _, c, _ in big] == [40 + 6 + 3 + 2, 72 + 6 + 3 + 2], big
    assert big[1][3] == [], f"caches alive when the second setting's was allocated: {big[1][3]}"
