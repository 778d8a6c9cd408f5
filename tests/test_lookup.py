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

    def spy(state, gamma):
        drafts, q = orig(state, gamma)
        seen.append(([list(t) for t in state.tokens], _signal(inner, drafts), state.active.clone()))
        return drafts, q

    _record(inner)
    inner.draft = spy
    dense = SpeculativeEngine(target, method="dense", eos_token_id=-1).generate(prompts, 20)
    # γ fixed: the lookup's matches and τ are checked (the adaptive controller may run dense steps instead)
    res = SpeculativeEngine(target, look, FullVerifier(target), gamma=4, eos_token_id=-1,
                            adaptive=False).generate(prompts, 20)
    assert res.tokens == dense.tokens
    st = look.stats()
    assert 0 < st["matched"] and res.stats.mean_accepted_length > 1.5, (st, res.stats.mean_accepted_length)
    inner.draft = orig
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
    assert isinstance(d, LookupDrafter) and (d.min_n, d.max_n, d.trust_n) == (2, 4, 2)
    assert isinstance(d.inner, EagleDrafter) and d.n_layers == 1  # forwarded
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
