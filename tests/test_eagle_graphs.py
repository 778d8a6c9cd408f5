"""The EAGLE draft's capture path, checked on the CPU: the draft runs as fixed-shape functions of tensors
(:meth:`EagleDrafter._greedy`, ``_first``, ``_step``) that :class:`specdec.graphs.CapturedCall` replays as CUDA
graphs on a GPU. :class:`ReplayCalls` emulates a graph's contract here: the function and every Python value it
closed over are frozen at the first call of a key (the "capture"), later calls copy their inputs into the
captured buffers and re-run that frozen function, outputs are the same buffers every time, and while the
function runs the drafter's per-iteration tensors are hidden (a graph reads only its inputs and buffers with
fixed addresses). The GPU twin (real graphs, identical tokens) is in ``tests/test_dustin_gpu.py``."""

import itertools
import os

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.sampling import SamplingConfig

from conftest import make_tiny

#: the drafter's buffers whose addresses key a captured draft (a graph may read them in place)
STABLE = ("k_cache", "v_cache", "lookahead", "_hs")


class ReplayCalls:
    """A stand-in for :class:`specdec.graphs.CapturedCall` with a graph's semantics (module docstring)."""

    def __init__(self) -> None:
        self.graphs: dict = {}
        self.captures = self.replays = 0
        self.uncapturable: dict = {}

    def _hidden(self, owner, fn, *args):
        saved = {n: v for n, v in vars(owner).items() if isinstance(v, torch.Tensor) and n not in STABLE}
        ptrs = {n: getattr(owner, n).data_ptr() for n in STABLE if getattr(owner, n) is not None}
        for n in saved:
            setattr(owner, n, None)  # a read of a per-iteration attribute fails here (a graph would read stale memory)
        try:
            return fn(*args)
        finally:
            for n, v in saved.items():
                setattr(owner, n, v)
            assert {n: getattr(owner, n).data_ptr() for n in ptrs} == ptrs, "a captured buffer was replaced"

    def __call__(self, key, fn, *inputs, keep=None):
        full = (key, tuple((tuple(t.shape), t.dtype) for t in inputs))
        if full not in self.graphs:
            statics = tuple(t.clone() for t in inputs)
            outs = self._hidden(keep, fn, *statics)
            self.graphs[full] = (fn, statics, outs)
            self.captures += 1
            return outs
        frozen, statics, outs = self.graphs[full]
        for s, t in zip(statics, inputs):
            s.copy_(t)
        new = self._hidden(keep, frozen, *statics)
        for o, n in zip(outs, new) if isinstance(outs, tuple) else [(outs, new)]:
            o.copy_(n)
        self.replays += 1
        return outs


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=3, num_hidden_layers=3)


@pytest.fixture(scope="module")
def artifact(target, tmp_path_factory):
    from specdec.artifacts import model_identity
    from specdec.eagle import EagleHead, save_eagle

    torch.manual_seed(0)
    head = EagleHead(target.hf.model.layers[-1], target.hf.config.hidden_size)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("eagle") / "tiny-eagle.safetensors"
    save_eagle(path, head, dict(target=model_identity(target), layer_from=2))
    return path


PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 5]


def _run(target, artifact, replay: bool, method: str, sampling=None, new=20, attention="auto"):
    if method == "eagle":  # dense verification: lossless
        from specdec.eagle import EagleDrafter
        from specdec.engine import SpeculativeEngine
        from specdec.verifiers import FullVerifier

        # γ fixed: eager and replayed runs are compared on τ and their captured shapes (γ + 1 rows); an adaptive
        # γ follows each run's timing
        eng = SpeculativeEngine(target, EagleDrafter(target, artifact), FullVerifier(target), gamma=3,
                                sampling=sampling, eos_token_id=-1, adaptive=False)
    else:  # Dustin at a small verification budget: sparse, lossy, the lookahead signal steers it
        opts = {"draft": str(artifact)}
        if method == "dustin-chain":  # the opt-in lookup policy: the head follows the context's match
            opts["lookup_policy"] = "chain"
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=12, sinks=2, recent=4, options=opts)
        eng = build_engine(target, cfg, eos_token_id=-1)
    calls = ReplayCalls() if replay else None
    from specdec.lookup import base_drafter

    base_drafter(eng.drafter).attention = attention
    if replay:  # Dustin's EAGLE drafter sits under prompt lookup (its default)
        base_drafter(eng.drafter)._captured = lambda: calls
    out = []
    for prompts in (PROMPTS, PROMPTS[:1] * 2):
        r = eng.generate(prompts, new)
        out.append((r.tokens, r.stats.mean_accepted_length, r.stats.acceptance_per_position))  # same drafts: same τ
    return out, calls, eng


@pytest.mark.parametrize("method", ["eagle", "dustin", "dustin-chain"])
def test_replayed_draft_gives_the_eager_tokens(target, artifact, method):
    eager, _, _ = _run(target, artifact, False, method)
    got, calls, eng = _run(target, artifact, True, method)
    assert got == eager
    if method == "eagle":
        dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
        assert eager[0][0] == dense.generate(PROMPTS, 20).tokens
    # one shape after the prefill (one queued row) and one after each verification (γ+1 rows), per buffer set;
    # the opt-in lookup policy "chain" drafts rounds with a context match by its own function (PROMPTS[1]
    # repeats itself): "chain3x1" at those shapes too
    names = [k[0][1] for k in calls.graphs]
    if method != "dustin-chain":
        assert calls.captures == 2 and calls.replays >= 8, (calls.captures, calls.replays)
        assert names == ["greedy3"] * 2
    else:
        assert names.count("greedy3") == 2 and 1 <= names.count("chain3x1") <= 2, names
        assert calls.captures == len(names) and calls.replays >= 8, (calls.captures, calls.replays)


@pytest.mark.parametrize("lookup", [0, 3])
def test_replayed_tree_draft_gives_the_eager_tokens(target, artifact, lookup):
    """The tree draft (``EagleDrafter._tree``) under the graph emulation: the same tokens and τ as eager (dense
    greedy's), captured once per input shape and replayed; with a lookup branch, behind prompt lookup."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.tree import DraftTree

    tree = DraftTree.default(lookup=lookup)

    def run(replay):
        head = EagleDrafter(target, artifact)
        eng = SpeculativeEngine(target, LookupDrafter(head, 1, 3) if lookup else head, tree=tree, eos_token_id=-1)
        calls = ReplayCalls() if replay else None
        if replay:
            head._captured = lambda: calls
        out = []
        for prompts in (PROMPTS, PROMPTS[:1] * 2):
            r = eng.generate(prompts, 20)
            out.append((r.tokens, r.stats.mean_accepted_length))
        return out, calls

    eager, _ = run(False)
    got, calls = run(True)
    assert got == eager
    assert eager[0][0] == build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(
        PROMPTS, 20).tokens
    # one shape after the prefill (one queued row) and one after each verification (depth + 1 rows)
    assert [k[0][1][0] for k in calls.graphs] == ["tree", "tree"] and calls.replays >= 6, (calls.captures, calls.replays)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_tree_draft_attention_on_a_backend_equals_the_matmuls(target, artifact, backend):
    """The tree draft's head attention on a backend with tree rows (the Triton split-K kernel, as on a GPU; the
    reference backend) against the PyTorch matmuls, at every draft of a tree run (ragged lengths, two batches):
    from the same head cache, the same tokens, ``f_{L-1}`` and every predicted feature; each depth is one
    backend call with the tree's mask. The run itself (dense verification) emits dense greedy's tokens."""
    from specdec.attention.reference import ReferenceBackend
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.tree import DraftTree

    be = _triton() if backend == "triton" else ReferenceBackend()
    tree_calls = []
    attend = be.attend

    def counted(q, k, v, meta):
        if meta.tree is not None:
            tree_calls.append(tuple(meta.tree.shape))
        return attend(q, k, v, meta)

    be.attend = counted
    tree = DraftTree.default()
    head = EagleDrafter(target, artifact)
    eng = SpeculativeEngine(target, head, tree=tree, eos_token_id=-1)
    orig, drafts = head._tree, []

    def both(tree_, *first):
        kc, vc = head.k_cache.clone(), head.v_cache.clone()
        outs = []
        for mode in ("torch", be):
            head.k_cache.copy_(kc)
            head.v_cache.copy_(vc)
            head.attention, feats = mode, []
            hook = head.norm.register_forward_hook(lambda mod, inp, out: feats.append(out))
            try:
                outs.append((orig(tree_, *first), feats))
            finally:
                hook.remove()
        (r0, f0), (r1, f1) = outs
        assert torch.equal(r1[0], r0[0])
        torch.testing.assert_close(r1[1], r0[1])
        assert len(f1) == len(f0) > 1
        for a, b in zip(f0, f1):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        drafts.append(len(f0))
        return r1

    head._tree = both
    got = eng.generate(PROMPTS, 16).tokens
    assert got == build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(
        PROMPTS, 16).tokens
    inner = [len(level) for level in tree.inner if level]
    assert len(drafts) >= 3 and len(tree_calls) == len(drafts) * len(inner), (drafts, tree_calls)
    assert tree_calls[: len(inner)] == [(n, n) for n in itertools.accumulate(inner)]


def test_replayed_sampling_draft_gives_the_eager_tokens(target, artifact):
    s = SamplingConfig(temperature=0.8, seed=11)
    eager, _, _ = _run(target, artifact, False, "eagle", sampling=s, new=12)
    got, calls, _ = _run(target, artifact, True, "eagle", sampling=s, new=12)
    assert got == eager
    names = sorted({k[0][1] for k in calls.graphs})
    assert names == ["first", "step"] and calls.replays > 0


def test_draft_buffers_are_kept_across_generations(target, artifact):
    """The head's K/V cache and the lookahead buffer keep their addresses while the cache shape does (the
    captured draft reads them in place); another batch size gets new ones."""
    _, _, eng = _run(target, artifact, False, "dustin", new=6)
    d = eng.drafter
    ptrs = (d.k_cache.data_ptr(), d.v_cache.data_ptr(), d.lookahead.data_ptr())
    eng.generate(PROMPTS[:1] * 2, 6)
    assert (d.k_cache.data_ptr(), d.v_cache.data_ptr(), d.lookahead.data_ptr()) == ptrs
    eng.generate(PROMPTS[:1], 6)
    assert d.k_cache.shape[0] == 1 and d.k_cache.data_ptr() != ptrs[0]


def test_nonfinite_draft_is_refused_after_the_iteration(target, artifact):
    """The greedy draft's non-finite check is read at on_verify (no host wait per draft) and still raises."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine

    d = EagleDrafter(target, artifact)
    d._logits = lambda f: torch.full((f.shape[0], target.dims.vocab_size), float("nan"))
    eng = SpeculativeEngine(target, d, gamma=2, eos_token_id=-1)
    with pytest.raises(FloatingPointError, match="drafter produced NaN"):
        eng.generate(PROMPTS[:1], 8)


def test_tree_round_reads_the_draft_flags_with_the_commit(target, artifact):
    """A tree round takes the head's non-finite flags for the commit's one transfer before ``tree_verified``, which
    would otherwise read them on the host (a wait for the round's device work, every round); non-finite draft logits
    still raise after the iteration."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.tree import DraftTree

    d = EagleDrafter(target, artifact)
    pending = []
    orig = d.raise_untaken_flags

    def raise_untaken():
        pending.append(d._flags is not None)
        orig()

    d.raise_untaken_flags = raise_untaken
    eng = SpeculativeEngine(target, d, tree=DraftTree.default(), eos_token_id=-1)
    eng.generate(PROMPTS, 12)
    assert pending and not any(pending), pending
    d._logits = lambda f: torch.full((*f.shape[:-1], target.dims.vocab_size), float("nan"))
    with pytest.raises(FloatingPointError, match="drafter produced NaN"):
        eng.generate(PROMPTS[:1], 8)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_head_builds_from_a_fused_target(artifact, kernels):
    """A target whose projections were fused (``--fuse``, the GPU benchmarks) still loads the head (the
    artifact stores separate q/k/v and gate/up), and drafts what the unfused target's head drafts; also
    with the fused Triton kernels (the head reads the final norm's output and the rotary cos/sin)."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.verifiers import FullVerifier

    if kernels == "triton":  # the kernels on these CPU models: Triton's interpreter (CI sets it)
        pytest.importorskip("triton", reason="the fused kernels need the optional 'triton' package")
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            pytest.skip("fused Triton kernels on CPU tensors need TRITON_INTERPRET=1")
    plain, fused = make_tiny("llama", seed=3, num_hidden_layers=3), make_tiny("llama", seed=3, num_hidden_layers=3)
    fused.fuse_projections(kernels=kernels)
    out = []
    for m in (plain, fused):
        eng = SpeculativeEngine(m, EagleDrafter(m, artifact), FullVerifier(m), gamma=3, eos_token_id=-1,
                                adaptive=False)  # τ of the two targets compared: γ fixed
        r = eng.generate(PROMPTS, 12)
        out.append((r.tokens, r.stats.mean_accepted_length))
    assert out[0][0] == out[1][0]
    assert out[0][1] == pytest.approx(out[1][1])


def _triton(splits: int = 3):
    pytest.importorskip("triton", reason="the head's Triton attention needs the optional 'triton' package")
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("Triton kernels on CPU tensors need TRITON_INTERPRET=1")
    from specdec.cuda.triton_backend import TritonBackend, TritonConfig

    return TritonBackend(TritonConfig(block_n=16, num_splits=splits))


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("T", [1, 6])
def test_head_attention_through_a_backend_equals_the_matmuls(target, artifact, backend, T):
    """``head_layer_step`` with the attention on a backend (the Triton split-K kernel, as on a GPU; the reference
    backend) against its PyTorch matmuls: the layer's output, the written K/V and the lookahead scores of two
    heads (summed over heads and rows), ragged positions, one row (draft steps) and six (the first draft)."""
    from specdec.attention.reference import ReferenceBackend
    from specdec.eagle import build_head, head_layer_step, rope

    be = _triton() if backend == "triton" else ReferenceBackend()
    head = build_head(target, artifact)[1]
    g = torch.Generator().manual_seed(5)
    B, C, d = 2, 48, target.hf.config.hidden_size
    a = head.layer.self_attn
    Hkv, D = a.k_proj.out_features // a.head_dim, a.head_dim
    H = a.q_proj.out_features // D
    k0, v0 = torch.randn(B, Hkv, C, D, generator=g), torch.randn(B, Hkv, C, D, generator=g)
    x = torch.randn(B, T, d, generator=g)
    pos = torch.tensor([[7], [C - T - 3]]) + torch.arange(T)
    cos, sin = rope(target, x, pos)
    hs = [0, H - 1]
    out = {}
    for name, kw in (("torch", {}), ("backend", dict(backend=be, score_heads=hs))):
        kc, vc, probs = k0.clone(), v0.clone(), []
        with torch.no_grad():
            y = head_layer_step(head.layer, x, kc, vc, pos, cos, sin, probs, **kw)
        la = probs[0].index_select(1, torch.tensor(hs)).sum((1, 2)) if name == "torch" else probs[0].sum(1)
        out[name] = (y, kc, vc, la)
    y0, k_0, v_0, la0 = out["torch"]
    y1, k_1, v_1, la1 = out["backend"]
    assert torch.equal(k_0, k_1) and torch.equal(v_0, v_1)
    torch.testing.assert_close(y1, y0, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(la1, la0, rtol=1e-4, atol=1e-6)
    assert float(la0[0, pos[0, -1] + 1:].abs().sum()) == 0 and float(la0.sum()) > 0


@pytest.mark.parametrize("method", ["eagle", "dustin"])
def test_head_on_the_triton_backend_drafts_as_the_matmuls_and_replays(target, artifact, method):
    """The head's attention on the Triton kernel (the default when the target runs on the Triton backend):
    tokens, τ and per-position acceptance equal the PyTorch head's (dense verification: lossless; Dustin: the
    lookahead signal steers the sparse verify, so its scores are checked too), eagerly and replayed (a graph's
    contract). The target itself stays on the reference backend here (the interpreter is slow)."""
    be = _triton(splits=1)  # one chunk: the fused softmax scores of a one-split launch, as at B = 64 on a GPU
    from specdec.errors import SpecdecError
    from specdec.lookup import base_drafter

    want, _, eng = _run(target, artifact, False, method, new=8)
    head = base_drafter(eng.drafter)
    assert head.attention == "auto" and head.attention_backend() is None  # reference target: the matmuls
    with target.using_backend(be):
        assert head.attention_backend() is be  # a Triton target: its kernel
    head.attention = "torch"
    with target.using_backend(be):
        assert head.attention_backend() is None
    head.attention = "fast"
    with pytest.raises(SpecdecError, match="must be 'auto', 'backend' or 'torch'"):
        head.attention_backend()
    got = []
    for replay in (False, True):
        out, calls, eng = _run(target, artifact, replay, method, new=8, attention=be)
        got.append(out)
        if replay:
            assert calls.replays > 0
    assert got[0] == want and got[1] == want
