"""Draft trees (specdec.tree): the tree mask (a node's logits = its path run as a chain), the accepted path's K/V
moved where a chain's would be, greedy acceptance along the tree, the EAGLE head's tree draft (= its chain draft along
the argmax path), engines that emit exactly dense greedy's tokens, and one-line refusals."""

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.errors import SpecdecError
from specdec.tree import DEFAULT_PATHS, RANKED_PATHS, DraftTree, accept_greedy

from conftest import make_tiny


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
    path = tmp_path_factory.mktemp("tree") / "tiny-eagle.safetensors"
    save_eagle(path, head, dict(target=model_identity(target), layer_from=2))
    return path


PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]


def test_tree_structure_and_errors():
    t = DraftTree(reversed(DEFAULT_PATHS))  # any order: breadth-first inside
    assert t.nodes == 16 and t.max_depth == 4 and t.paths[:3] == ((0,), (1,), (2,))
    assert len(t.parent_of) == t.parent.shape[0] == t.depth.shape[0] == t.mask.shape[0] == 17
    assert t.widths[0] == 3 and t.parent_of[t.paths.index((1, 0)) + 1] == t.paths.index((1,)) + 1
    row = t.paths.index((0, 1, 0)) + 1
    anc = {0, row, t.paths.index((0,)) + 1, t.paths.index((0, 1)) + 1}
    assert set(torch.nonzero(t.mask[row])[:, 0].tolist()) == anc
    c = DraftTree.chain(3)
    assert c.paths == ((0,), (0, 0), (0, 0, 0)) and torch.equal(c.mask, torch.ones(4, 4, dtype=torch.bool).tril())
    for bad, what in [([(0, 1)], "no parent"), ([(0,), (-1,)], "rank"), ([], "at least one"), ([()], "non-empty"),
                      ([(0,), (True,)], "rank"), ([(r,) for r in range(200)], "too large")]:
        with pytest.raises(SpecdecError, match=what):
            DraftTree(bad)


def test_lookup_branch_structure_and_errors():
    t = DraftTree.default(lookup=6)  # a chain of 6 off the root after the 16 rank nodes
    assert t.nodes == 22 and t.max_depth == 6 and t.lookup_rows == list(range(17, 23)) and repr(t).endswith("lookup=6)")
    assert t.parent_of[17:] == [0, 17, 18, 19, 20, 21] and t.depth[17:].tolist() == [1, 2, 3, 4, 5, 6]
    assert len(t.parent_of) == t.parent.shape[0] == t.depth.shape[0] == 23
    assert set(torch.nonzero(t.mask[20])[:, 0].tolist()) == {0, 17, 18, 19, 20}
    assert not t.mask[:17, 17:].any()  # no rank node sees the branch
    assert [t.paths[r - 1] for r in t.fallback[:4]] == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)] and t.fallback[4:] == [0, 0]
    assert 17 not in t.children[0] and t.widths[0] == 3 and all(17 + i in t.levels[i] for i in range(6))
    assert t.inner == DraftTree.default().inner + [[], []]  # the head runs no row for the branch
    assert DraftTree([(1,)], lookup=2).fallback == [0, 0]  # no argmax chain to repeat
    for bad in (-1, True, "2", 1.0):
        with pytest.raises(SpecdecError, match="lookup branch needs a length"):
            DraftTree(DEFAULT_PATHS, lookup=bad)
    with pytest.raises(SpecdecError, match="too large"):
        DraftTree(DEFAULT_PATHS, lookup=120)


def test_accept_greedy_walks_the_matching_branch():
    t = DraftTree([(0,), (1,), (0, 0), (1, 0), (1, 0, 0)])  # rows: 1 (0,), 2 (1,), 3 (0,0), 4 (1,0), 5 (1,0,0)
    V = 20
    tokens = torch.tensor([[7, 3, 4, 11, 12, 13], [7, 3, 4, 11, 12, 13]])
    y = torch.tensor([[4, 9, 12, 9, 13, 15],  # root says 4 -> row 2 (1,); row 2 says 12 -> row 4; row 4 says 13 -> row 5
                      [5, 9, 12, 9, 13, 15]])  # root says 5: nothing accepted
    logits = torch.nn.functional.one_hot(y, V).float()
    n, nxt, path = accept_greedy(t, tokens, logits)
    assert n.tolist() == [3, 0] and nxt.tolist() == [15, 5]
    assert path[0].tolist() == [2, 4, 5] and tokens[0].gather(0, path[0]).tolist() == [4, 12, 13]


def test_tree_forward_through_the_graph_cache(target, monkeypatch):
    """GraphCache.run with a tree: captured once per tree object (its id, paths and branch in the step key), replayed
    with new rows and lengths, the logits those rows give eagerly. The capture is emulated on the CPU: the "graph"
    re-runs the captured function on its static inputs and writes into the captured output buffer, as a replay does."""
    from specdec.attention.torch_backend import TorchBackend, TorchConfig
    from specdec.graphs import GraphCache, describe_step

    def fake_capture(self, fn):
        out = fn()

        class Replay:
            def replay(self):
                out.copy_(fn())

        return Replay(), out, None

    monkeypatch.setattr(GraphCache, "_warm_and_capture", fake_capture)
    monkeypatch.setattr(target, "backend", TorchBackend(TorchConfig(static=True)))  # capture-safe
    t = DraftTree.default(lookup=4)
    B, L0 = 2, 21
    ctx = torch.tensor([list(range(3, 3 + L0)), [(7 * i) % 90 + 4 for i in range(L0)]])
    gen = torch.Generator().manual_seed(4)
    cache = target.new_cache(B, 64)
    target.forward(ctx, cache, torch.zeros(B, dtype=torch.long))
    k0, v0 = cache.k.clone(), cache.v.clone()
    graphs = GraphCache(target, pool=object())  # (no CUDA memory pool on the CPU)
    for lengths in ([L0, L0], [L0, L0 - 3], [L0 - 5, L0]):
        lengths = torch.tensor(lengths)
        rows = torch.randint(4, 90, (B, t.nodes + 1), generator=gen)
        cache.k.copy_(k0)
        cache.v.copy_(v0)
        got = graphs.run(rows, cache, lengths, None, (), 0, tree=t)
        cache.k.copy_(k0)
        cache.v.copy_(v0)
        want = target.forward(rows, cache, lengths, tree=t)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert graphs.captures == 1 and graphs.replays == 2
    graphs.run(rows, cache, lengths, None, (), 0, tree=DraftTree.default(lookup=4))  # another tree object
    assert graphs.captures == 2
    assert describe_step(target, rows, cache, None, (), 0, t) != describe_step(target, rows, cache, None, (), 0)


@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.8, top_k=4)])
def test_accept_sampled_keeps_the_target_distribution(warp):
    """Rejection sampling over a tree of fixed proposals: the first emitted token has the root's distribution, and the
    second, after a child, that child's — also with a lookup branch repeating a rank child's token."""
    from specdec.sampling import SamplingConfig, warp as warp_fn
    from specdec.tree import accept_sampled

    t = DraftTree([(0,), (1,), (0, 0), (0, 1)], lookup=2)  # rows 1 (0,), 2 (1,), 3 (0,0), 4 (0,1), 5-6 the branch
    V, B = 6, 60000
    tokens = torch.tensor([[0, 1, 2, 3, 4, 2, 5]]).expand(B, -1)  # the branch's first node repeats row 2's token
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(1, t.nodes + 1, V, generator=g) * 1.5).expand(B, -1, -1)
    cfg = SamplingConfig(seed=0, **warp)
    p = warp_fn(logits[0], cfg)  # (N + 1, V)
    n, nxt, path = accept_sampled(t, tokens, logits, cfg, torch.Generator().manual_seed(11))
    tok = tokens.gather(1, path)  # (B, D) the accepted path's tokens
    first = torch.where(n >= 1, tok[:, 0], nxt)
    emp = torch.bincount(first, minlength=V).float() / B
    sd = (p[0] * (1 - p[0]) / B).sqrt()
    assert ((emp - p[0]).abs() <= 5 * sd + 1e-4).all(), (emp, p[0])
    for row in (1, 2, 5):  # after each child of the root: the child's own distribution
        via = (n >= 1) & (path[:, 0] == row)
        if row == 5 or p[0, tokens[0, row]] == 0:  # the branch repeats row 2's token (rejected with it); a token
            assert not via.any()                     # top-k cut off is never accepted
            continue
        second = torch.where(n[via] >= 2, tok[via, 1], nxt[via])
        emp = torch.bincount(second, minlength=V).float() / int(via.sum())
        sd = (p[row] * (1 - p[row]) / int(via.sum())).sqrt()
        assert ((emp - p[row]).abs() <= 5 * sd + 1e-4).all(), (row, emp, p[row])
    assert (n <= t.max_depth).all() and (path[n == 0] == 0).all()


def test_sampled_tree_engine_is_seeded_and_emits_every_token(target, artifact):
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.sampling import SamplingConfig

    def run(seed):
        d = LookupDrafter(EagleDrafter(target, artifact), 1, 3)
        eng = SpeculativeEngine(target, d, tree=True, sampling=SamplingConfig(temperature=0.9, seed=seed),
                                eos_token_id=-1)
        return eng.generate(PROMPTS, 20)

    a, b, c = run(5), run(5), run(6)
    assert a.tokens == b.tokens and a.tokens != c.tokens
    assert all(len(x) == 20 for x in a.tokens) and a.stats.mean_accepted_length > 1.0


def test_sampled_tree_engine_keeps_the_target_distribution(target, artifact):
    """End to end, sampled at temperature 1: 4,000 sequences of one prompt in one batch; the second and third emitted
    tokens (from tree rounds: nodes of the tree, the lookup branch's, or the target's own draws after a rejection) have
    the target's distributions ``sum_x p(x | P) p(y | P, x)`` and the next one, computed exactly by batched forwards
    over every prefix. (Too coarse to see a wrong tree mask on this tiny model: the mask's own tests are above.)"""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.sampling import SamplingConfig

    P, N = PROMPTS[1], 4000
    eng = SpeculativeEngine(target, LookupDrafter(EagleDrafter(target, artifact), 1, 3), tree=True,
                            sampling=SamplingConfig(temperature=1.0, seed=7), eos_token_id=-1)
    out = eng.generate([P] * N, 3).tokens
    V = target.hf.config.vocab_size

    def last(prefixes):  # the target's next-token distribution after each prefix (V,) per row
        ids = torch.tensor(prefixes)
        return target.forward(ids, target.new_cache(len(prefixes), 64), torch.zeros(len(prefixes), dtype=torch.long))[
            :, -1].softmax(-1)

    with torch.no_grad():
        p1 = last([P])[0]  # (V,)
        p2 = last([P + [x] for x in range(V)])  # (V, V): row x
        p3 = torch.cat([last([P + [x, y] for y in range(V)]) for x in range(V)]).view(V, V, V)
    joint2 = p1.view(V, 1) * p2  # P(x, y)
    for i, want in ((1, joint2.sum(0)), (2, (joint2.view(V, V, 1) * p3).sum((0, 1)))):
        got = torch.bincount(torch.tensor([t[i] for t in out]), minlength=V).float() / N
        sd = (want * (1 - want) / N).sqrt()
        assert ((got - want).abs() <= 5 * sd + 2e-3).all(), (i, (got - want).abs().max())
    assert eng.drafter.stats()["rounds"] > 0


def test_keep_path_moves_the_accepted_rows():
    from specdec.cache import KVCache

    c = KVCache(2, 2, 1, 12, 1)
    c.k[:] = torch.arange(12, dtype=torch.float32).view(1, 1, 1, 12, 1)
    c.v[:] = c.k + 100
    lengths = torch.tensor([2, 5])
    c.keep_path(lengths, torch.tensor([[3, 4, 6], [1, 5, 5]]))
    assert c.k[0, 0, 0, :, 0].tolist()[:6] == [0, 1, 2, 5, 6, 8]  # slots 3..5 <- 2 + (3, 4, 6)
    assert c.k[1, 1, 0, 5:9, 0].tolist() == [5, 6, 10, 10]  # slots 6..8 <- 5 + (1, 5, 5)
    assert torch.equal(c.v, c.k + 100)
    ring = KVCache(2, 1, 1, 12, 1, windows=(4, None))
    with pytest.raises(SpecdecError, match="sliding-window"):
        ring.keep_path(torch.tensor([2]), torch.tensor([[1]]))


@pytest.mark.parametrize("backend,lookup", [("reference", 0), ("torch", 0), ("torch", 6)])
def test_tree_rows_equal_their_paths_run_as_chains(target, backend, lookup):
    """Each node's logits (and the K/V it leaves) equal the last row of its root-to-node path run as a chain (a lookup
    branch deeper than the rank paths too)."""
    from specdec.registry import BACKENDS

    t = DraftTree.default(lookup=lookup)
    L0 = 21
    ctx = torch.tensor([list(range(3, 3 + L0)), [(7 * i) % 90 + 4 for i in range(L0)]])
    B = 2
    rows = torch.randint(4, 90, (B, t.nodes + 1), generator=torch.Generator().manual_seed(5))
    with target.using_backend(BACKENDS.build(backend)):
        cache = target.new_cache(B, 64)
        lengths = torch.full((B,), L0 - 1)
        target.forward(ctx[:, :-1], cache, torch.zeros(B, dtype=torch.long))
        k0, v0 = cache.k.clone(), cache.v.clone()
        got = target.forward(rows, cache, lengths, tree=t)
        for u in range(t.nodes + 1):
            anc = torch.nonzero(t.mask[u])[:, 0]  # ancestors and itself, root first (rows are breadth-first)
            chain = target.new_cache(B, 64)
            chain.k.copy_(k0)
            chain.v.copy_(v0)
            want = target.forward(rows[:, anc], chain, lengths)[:, -1]
            torch.testing.assert_close(got[:, u], want, rtol=1e-4, atol=1e-4)


class _Oracle:
    """A test drafter that knows dense greedy's output and puts it on one branch of the tree (elsewhere: tokens the
    target does not choose), so every verification accepts the whole branch."""

    def __init__(self, truth, branch):
        self.truth, self.branch = truth, branch

    def prefill(self, state):
        pass

    def draft(self, state, gamma):
        raise AssertionError("a tree engine never asks for a chain")

    def score_request(self, gamma):
        return None

    def on_verify(self, state, scores):
        pass

    def draft_tree(self, state, tree):
        B = len(state.tokens)
        out = torch.zeros(B, tree.nodes, dtype=torch.long)
        for b in range(B):
            at = len(state.tokens[b])  # the pending token is the last one of the list
            nxt = self.truth[b][at : at + tree.max_depth] + [0] * tree.max_depth
            for i, p in enumerate(tree.paths):
                good = p == self.branch[: len(p)]
                out[b, i] = nxt[len(p) - 1] if good else (nxt[len(p) - 1] + 1 + i) % 90 + 3
        return out

    def tree_verified(self, state, rows, path):
        pass


def test_an_oracle_branch_is_accepted_whole_and_the_tokens_are_dense(target):
    """The truth on the (1, 0, 0, 0) branch: every round accepts 4 drafts (but the last ones, cut by
    max_new_tokens), and the output is dense greedy's. A wrong tree mask or a wrong K/V move changes both."""
    from specdec.engine import SpeculativeEngine

    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
    want = dense.generate(PROMPTS, 25).tokens
    truth = [p + w for p, w in zip(PROMPTS, want)]
    eng = SpeculativeEngine(target, _Oracle(truth, (1, 0, 0, 0)), tree=True, eos_token_id=-1)
    res = eng.generate(PROMPTS, 25)
    assert res.tokens == want
    assert res.stats.iterations == 5 and res.stats.mean_accepted_length == pytest.approx(5.0)  # 1 + 5 x 5 = 25 + 1


def test_eagle_tree_draft_is_the_chain_draft_along_the_argmax_path(target, artifact):
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine

    t = DraftTree.default()
    chain_rows = [t.paths.index((0,) * k) for k in range(1, 5)]
    for d in (EagleDrafter(target, artifact),):
        seen = []
        orig = d._logits
        d._logits = lambda f: seen.append(f.clone()) or orig(f)  # the predicted features the tokens come from
        eng = SpeculativeEngine(target, d, gamma=4, eos_token_id=-1, adaptive=False)
        state, _ = eng._start(PROMPTS, 16, None)
        chain, _ = d.draft(state, 4)
        chain_feats, seen[:] = list(seen), []
        state, _ = eng._start(PROMPTS, 16, None)
        tree = d.draft_tree(state, t)
        torch.testing.assert_close(tree[:, chain_rows], chain, rtol=0, atol=0)
        calls = [0] + [u for level in t.levels for u in level if t.widths[u]]  # rows whose prediction was read
        assert [f.shape[1] for f in seen] == [1] + [len(level) for level in t.inner if level]  # one LM head a depth
        seen = [f[:, i] for f in seen for i in range(f.shape[1])]  # (B, P, d) per depth -> per row, in `calls` order
        for k, f in enumerate(chain_feats):  # step k + 1's feature = the prediction of the argmax path's row k
            row = 0 if k == 0 else t.paths.index((0,) * k) + 1
            torch.testing.assert_close(seen[calls.index(row)], f, rtol=1e-5, atol=1e-5)
        assert tree.shape == (2, 16)
        for u, kids in enumerate(t.children):  # siblings carry distinct tokens (the parent's distinct ranks)
            if kids:
                assert len({tuple(x) for x in tree[:, [k - 1 for k in kids]].T.tolist()}) == len(kids)


@pytest.mark.parametrize("tree", ["default", "chain4", "wide"])
def test_eagle_tree_engine_emits_dense_tokens(target, artifact, tree):
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine

    t = {"default": DraftTree.default(), "chain4": DraftTree.chain(4),
         "wide": DraftTree([(r,) for r in range(6)] + [(0, r) for r in range(4)] + [(0, 0, 0)])}[tree]
    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
    want = dense.generate(PROMPTS, 30).tokens
    eng = SpeculativeEngine(target, EagleDrafter(target, artifact), tree=t, eos_token_id=-1)
    assert eng.gamma == t.max_depth
    got = eng.generate(PROMPTS, 30)
    assert got.tokens == want
    assert eng.generate(PROMPTS[1:], 30).tokens == want[1:]  # a batch gives what each sequence gives alone
    if tree == "chain4":  # a chain-shaped tree accepts what the chain accepts
        chain = SpeculativeEngine(target, EagleDrafter(target, artifact), gamma=4, eos_token_id=-1, adaptive=False)
        assert got.stats.mean_accepted_length == pytest.approx(chain.generate(PROMPTS, 30).stats.mean_accepted_length)
    # with an EOS the sequences end at different steps; the tokens are still dense's
    eos = want[0][7]
    dense_eos = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=eos).generate(PROMPTS, 30).tokens
    eng = SpeculativeEngine(target, EagleDrafter(target, artifact), tree=t, eos_token_id=eos)
    assert eng.generate(PROMPTS, 30).tokens == dense_eos


def test_tree_refusals(target, artifact):
    from specdec.cache import KVCache
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.interfaces import AttentionBackend
    from specdec.sampling import SamplingConfig

    d = EagleDrafter(target, artifact)
    with pytest.raises(SpecdecError, match="cannot draft a tree"):
        build_engine(target, PipelineConfig.make(method="magicdec"), tree=True)
    with pytest.raises(SpecdecError, match="verified densely"):
        cfg = PipelineConfig.make(method="dustin", budget=64, sinks=2, recent=4,
                                  options={"draft": str(artifact), "lookup_min": 0})
        build_engine(target, cfg, tree=True)
    with pytest.raises(SpecdecError, match="DraftTree"):
        SpeculativeEngine(target, d, tree="16")
    with pytest.raises(SpecdecError, match="1 to 32 nodes, got 64"):
        SpeculativeEngine(target, d, tree=64)
    assert set(SpeculativeEngine(target, d, tree=16).tree.paths) == set(DEFAULT_PATHS)
    tp, target.tp = target.tp, type("TP", (), {"world": 2})()  # (what specdec.parallel sets on a sharded model)
    try:
        with pytest.raises(SpecdecError, match="tensor parallelism"):
            SpeculativeEngine(target, d, tree=True)
    finally:
        target.tp = tp
    eng = SpeculativeEngine(target, d, tree=True, eos_token_id=-1)
    eng.replay = object()  # (a benchmark's AcceptanceReplay): never silently ignored
    with pytest.raises(SpecdecError, match="replay"):
        eng.generate(PROMPTS, 4)
    t = DraftTree.default()
    rows = torch.zeros(1, t.nodes + 1, dtype=torch.long)
    with pytest.raises(SpecdecError, match="17 rows"):
        target.forward(rows[:, :5], target.new_cache(1, 64), torch.tensor([3]), tree=t)
    with pytest.raises(SpecdecError, match="sliding-window"):
        target.forward(rows, KVCache(3, 1, 2, 64, 16, windows=(8, None, None)), torch.tensor([3]), tree=t)

    class NoTree(AttentionBackend):
        name = "no-tree"

        def attend(self, q, k_cache, v_cache, meta):
            raise AssertionError("refused before")

    with target.using_backend(NoTree()):
        with pytest.raises(SpecdecError, match="supports_tree"):
            target.forward(rows, target.new_cache(1, 64), torch.tensor([3]), tree=t)


def test_lookup_branch_is_filled_from_the_context(target, artifact):
    """LookupDrafter.draft_tree: the head's tree, and on the lookup branch what followed the latest earlier occurrence
    of the context's last tokens; where nothing matches, the head's argmax chain (the branch adds nothing)."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter

    t = DraftTree.default(lookup=5)
    d = LookupDrafter(EagleDrafter(target, artifact), 2, 4)
    eng = SpeculativeEngine(target, d, tree=t, eos_token_id=-1)
    prompts = [[40, 41, 42, 43, 44, 45, 46, 50, 51, 52, 53, 42], list(range(3, 40))]
    state, _ = eng._start(prompts, 16, None)
    state.tokens[0][-1] = 43  # (the pending token, the list's last: "42 43" was seen before)
    out = d.draft_tree(state, t)
    head = [r - 1 for r in t.fallback[:4]]  # the argmax chain's columns
    assert out[0, 16:].tolist() == [44, 45, 46, 50, 51]  # the continuation of the earlier "42 43"
    assert out[1, 16:20].tolist() == out[1, head].tolist()  # no match in 3 .. 39: the argmax chain repeated
    assert d.stats(reset=True)["matched"] == 1


class _Context:
    """A stand-in for a sequence's n-gram index whose "match" is dense greedy's continuation (``truth``)."""

    def __init__(self, truth):
        self.truth = truth

    def propose(self, toks, k, periodic=True):
        return self.truth[len(toks) : len(toks) + k], 4


def test_an_oracle_lookup_branch_is_accepted_whole(target):
    """The truth on the lookup branch only (every rank node wrong): every round accepts the whole branch (τ 5), with
    dense's tokens — the branch's rows are verified at the right positions and its K/V kept."""
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter

    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
    want = dense.generate(PROMPTS, 25).tokens
    truth = [p + w for p, w in zip(PROMPTS, want)]
    d = LookupDrafter(_Oracle(truth, (9,)), 2, 4)  # (no rank path starts with rank 9: every head node is wrong)
    eng = SpeculativeEngine(target, d, tree=True, eos_token_id=-1)
    assert eng.tree.lookup == 4 and eng.gamma == 4
    real = d.prefill
    d.prefill = lambda state: (real(state), d._index.__setitem__(slice(None), [_Context(x) for x in truth]))
    res = eng.generate(PROMPTS, 25)
    assert res.tokens == want
    assert res.stats.iterations == 5 and res.stats.mean_accepted_length == pytest.approx(5.0)


def test_ranked_trees_are_prefix_closed_and_hold_the_counted_ones():
    """``DraftTree.top(n)``: every ``n`` is a tree (the constructor refuses one that is not prefix-closed); 4 is the
    chain of 4 and 16 the default tree; the counted 8-node tree of the 2026-12-04 run (``both-8``) is its first 8."""
    for n in range(1, len(RANKED_PATHS) + 1):
        assert DraftTree.top(n).nodes == n
    assert set(DraftTree.top(4).paths) == set(DraftTree.chain(4).paths)
    assert set(DraftTree.top(16).paths) == set(DEFAULT_PATHS)
    assert set(DraftTree.top(8).paths) == {(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 1), (0, 1), (1,), (1, 0)}
    assert len(set(RANKED_PATHS)) == len(RANKED_PATHS)
    assert DraftTree.top(8, lookup=4).nodes == 12
    for bad in (0, 33, True, 2.0):
        with pytest.raises(SpecdecError, match="1 to 32 nodes"):
            DraftTree.top(bad)


def test_lookup_tree_engine_emits_dense_tokens(target, artifact):
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter

    prompts = PROMPTS + [[7, 8, 9, 10, 11] * 5]
    for eos in (-1, 11):
        want = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=eos).generate(prompts, 30).tokens
        d = LookupDrafter(EagleDrafter(target, artifact), 1, 3)
        got = SpeculativeEngine(target, d, tree=DraftTree.default(lookup=6), eos_token_id=eos).generate(prompts, 30)
        assert got.tokens == want
        assert d.stats()["matched"] > 0


def test_lookup_tree_refusals(target, artifact):
    from specdec.drafters import EarlyExitDrafter
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter

    d = EagleDrafter(target, artifact)
    with pytest.raises(SpecdecError, match="has none; wrap it"):
        SpeculativeEngine(target, d, tree=DraftTree.default(lookup=4))
    with pytest.raises(SpecdecError, match="needs a tree with a lookup branch"):
        SpeculativeEngine(target, LookupDrafter(d), tree=DraftTree.default())
    with pytest.raises(SpecdecError, match="EarlyExitDrafter drafter cannot draft a tree"):
        SpeculativeEngine(target, LookupDrafter(EarlyExitDrafter(target, 1)), tree=True)


def test_dustin_dense_verification_and_tree_options(target, artifact):
    """``--method dustin`` with ``verify=dense`` (lossless: dense's tokens, stats.lossless) and ``tree=true`` (the
    default tree plus a lookup branch behind prompt lookup); one-line refusals where they cannot apply."""
    from specdec.lookup import LookupDrafter
    from specdec.sampling import SamplingConfig

    want = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(PROMPTS, 24).tokens
    for opts in ({"verify": "dense"}, {"verify": "dense", "tree": True}, {"verify": "dense", "tree": True,
                                                                         "lookup_min": 0},
                 {"verify": "dense", "tree": 8}, {"verify": "dense", "tree": [[0], [1], [0, 0]], "lookup_min": 0}):
        cfg = PipelineConfig.make(method="dustin", budget=16, sinks=2, recent=4,
                                  options={"draft": str(artifact), **opts})
        eng = build_engine(target, cfg, eos_token_id=-1)
        res = eng.generate(PROMPTS, 24)
        assert res.tokens == want and res.stats.lossless, opts
        if opts.get("tree"):
            looks = opts.get("lookup_min", 2) > 0
            assert eng.tree.lookup == (4 if looks else 0) and isinstance(eng.drafter, LookupDrafter) == looks
            t = opts["tree"]
            paths = DEFAULT_PATHS if t is True else RANKED_PATHS[:t] if isinstance(t, int) else t
            assert set(eng.tree.paths) == {tuple(p) for p in paths}, opts
    for opts, what in [({"tree": True}, "add the option verify=dense"),
                       ({"tree": 8}, "or drop tree=8"),
                       ({"verify": "dense", "tree": 0}, r"node count \(1 to 32\)"),
                       ({"verify": "dense", "tree": 33}, r"node count \(1 to 32\)"),
                       ({"verify": "dense", "tree": "8"}, r"node count \(1 to 32\)"),
                       ({"verify": "dense", "tree": [[1, 0]]}, r"has no parent \(1,\)"),
                       ({"verify": "dense", "tree": []}, "needs at least one path"),
                       ({"verify": "dense", "margin": 0.5, "dense_every": 2}, r"dense_every, margin belong"),
                       ({"verify": "dense", "tree": True, "draft": "early-exit"}, "cannot draft a tree")]:
        with pytest.raises(SpecdecError, match=what):
            cfg = PipelineConfig.make(method="dustin", budget=16, sinks=2, recent=4,
                                      options={"draft": str(artifact), **opts})
            build_engine(target, cfg)


def test_eagle_head_is_fed_the_accepted_path(target, artifact):
    """After a round that accepted a non-argmax branch, the head's queued rows are the pending token and that
    branch's tokens, and their features the target's for those rows (what the next draft's first forward reads)."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine

    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
    want = dense.generate(PROMPTS, 12).tokens
    truth = [p + w for p, w in zip(PROMPTS, want)]
    d = EagleDrafter(target, artifact)
    oracle = _Oracle(truth, (1, 0, 0))
    real = d.draft_tree
    d.draft_tree = lambda state, tree: (real(state, tree), oracle.draft_tree(state, tree))[1]
    eng = SpeculativeEngine(target, d, tree=DraftTree.default(), eos_token_id=-1)
    state, run = eng._start(PROMPTS, 12, None)
    pending, L = state.pending.tolist(), state.lengths.clone()
    eng._tree_round(state, run)
    assert (state.lengths - L).tolist() == [4, 4]  # 3 drafts + the pending token
    for b in range(2):
        assert d._rows[b, :4].tolist() == [pending[b]] + want[b][1:4]  # (later columns: never read)
    # the features: the target's own for those tokens, from a plain chain forward
    chain = target.new_cache(1, 64)
    ids = torch.tensor([truth[0][: len(PROMPTS[0]) + 4]])
    target.forward(ids, chain, torch.zeros(1, dtype=torch.long))  # rows L .. L + 3: the pending token, 3 drafts
    torch.testing.assert_close(d._hidden[0, :4], target.last_hidden[0, -4:], rtol=1e-4, atol=1e-4)


class _FrozenCalls:
    """A graph's contract for :meth:`SpeculativeEngine._tree_accept`: the function frozen at a key's first call, later
    calls copy their inputs into the first call's buffers and write the same output buffers."""

    def __init__(self):
        self.graphs, self.captures, self.replays = {}, 0, 0

    def __call__(self, key, fn, *inputs, keep=None):
        full = (key, tuple(tuple(t.shape) for t in inputs))
        if full not in self.graphs:
            statics = tuple(t.clone() for t in inputs)
            self.graphs[full] = (fn, statics, fn(*statics))
            self.captures += 1
            return self.graphs[full][2]
        frozen, statics, outs = self.graphs[full]
        for s, t in zip(statics, inputs):
            s.copy_(t)
        for o, n in zip(outs, frozen(*statics)):
            o.copy_(n)
        self.replays += 1
        return outs


def test_replayed_tree_acceptance_gives_the_eager_tokens(target, artifact):
    """The greedy tree acceptance as one replayed function (a CUDA graph on a GPU): dense greedy's tokens and the
    eager run's τ, one capture per tree and batch. (That the engine clones the graph's output buffers is not checked
    here: a round consumes them before the next replay.)"""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine

    def run(calls):
        eng = SpeculativeEngine(target, EagleDrafter(target, artifact), tree=DraftTree.default(), eos_token_id=-1)
        if calls is not None:
            eng._accept_calls = lambda device: calls
        r = eng.generate(PROMPTS, 30)
        return r.tokens, r.stats.mean_accepted_length

    eager = run(None)
    calls = _FrozenCalls()
    assert run(calls) == eager
    assert eager[0] == build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(
        PROMPTS, 30).tokens
    assert calls.captures == 1 and calls.replays >= 5, (calls.captures, calls.replays)
