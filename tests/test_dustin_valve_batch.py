"""Dustin's confidence valve re-verifies only the sequences whose margin fired: the others keep the sparse pass's
logits, K/V rows, hidden states, history signal and drafter scores, and read none of their context in the re-run.
So a sequence's output no longer depends on its batch-mates' margins (before, a re-run for one sequence rewrote every
sequence's K/V rows and history signal). Exact batch-versus-alone equality is checked with the default draft; with an
EAGLE head the history signal's float sums already differ at ~1e-8 between a batch and one sequence (without the valve
too), which can flip a selection, so the merge itself is checked with a stand-in target."""

import pytest
import torch

from specdec import PipelineConfig, build_engine

from conftest import make_tiny

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9, [11] * 20, list(range(50, 90))]


def _run(model, prompts, margin, **options):
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=8, sinks=2, recent=4, adaptive=False,
                              options={"margin": margin, **options})
    eng = build_engine(model, cfg, eos_token_id=-1)
    return eng.generate(prompts, max_new_tokens=16).tokens, eng.verifier.report()


def test_the_valve_gives_each_sequence_of_a_batch_what_it_gets_alone():
    model = make_tiny("llama")
    fired_some = False
    for margin in (0.02, 0.05, 0.1, 0.2):
        batch, report = _run(model, PROMPTS, margin)
        alone = [_run(model, [p], margin)[0][0] for p in PROMPTS]
        assert batch == alone, margin
        fired_some |= 0 < report["dense_margin"] < report["passes"] * len(PROMPTS)
    assert fired_some  # some re-verifications covered part of the batch only: the case this is about


@pytest.mark.parametrize("upto,few", [(0.5, 2), (0.25, 0)])
def test_the_valve_merges_per_sequence(monkeypatch, upto, few):
    """The valve's merge, with a stand-in target: sequences 0 and 2 have a small margin and get the re-run's logits,
    K/V rows, hidden states, history signal and drafter scores; 1 and 3 keep the sparse pass's, read nothing in the
    re-run (their live flags are off while it runs, and back on after) and count no KV read."""
    from types import SimpleNamespace

    import specdec.verifiers as verifiers
    from specdec.cache import KVCache
    from specdec.interfaces import ScoreRequest
    from specdec.verifiers import SparseVerifier

    monkeypatch.setattr(verifiers, "VALVE_FEW_LIVE_UPTO", upto)  # 2 fired of 4: the few-live launch up to half only

    B, T, V, L = 4, 3, 7, 12
    cache = KVCache(2, B, 1, L, 4)
    cache.live = torch.ones(B, dtype=torch.bool)
    lengths = torch.tensor([5, 6, 4, 7])
    state = SimpleNamespace(cache=cache, lengths=lengths, active=cache.live)
    cache.k.fill_(1.0)
    cache.v.fill_(1.0)
    seen = {}

    class Target:  # the re-run: writes 9s at every sequence's rows, records hidden states and scores
        last_hidden = torch.zeros(B, T, 2)

        def forward(self, tokens, c, lens, scores=()):
            seen["live"], seen["few_live"] = c.live.clone(), c.few_live
            for b in range(B):
                c.k[:, b, :, int(lens[b]) : int(lens[b]) + T] = 9.0
                c.v[:, b, :, int(lens[b]) : int(lens[b]) + T] = 9.0
            self.last_hidden = torch.full((B, T, 2), 9.0)
            for r in scores:
                r.scores = {0: torch.full((B, 1, L), 9.0)}
            return torch.full((B, T, V), 9.0)

    v = object.__new__(SparseVerifier)
    v.model, v.margin, v._stats = Target(), 0.5, {"dense_margin": 0}
    v.selector = SimpleNamespace(target_heads={})
    v._scores = torch.full((B, L), 2.0)
    tokens = torch.zeros(B, T, dtype=torch.long)  # draft 0 everywhere
    logits = torch.zeros(B, T, V)
    logits[:, :, 0] = torch.tensor([0.1, 3.0, 0.1, 3.0]).view(B, 1)  # greedy token 0 accepts: every row decides
    for b in range(B):  # the sparse pass wrote 5s at each sequence's rows
        cache.k[:, b, :, int(lengths[b]) : int(lengths[b]) + T] = 5.0
    drafter = ScoreRequest(rows=[0], scores={0: torch.full((B, 1, L), 2.0)})
    out, read = v._margin_valve(state, tokens, logits, drafter, torch.zeros(B, L))
    redo = torch.tensor([True, False, True, False])
    assert torch.equal(seen["live"], redo) and bool(cache.live.all())
    assert seen["few_live"] == few and cache.few_live == 0  # the re-run's attention serves the 2 fired alone
    assert torch.equal(out[:, 0, 0], torch.tensor([9.0, 3.0, 9.0, 3.0]))
    for b in range(B):
        rows = cache.k[:, b, :, int(lengths[b]) : int(lengths[b]) + T]
        assert bool((rows == (9.0 if redo[b] else 5.0)).all()), b
    assert torch.equal(v.model.last_hidden[:, 0, 0], torch.tensor([9.0, 0.0, 9.0, 0.0]))
    assert torch.equal(v._scores[:, 0], torch.tensor([0.0, 2.0, 0.0, 2.0]))  # no SRH heads: the re-run's signal is 0
    assert torch.equal(drafter.scores[0][:, 0, 0], torch.tensor([9.0, 2.0, 9.0, 2.0]))
    assert int(read) == 5 + 4 and v._stats["dense_margin"] == 2
