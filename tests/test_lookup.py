"""Prompt lookup combined with a draft (specdec.lookup): the n-gram proposal, losslessness with dense
verification (greedy, ragged batch), the inner drafter's state after replaced drafts, and Dustin's options."""

import pytest
import torch

from specdec.errors import SpecdecError

from conftest import make_tiny


def test_ngram_proposal_longest_latest_periodic():
    from specdec.lookup import NgramIndex

    toks = [1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3]
    assert NgramIndex(2, 3).propose(toks, 3) == ([7, 5, 2], 3)  # the longest suffix (1, 2, 3) first
    assert NgramIndex(2, 2).propose(toks, 3) == ([8, 1, 2], 2)  # (2, 3): its latest earlier occurrence
    assert NgramIndex(2, 4).propose([4, 5, 6, 5, 6], 5) == ([5, 6, 5, 6, 5], 2)  # runs into the end: periodic
    assert NgramIndex(2, 4).propose([1, 2, 3, 4], 4) == ([], 0)  # no earlier occurrence
    idx = NgramIndex(1, 2)  # incremental: tokens appended after a first proposal are indexed too
    assert idx.propose([9, 8], 2) == ([], 0)
    assert idx.propose([9, 8, 7, 9], 2) == ([8, 7], 1)
    with pytest.raises(SpecdecError, match="lookup_min <= lookup_max"):
        from specdec.lookup import LookupDrafter

        LookupDrafter(None, 3, 2)


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=3, num_hidden_layers=3)


@pytest.fixture(scope="module")
def eagle_path(target, tmp_path_factory):
    from specdec.artifacts import model_identity
    from specdec.eagle import EagleHead, save_eagle

    torch.manual_seed(0)
    head = EagleHead(target.hf.model.layers[-1], target.hf.config.hidden_size)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("lookup") / "tiny-eagle.safetensors"
    save_eagle(path, head, dict(target=model_identity(target), layer_from=2))
    return path


def _inner(kind, target, eagle_path):
    from specdec.drafters import ModelDrafter
    from specdec.eagle import EagleDrafter

    if kind == "eagle":
        return EagleDrafter(target, eagle_path)
    return ModelDrafter(make_tiny("llama", seed=9, num_hidden_layers=1))


def _record(drafter):
    """Keep the draft features an EAGLE head turns into logits (more sensitive to its state than tokens)."""
    if hasattr(drafter, "_logits"):
        drafter.feats = []
        orig = drafter._logits
        drafter._logits = lambda f: drafter.feats.append(f.detach().clone()) or orig(f)


def _signal(drafter, drafts):
    """``(B, ...)`` per sequence: the γ predicted features (EAGLE) or the draft tokens (a draft model)."""
    if hasattr(drafter, "feats"):
        out, drafter.feats = torch.stack(drafter.feats, 1), []
        return out
    return drafts.clone().float()


@pytest.mark.parametrize("kind", ["eagle", "model"])
def test_lookup_is_lossless_and_keeps_the_inner_drafter_in_step(kind, target, eagle_path):
    """Greedy + dense verification equals dense decoding (ragged batch); in every round the inner drafter's own
    drafts equal those of a fresh drafter prefilled on the same tokens, so replaced (and accepted) drafts did not
    leave the inner drafter's state (the EAGLE head's queued rows, a draft model's cache) behind."""
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.verifiers import FullVerifier

    g = torch.Generator().manual_seed(2)
    base = torch.randint(0, 96, (6,), generator=g).tolist()
    prompts = [base * 4 + [5], (base[::-1] * 3)[:15]]
    inner = _inner(kind, target, eagle_path)
    look = LookupDrafter(inner, 1, 3)
    seen = []
    orig = inner.draft
    inside = [False]  # the inner drafter may start a round early (draft_ahead), before the host has the tokens:
    orig_look = look.draft  # its drafts are recorded when the lookup takes them, with the tokens of that round

    def look_spy(state, gamma):
        inside[0] = True
        try:
            return orig_look(state, gamma)
        finally:
            inside[0] = False

    def spy(state, gamma):
        drafts, q = orig(state, gamma)
        if inside[0]:
            seen.append(([list(t) for t in state.tokens], _signal(inner, drafts), state.active.clone()))
        return drafts, q

    _record(inner)
    inner.draft = spy
    look.draft = look_spy
    dense = SpeculativeEngine(target, method="dense", eos_token_id=-1).generate(prompts, 20)
    # γ fixed: the lookup's matches and τ are checked (the adaptive controller may run dense steps instead)
    res = SpeculativeEngine(target, look, FullVerifier(target), gamma=4, eos_token_id=-1,
                            adaptive=False).generate(prompts, 20)
    assert res.tokens == dense.tokens
    st = look.stats()
    assert 0 < st["matched"] and res.stats.mean_accepted_length > 1.5, (st, res.stats.mean_accepted_length)
    inner.draft = orig
    del look.draft
    assert len(seen) == res.stats.iterations
    for toks, drafts, active in seen[1:]:
        for b in range(len(prompts)):
            if not bool(active[b]):
                continue
            fresh = _inner(kind, target, eagle_path) if kind == "eagle" else type(inner)(inner.draft_model)
            _record(fresh)
            eng = SpeculativeEngine(target, fresh, gamma=4, eos_token_id=-1)
            state, _ = eng._start([toks[b][:-1]], 8, None)
            assert int(state.pending[0]) == toks[b][-1]
            with torch.no_grad():
                ref = _signal(fresh, fresh.draft(state, 4)[0])
            assert torch.allclose(ref[0], drafts[b], atol=1e-4), (b, toks[b][-6:], (ref[0] - drafts[b]).abs().max())


def test_dustin_options_wrap_the_draft(target, eagle_path):
    from specdec import PipelineConfig, build_engine
    from specdec.eagle import EagleDrafter
    from specdec.lookup import LookupDrafter

    def drafter(**options):
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=64, options=dict(draft=str(eagle_path), **options))
        return build_engine(target, cfg).drafter

    d = drafter()
    assert isinstance(d, LookupDrafter) and (d.min_n, d.max_n, d.trust_n) == (2, 4, 4)  # behind an EAGLE head: 4
    assert isinstance(d.inner, EagleDrafter) and d.n_layers == 1  # forwarded
    early = PipelineConfig.make(method="dustin", gamma=3, budget=64, options=dict(draft="early-exit"))
    assert build_engine(target, early).drafter.trust_n == 2  # behind any other drafter: every match
    assert drafter(lookup_trust=2).trust_n == 2
    assert isinstance(drafter(lookup_min=0), EagleDrafter)
    d = drafter(lookup_min=3, lookup_max=5, lookup_trust=4)
    assert (d.min_n, d.max_n, d.trust_n) == (3, 5, 4)
    with pytest.raises(SpecdecError, match="lookup_min <= lookup_max"):
        drafter(lookup_min=5, lookup_max=4)


def test_sampling_with_lookup_follows_the_target(tmp_path):
    """Lossless sampling with prompt lookup over the EAGLE head + dense verification: a lookup draft is a one-hot
    q. Chi-square against the exact law of 3-token continuations (tests/test_lossless_stats.py's recipe); the
    repeating prompt makes lookup propose in most rounds."""
    import itertools

    from test_lossless_stats import K, N, PROMPT, SETTINGS, V, exact_joint, goodness_of_fit

    from specdec.artifacts import model_identity
    from specdec.eagle import EagleDrafter, EagleHead, save_eagle
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.sampling import SamplingConfig
    from specdec.verifiers import FullVerifier

    m = make_tiny("llama", seed=5, vocab_size=V)
    with torch.no_grad():
        m.hf.lm_head.weight.mul_(4.0)
    nxt = {}
    for k in range(K):
        prefixes = list(itertools.product(range(V), repeat=k))
        with torch.no_grad():
            lg = m.hf(input_ids=torch.tensor([PROMPT + list(p) for p in prefixes])).logits[:, -1].float()
        nxt.update({p: lg[i] for i, p in enumerate(prefixes)})
    torch.manual_seed(0)
    head = EagleHead(m.hf.model.layers[-1], m.hf.config.hidden_size)
    path = tmp_path / "h.safetensors"
    save_eagle(path, head, dict(target=model_identity(m), layer_from=len(m.hf.model.layers) - 1))
    cfg = SamplingConfig(**SETTINGS["T1"], seed=4321)
    look = LookupDrafter(EagleDrafter(m, path), 1, 3)
    eng = SpeculativeEngine(m, look, FullVerifier(m), gamma=3, sampling=cfg, eos_token_id=-1)
    res = eng.generate([PROMPT] * N, max_new_tokens=K)
    assert look.stats()["matched_share"] > 0.5
    seqs = torch.tensor(res.tokens)
    flat = (seqs * torch.tensor([V ** (K - 1 - k) for k in range(K)])).sum(1)
    counts = torch.bincount(flat, minlength=V ** K).double().view((V,) * K)
    probs = exact_joint(nxt, cfg)
    pval, tv, _ = goodness_of_fit(counts, probs)
    p1, tv1, _ = goodness_of_fit(counts.sum(dim=(1, 2)), probs.sum(dim=(1, 2)))
    assert pval > 1e-3 and p1 > 1e-3 and tv1 < 0.03, (pval, p1, tv1)


def test_lookup_merge_respects_trust_and_the_inner_first_draft():
    """Which drafts the lookup replaces, per sequence: a trusted match (n >= trust_n) always, a short one only
    where its first token equals the inner drafter's, a partial proposal only in its own positions, no match
    never; and the inner drafter is told exactly these drafts."""
    from types import SimpleNamespace

    from specdec.interfaces import Drafter
    from specdec.lookup import LookupDrafter

    class Inner(Drafter):
        def prefill(self, state):
            pass

        def draft(self, state, gamma):
            return torch.full((len(state.tokens), gamma), 99), None

        def drafts_replaced(self, state, drafts, mask):
            self.seen = (drafts.clone(), mask.clone())

    inner = Inner()
    look = LookupDrafter(inner, min_n=1, max_n=3, trust_n=3)
    toks = [[1, 2, 3, 4, 1, 2, 3],  # suffix (1, 2, 3) seen before: trusted, proposes 4 1 2 3
            [5, 6, 7, 8, 9, 6],  # only (6,) matches: short, first token 7 != inner's 99: kept
            [5, 6, 99, 8, 6],  # short match whose first token 99 equals the inner draft: taken (99 8 6 99)
            [10, 11, 12, 13]]  # no match
    state = SimpleNamespace(tokens=toks)
    look.prefill(state)
    drafts, q = look.draft(state, 4)
    assert q is None
    assert drafts.tolist() == [[4, 1, 2, 3], [99] * 4, [99, 8, 6, 99], [99] * 4]
    assert inner.seen[1].tolist() == [[True] * 4, [False] * 4, [True] * 4, [False] * 4]
    assert torch.equal(inner.seen[0], drafts)


def test_keep_copied_puts_the_match_context_first_in_the_lookahead():
    """``keep``: each sequence's match (the n-gram's earlier occurrence, the γ tokens after it, ``keep`` either side,
    clipped to the sequence) gains :data:`KEPT_MASS` in the inner drafter's lookahead signal in place, after the inner
    drafter recorded it; no match, ``keep=None`` or no signal: unchanged. The hybrid selection then takes them."""
    from types import SimpleNamespace

    from specdec.interfaces import Drafter
    from specdec.lookup import KEPT_MASS, LookupDrafter
    from specdec.selectors.hybrid_srh import hybrid_select

    class Inner(Drafter):
        def prefill(self, state):
            pass

        def draft(self, state, gamma):
            self.lookahead.zero_()
            self.lookahead[:, -3:] = 1.0  # the draft's own attention: on the last positions only
            return torch.full((len(state.tokens), gamma), 99), None

        def drafts_replaced(self, state, drafts, mask):
            pass

    seq0 = list(range(100, 140)) + [7, 8, 9, 5, 6] + list(range(200, 240)) + [7, 8, 9]  # (7 8 9) matched at 40-42
    seq1 = list(range(300, 390))  # no match
    inner = Inner()
    inner.lookahead = torch.zeros(2, 96)
    state = SimpleNamespace(tokens=[seq0, seq1])
    look = LookupDrafter(inner, min_n=2, max_n=3, trust_n=2, keep=2)
    look.prefill(state)
    drafts, _ = look.draft(state, 4)
    assert drafts[0].tolist() == [5, 6, 200, 201] and drafts[1].tolist() == [99] * 4
    kept = (inner.lookahead >= KEPT_MASS).nonzero().tolist()
    assert kept == [[0, p] for p in range(38, 49)]  # 40-2 .. 42+4+2
    want = torch.zeros(2, 96)
    want[:, -3:] = 1.0
    want[0, 38:49] += KEPT_MASS
    assert torch.equal(inner.lookahead, want)  # the recorded signal plus the mass, nothing else touched
    # the same spans when keep_copied looks the matches up itself (no located list from the draft)
    inner.lookahead.copy_(want)
    inner.lookahead[0, 38:49] -= KEPT_MASS
    look.keep_copied(state, 4)
    assert torch.equal(inner.lookahead, want)
    assert inner.lookahead[1].sum() == 3.0  # no match: the draft's signal as recorded
    # the draft part of a 24-entry set (2 sinks, 4 recent, m = 11) is exactly the kept context
    L = torch.tensor([len(seq0), len(seq1)])
    idx = hybrid_select(L, torch.tensor([24, 24]), 2, 4, inner.lookahead, None, torch.tensor([11, 11]))
    assert sorted(p for p in idx[0, 6:17].tolist()) == list(range(38, 49))
    # off, or no signal to write to: nothing happens
    inner.lookahead.zero_()
    off = LookupDrafter(inner, min_n=2, max_n=3, trust_n=2)
    off.prefill(state)
    off.draft(state, 4)
    assert inner.lookahead.max() == 1.0
    inner.lookahead = None
    look.keep_copied(state, 4)  # no error
    with pytest.raises(SpecdecError, match="lookup_keep=-1 needs an integer >= 0"):
        LookupDrafter(inner, keep=-1)


# -- policy "chain": the EAGLE head follows the context's candidates and continues from the tokens it took ----------


def test_candidates_first_is_the_proposal_then_other_followers():
    """``NgramIndex.candidates``: the first is ``propose``'s continuation (longest suffix, latest occurrence) with its
    ``n``; the others are what followed the last token elsewhere, one per first token, by ``n`` then recency."""
    from specdec.lookup import NgramIndex

    toks = [1, 2, 3, 7, 5, 2, 3, 8, 4, 3, 9, 1, 2, 3]
    cs = NgramIndex(2, 3, follow=True).candidates(toks, 3, 8)
    assert cs[0] == NgramIndex(2, 3).propose(toks, 3) == ([7, 5, 2], 3)
    assert cs == [([7, 5, 2], 3), ([8, 4, 3], 2), ([9, 1, 2], 1)]  # (2, 3) -> 8; (3,) -> 9 (latest 3 -> 9)
    assert NgramIndex(2, 3, follow=True).candidates(toks, 3, 2) == cs[:2]
    assert NgramIndex(2, 4, follow=True).candidates([4, 5, 6, 5, 6], 5, 4) == [([5, 6, 5, 6, 5], 2)]  # periodic, as propose
    assert NgramIndex(2, 4, follow=True).candidates([4, 5, 6, 5, 6], 5, 4, periodic=False) == [([5, 6], 2)]
    g = torch.Generator().manual_seed(0)
    for _ in range(30):  # the first candidate is the proposal on random texts over a small vocabulary
        t = torch.randint(0, 6, (40,), generator=g).tolist()
        c, p = NgramIndex(2, 4, follow=True).candidates(t, 4, 8), NgramIndex(2, 4).propose(t, 4)
        assert (c[0] if c and c[0][1] >= 2 else ([], 0)) == p, t
        assert len({x[0][0] for x in c}) == len(c)  # one per first token
        assert c == _brute_candidates(t, 4, 8, 4)
    idx = NgramIndex(2, 3, follow=True)  # incremental: tokens appended later are indexed too
    t = torch.randint(0, 5, (60,), generator=g).tolist()
    for end in range(10, 61, 7):
        assert idx.candidates(t[:end], 3, 5) == _brute_candidates(t[:end], 3, 5, 3)


def _brute_candidates(toks, gamma, k, max_n):
    """Every earlier occurrence of the last token, its match length (<= max_n) and first follower; the best per
    follower (longest, then latest), sorted; periodic continuations."""
    L, best = len(toks), {}
    for e in range(L - 2, -1, -1):
        if toks[e] != toks[-1]:
            continue
        n = 1
        while n < max_n and e - n >= 0 and toks[e - n] == toks[L - 1 - n]:
            n += 1
        if toks[e + 1] not in best or n > best[toks[e + 1]][0]:
            best[toks[e + 1]] = (n, e)
    out = []
    for _, (n, e) in sorted(best.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:k]:
        cont = []
        for i in range(gamma):
            cont.append(toks[e + 1 + i] if e + 1 + i < L else cont[e + 1 + i - L])
        out.append((cont, n))
    return out


def _chain_state(target, drafter, toks):
    from specdec.engine import SpeculativeEngine

    state, _ = SpeculativeEngine(target, drafter, gamma=4, eos_token_id=-1)._start([toks], 8, None)
    return state


def _fresh_head(target, eagle_path, toks):
    from specdec.eagle import EagleDrafter

    d = EagleDrafter(target, eagle_path)
    d.probs = []
    orig = d._logits
    d._logits = lambda f: (lambda lg: d.probs.append(torch.softmax(lg, -1)) or lg)(orig(f))
    return d, _chain_state(target, d, toks)


def _t(x, dt=torch.long):
    return torch.tensor([x], dtype=dt)


def test_chain_follows_a_prefix_then_the_head_fed_it(target, eagle_path):
    """Candidate tokens for the first 2 steps, none after: the draft is those 2 tokens, then the head's chain
    conditioned on them, i.e. what the head drafts when its own logits are forced to pick them."""
    toks = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    d, st = _fresh_head(target, eagle_path, toks)
    with torch.no_grad():
        own = d.draft(st, 4)[0][0].tolist()
    own_p = d.probs
    forced = [(own[0] + 1) % 96, (own[1] + 5) % 96]
    d, st = _fresh_head(target, eagle_path, toks)
    with torch.no_grad():
        got = d.draft_chain(st, 4, _t([forced + [0, 0]]), _t([[True, True, False, False]], torch.bool),
                            torch.full((1, 1, 4), 2.0))[0].tolist()
    ref_d, st = _fresh_head(target, eagle_path, toks)
    calls = []
    orig = ref_d._logits

    def biased(f):
        lg = orig(f)
        i = len(calls)
        calls.append(i)
        if i < 2:
            lg = lg.clone()
            lg[:, forced[i]] += 1e4
        return lg

    ref_d._logits = biased
    with torch.no_grad():
        ref = ref_d.draft(st, 4)[0][0].tolist()
    assert got[:2] == forced and got == ref, (got, ref, own)
    # the head's distributions at every step equal the forced reference's; from step 2 on they differ from the
    # unforced head's (the continuation depends on the tokens taken, else this test could not fail)
    chain_p, ref_p = torch.stack(d.probs), torch.stack(ref_d.probs)
    assert torch.allclose(chain_p, ref_p, atol=1e-6)
    assert (chain_p[1:] - torch.stack(own_p)[1:]).abs().amax() > 1e-3


def test_chain_veto_agreement_and_ranking(target, eagle_path):
    """Which candidate the chain takes at step 1: a token the head disagrees with only below the veto threshold
    (``conf``); a candidate the head agrees with even when earlier ones are vetoed; with ``by_head`` the allowed
    candidate the head finds most probable."""
    toks = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    d, st = _fresh_head(target, eagle_path, toks)
    with torch.no_grad():
        own = d.draft(st, 4)[0][0].tolist()
    p0 = d.probs[0][0]  # (V,) the head's step-1 distribution
    top = float(p0.max())
    order = p0.argsort(descending=True).tolist()
    a, b = order[5], order[1]  # a less probable than b, neither the head's own
    def chain(cands, conf, by_head=False):
        hd, hst = _fresh_head(target, eagle_path, toks)
        K = len(cands)
        with torch.no_grad():
            return hd.draft_chain(hst, 4, _t(cands), torch.ones(1, K, 4, dtype=torch.bool),
                                  torch.tensor([conf], dtype=torch.float32), by_head=by_head)[0].tolist()

    never = [[2.0] * 4]
    assert chain([[a, 1, 2, 3]], never) == [a, 1, 2, 3]  # never vetoed: the candidate
    assert chain([[a, 1, 2, 3]], [[0.0] + [2.0] * 3]) == own  # must agree at step 1: the head alone
    assert chain([[a, 1, 2, 3]], [[top * 1.001] + [2.0] * 3]) == [a, 1, 2, 3]  # the head is less sure than that
    assert chain([[a, 1, 2, 3]], [[top * 0.999] + [2.0] * 3]) == own  # the head is surer: vetoed
    assert chain([[a, 1, 2, 3], [own[0], 7, 8, 9]], [[0.0] + [2.0] * 3] * 2) == [own[0], 7, 8, 9]  # agreement
    assert chain([[a, 1, 2, 3], [b, 4, 5, 6]], never * 2) == [a, 1, 2, 3]  # in order
    assert chain([[a, 1, 2, 3], [b, 4, 5, 6]], never * 2, by_head=True) == [b, 4, 5, 6]  # ranked by the head


@pytest.mark.parametrize("k,by_head", [(1, False), (8, True)])
def test_chain_policy_is_lossless_and_keeps_the_head_in_step(k, by_head, target, eagle_path):
    """Greedy + dense verification with ``policy="chain"`` equals dense decoding (ragged batch); with one candidate
    and no veto its drafts are ``replace``'s (same τ and acceptance), and in every round the head's drafts equal
    those of a fresh head prefilled on the same tokens and given the same candidates."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.verifiers import FullVerifier

    g = torch.Generator().manual_seed(2)
    base = torch.randint(0, 96, (6,), generator=g).tolist()
    prompts = [base * 4 + [5], (base[::-1] * 3)[:15], torch.randint(0, 96, (20,), generator=g).tolist()]
    inner = EagleDrafter(target, eagle_path)
    look = LookupDrafter(inner, 1, 3, policy="chain", candidates=k, by_head=by_head)
    seen = []
    orig = inner.draft_chain

    def spy(state, gamma, cand, cmask, conf, by_head=False):
        drafts = orig(state, gamma, cand, cmask, conf, by_head=by_head)
        seen.append(([list(t) for t in state.tokens], cand, cmask, conf, drafts.clone(), state.active.clone()))
        return drafts

    inner.draft_chain = spy
    dense = SpeculativeEngine(target, method="dense", eos_token_id=-1).generate(prompts, 20)
    res = SpeculativeEngine(target, look, FullVerifier(target), gamma=4, eos_token_id=-1).generate(prompts, 20)
    assert res.tokens == dense.tokens
    assert seen and look.stats()["matched"] > 0
    if k == 1:
        old = LookupDrafter(EagleDrafter(target, eagle_path), 1, 3)
        ref = SpeculativeEngine(target, old, FullVerifier(target), gamma=4, eos_token_id=-1).generate(prompts, 20)
        assert res.stats.acceptance_per_position == ref.stats.acceptance_per_position
    inner.draft_chain = orig
    for toks, cand, cmask, conf, drafts, active in seen[1:]:
        for b in range(len(prompts)):
            if not bool(active[b]):
                continue
            fresh = EagleDrafter(target, eagle_path)
            st = _chain_state(target, fresh, toks[b][:-1])
            with torch.no_grad():
                again = fresh.draft_chain(st, 4, cand[b : b + 1], cmask[b : b + 1], conf[b : b + 1], by_head=by_head)
            assert again[0].tolist() == drafts[b].tolist(), (b, toks[b][-6:])


def test_dustin_lookup_policy_options(target, eagle_path):
    from specdec import PipelineConfig, build_engine

    def drafter(**options):
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=64, options=dict(draft=str(eagle_path), **options))
        return build_engine(target, cfg).drafter

    d = drafter()  # the default: replace (chain drafted 2x slower on the H200 at B 64: docs page Dustin)
    assert (d.policy, d.candidates, d.veto, d.by_head, d.periodic) == ("replace", 1, None, False, True)
    assert d.keep == 16 and drafter(lookup_keep=None).keep is None and drafter(lookup_keep=0).keep == 0
    d = drafter(lookup_policy="chain")  # chain's defaults: one candidate, the head vetoes at 0.9
    assert (d.policy, d.candidates, d.veto, d.by_head) == ("chain", 1, 0.9, False)
    d = drafter(lookup_policy="chain", lookup_candidates=4, lookup_veto=0.5, lookup_by_head=True)
    assert (d.policy, d.candidates, d.veto, d.by_head) == ("chain", 4, 0.5, True)
    d = drafter(lookup_policy="replace")  # the drafting before: selectable with one option
    assert (d.policy, d.candidates, d.veto, d.by_head) == ("replace", 1, None, False)
    assert drafter(lookup_policy="chain", lookup_veto=None).veto is None
    for bad, msg in ((dict(lookup_policy="tree"), "unknown prompt lookup policy 'tree'"),
                     (dict(lookup_policy="replace", lookup_veto=0.5), "needs lookup_policy='chain'"),
                     (dict(lookup_policy="chain", lookup_veto=1.5), "0 < lookup_veto <= 1"),
                     (dict(lookup_policy="replace", lookup_candidates=3), "lookup_candidates=3")):
        with pytest.raises(SpecdecError, match=msg):
            drafter(**bad)


def test_chain_candidates_and_thresholds_per_sequence():
    """What ``policy="chain"`` hands the head, per sequence: candidates in order with their masks, a trusted match
    (n >= trust_n) never vetoed (or at ``veto``), a shorter one only where the head agrees at step 1, no candidate
    = the head's own draft; one candidate = only matches of n >= min_n."""
    from types import SimpleNamespace

    from specdec.interfaces import Drafter
    from specdec.lookup import LookupDrafter

    class Inner(Drafter):
        def prefill(self, state):
            pass

        def draft(self, state, gamma):
            return torch.full((len(state.tokens), gamma), 99), None

        def draft_chain(self, state, gamma, cand, cmask, conf, by_head=False):
            self.seen = (cand.clone(), cmask.clone(), conf.clone(), by_head)
            return torch.full((len(state.tokens), gamma), 99)

    toks = [[1, 2, 3, 4, 5, 3, 6, 1, 2, 3],  # (1, 2, 3) -> 4 5 3 6 (n 3); (3,) elsewhere -> 6 1 2 3 (n 1)
            [10, 11, 12, 13]]  # no match
    state = SimpleNamespace(tokens=toks, lengths=torch.tensor([10, 4]), sampling=SimpleNamespace(greedy=True))
    inner = Inner()
    look = LookupDrafter(inner, 2, 3, trust_n=3, policy="chain", candidates=3, veto=0.5)
    look.prefill(state)
    look.draft(state, 4)
    cand, cmask, conf, _ = inner.seen
    assert cand[0, :2].tolist() == [[4, 5, 3, 6], [6, 1, 2, 3]] and cmask[0].tolist() == [[True] * 4] * 2 + [[False] * 4]
    assert conf[0, 0].tolist() == [0.5] * 4 and conf[0, 1].tolist() == [0.0, 0.5, 0.5, 0.5]
    assert not cmask[1].any()
    look = LookupDrafter(inner, 2, 3, policy="chain")  # one candidate, trust_n = min_n: n 3 trusted, never vetoed
    look.prefill(state)
    look.draft(state, 4)
    assert inner.seen[0][:, 0].tolist() == [[4, 5, 3, 6], [0] * 4] and inner.seen[2][0, 0].tolist() == [2.0] * 4
    state.tokens = [[1, 2, 3, 4, 5, 3]]  # only (3,) matches: below min_n with one candidate -> the head's draft
    state.lengths = torch.tensor([6])
    look.prefill(state)
    inner.seen = None
    assert look.draft(state, 4)[0].tolist() == [[99] * 4] and inner.seen is None


def test_default_lookup_builds_dustins_drafter(monkeypatch):
    """``specdec.dustin.default_lookup`` (scripts that draft as Dustin does): Dustin's constants, the veto only with
    the ``chain`` policy (with ``replace`` a veto is refused)."""
    from specdec import dustin

    from specdec.eagle import EagleDrafter

    look = dustin.default_lookup(None)
    assert (look.min_n, look.max_n, look.trust_n) == (dustin.LOOKUP_MIN, dustin.LOOKUP_MAX, dustin.LOOKUP_TRUST)
    assert dustin.default_trust(object.__new__(EagleDrafter)) == dustin.LOOKUP_TRUST_EAGLE != dustin.LOOKUP_TRUST
    assert look.policy == dustin.LOOKUP_POLICY
    assert look.veto == (dustin.LOOKUP_VETO if dustin.LOOKUP_POLICY == "chain" else None)
    monkeypatch.setattr(dustin, "LOOKUP_POLICY", "chain")
    assert dustin.default_lookup(None).veto == dustin.LOOKUP_VETO


def test_lookup_host_benchmark_runs(capsys):
    """benchmarks/lookup_host_cpu.py at a tiny shape: it drafts every round and prints the median host time."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "lookup_host_cpu.py"
    spec = importlib.util.spec_from_file_location("lookup_host_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--batch", "2", "--context", "300", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert "lookup draft round, B 2 x 300" in out and "median" in out


# -- search="device": the same matches from a token buffer on the device ------------------------------------------------


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("min_n,max_n", [(1, 1), (1, 3), (2, 4), (3, 3)])
def test_device_search_finds_the_host_indexs_match_and_continuation(min_n, max_n, dev):
    """:func:`locate_batch` / :func:`continuation_batch` against :class:`NgramIndex` on ragged sequences of a small
    alphabet (many matches, of every length, near the end and not), periodic and not; anything after a sequence's end
    in the buffer is ignored."""
    from specdec.lookup import NgramIndex, continuation_batch, locate_batch

    g = torch.Generator().manual_seed(min_n * 10 + max_n)
    seqs = [torch.randint(0, v, (L,), generator=g).tolist() for v, L in
            ((3, 40), (5, 33), (50, 30), (2, 7), (4, 2), (6, 1), (3, max_n + 1), (9, 64))]
    seqs.append([1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3])
    W = 70
    toks = torch.randint(0, 3, (len(seqs), W), generator=g)  # junk past each end
    for b, t in enumerate(seqs):
        toks[b, : len(t)] = torch.tensor(t)
    toks, last = toks.to(dev), torch.tensor([len(t) - 1 for t in seqs], device=dev)
    e, n = locate_batch(toks, last, min_n, max_n)
    want = [NgramIndex(min_n, max_n).locate(t) for t in seqs]
    assert list(zip(e.tolist(), n.tolist())) == want
    assert any(x[1] == max_n for x in want) and any(x[1] == 0 for x in want)
    for periodic in (True, False):
        look, valid = continuation_batch(toks, last, e, n, 5, periodic)
        for b, t in enumerate(seqs):
            ref = NgramIndex.continuation(t, want[b][0], 5, periodic) if want[b][1] else []
            assert valid[b].tolist() == [True] * len(ref) + [False] * (5 - len(ref)), (b, periodic)
            assert look[b, : len(ref)].tolist() == ref, (b, periodic)


def test_device_search_drafts_and_keeps_what_the_host_search_does():
    """``LookupDrafter(search="device")`` and ``"host"``, round after round of appended tokens (ragged, new matches
    appearing): the same drafts, the same mask given to the inner drafter, the same kept lookahead mass and the same
    match count."""
    from types import SimpleNamespace

    from specdec.interfaces import Drafter
    from specdec.lookup import LookupDrafter

    class Inner(Drafter):
        def prefill(self, state):
            pass

        def draft(self, state, gamma):
            self.lookahead.zero_()
            return torch.full((len(state.tokens), gamma), 1), None  # agrees with some short matches' first token

        def drafts_replaced(self, state, drafts, mask):
            self.seen = (drafts.clone(), mask.clone())

    g = torch.Generator().manual_seed(4)
    out = {}
    for search in ("host", "device"):
        toks = [torch.randint(0, 4, (L,), generator=torch.Generator().manual_seed(L)).tolist() for L in (20, 9, 31)]
        inner = Inner()
        inner.lookahead = torch.zeros(3, 64)
        look = LookupDrafter(inner, 2, 4, trust_n=3, keep=2, search=search)
        state = SimpleNamespace(tokens=toks)
        look.prefill(state)
        rounds = []
        for r in range(8):
            drafts, _ = look.draft(state, 4)
            rounds.append((drafts.tolist(), inner.seen[1].tolist(), inner.lookahead.clone()))
            for b, t in enumerate(toks):  # 0-3 accepted drafts and one more token
                t += drafts[b, : (r + b) % 4].tolist() + [int(torch.randint(0, 4, (1,), generator=g))]
        g.manual_seed(4)
        out[search] = (rounds, look.stats()["matched"])
    for (d0, m0, la0), (d1, m1, la1) in zip(out["host"][0], out["device"][0]):
        assert d0 == d1 and m0 == m1
        assert torch.equal(la0, la1)
    assert out["host"][1] == out["device"][1] > 0
    with pytest.raises(SpecdecError, match="unknown lookup search 'gpu'"):
        LookupDrafter(Inner(), search="gpu")


@pytest.mark.parametrize("kind", ["eagle", "model"])
def test_device_search_is_lossless_in_the_engine(kind, target, eagle_path):
    """Greedy + dense verification with the device search equals dense decoding and the host search's run."""
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.verifiers import FullVerifier

    g = torch.Generator().manual_seed(2)
    base = torch.randint(0, 96, (6,), generator=g).tolist()
    prompts = [base * 4 + [5], (base[::-1] * 3)[:15]]
    dense = SpeculativeEngine(target, method="dense", eos_token_id=-1).generate(prompts, 20)
    runs = {}
    for search in ("host", "device"):
        look = LookupDrafter(_inner(kind, target, eagle_path), 1, 3, search=search)
        runs[search] = SpeculativeEngine(target, look, FullVerifier(target), gamma=4, eos_token_id=-1,
                                         adaptive=False).generate(prompts, 20)
        assert runs[search].tokens == dense.tokens
    assert runs["host"].stats.mean_accepted_length == runs["device"].stats.mean_accepted_length > 1.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_search_replays_one_graph_and_equals_the_host_search(eagle_path):
    """On a GPU with CUDA graphs the device round (search, continuation, merge, kept mass) is one graph replay: the
    same tokens and τ as the host search, and the same lookahead signal after the last round."""
    from specdec import BACKENDS
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.verifiers import FullVerifier

    m = make_tiny("llama", seed=3, num_hidden_layers=3)
    m.hf.cuda()
    m.backend = BACKENDS.build("triton")
    m.enable_cuda_graphs()
    g = torch.Generator().manual_seed(2)
    base = torch.randint(0, 96, (6,), generator=g).tolist()
    prompts = [base * 4 + [5], (base[::-1] * 3)[:15]]
    runs, signal = {}, {}
    for search in ("host", "device", "device"):  # the second device run replays the first one's graph
        look = LookupDrafter(EagleDrafter(m, eagle_path), 1, 3, keep=2, search=search)
        runs[search] = SpeculativeEngine(m, look, FullVerifier(m), gamma=4, eos_token_id=-1,
                                         adaptive=False).generate(prompts, 20)
        signal[search] = look.inner.lookahead.clone()
    m.disable_cuda_graphs()
    assert runs["host"].tokens == runs["device"].tokens
    assert runs["host"].stats.mean_accepted_length == runs["device"].stats.mean_accepted_length > 1.5
    assert torch.equal(signal["host"], signal["device"])
    assert look._calls is not None and look._calls.captures == 1 and look._calls.replays > 3
