"""EAGLE draft head: the engine's draft equals the function training fits (steps 1 and 2), dense verification
and full-budget Dustin equal dense decoding (ragged batch), the hidden states survive a `Prefilled`, artifact
checks, and the shipped head is the embedded model's default draft."""

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.errors import SpecdecError

from conftest import make_tiny, tiny_llama_dir


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=3, num_hidden_layers=3)


@pytest.fixture(scope="module")
def artifact(target, tmp_path_factory):
    from specdec.artifacts import model_identity
    from specdec.eagle import EagleHead, save_eagle

    torch.manual_seed(0)
    head = EagleHead(target.hf.model.layers[-1], target.hf.config.hidden_size)
    with torch.no_grad():  # not the initial "feature itself": the test must see every weight
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("eagle") / "tiny-eagle.safetensors"
    save_eagle(path, head, dict(target=model_identity(target), layer_from=2))
    return path


@pytest.fixture(scope="module")
def fused_artifact(target, tmp_path_factory):
    """A head reading EAGLE-3-style fused features (layers 0 and 1 of the 3 besides the final hidden), every weight
    (``proj`` too) moved off its initial value."""
    from specdec.artifacts import model_identity
    from specdec.eagle import EagleHead, save_eagle

    torch.manual_seed(1)
    head = EagleHead(target.hf.model.layers[-1], target.hf.config.hidden_size, [0, 1])
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("eagle") / "tiny-eagle-fused.safetensors"
    save_eagle(path, head, dict(target=model_identity(target), layer_from=2, feature_layers=[0, 1]))
    return path


def _fp16_roundtrip_head(target, artifact):
    from specdec.eagle import build_head

    return build_head(target, artifact)[1]


@pytest.mark.parametrize("kind", ["plain", "fused"])
def test_engine_draft_equals_training_forward(target, kind, request):
    """Draft steps 1, 2 and 3 of the engine equal rows L-1, L, L+1 of the training forward's unrolled steps
    1, 2, 3 (recipe v2's exact training-time test; v1's approximation differs from step 3 on). ``fused``: a head
    reading several target layers, whose features the engine records with hooks and the training computes itself."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.train_eagle import features, head_forward

    artifact = request.getfixturevalue("artifact" if kind == "plain" else "fused_artifact")
    L = 17
    ids = torch.randint(0, 96, (1, L + 2), generator=torch.Generator().manual_seed(1))
    drafter = EagleDrafter(target, artifact)
    seen = []
    orig = drafter._logits
    drafter._logits = lambda f: seen.append(f.clone()) or orig(f)
    eng = SpeculativeEngine(target, drafter, gamma=2, eos_token_id=-1)
    res = eng.generate([ids[0, :L].tolist()], 1)  # one token from the prefill: drafting never runs
    assert seen == []
    first = res.tokens[0][0]
    # drive one draft by hand after the prefill (pending = the prefill's token)
    state, run = eng._start([ids[0, :L].tolist()], 8, None)
    with torch.no_grad():
        drafts, _ = drafter.draft(state, 3)
    assert len(seen) == 3
    full = torch.tensor([ids[0, :L].tolist() + [first, int(drafts[0, 0]), int(drafts[0, 1])]])
    f, _, _ = features(target.hf, full, 4, half=False, layers=drafter.head.feature_layers)
    assert f.shape[-1] == drafter.head.feature_width == target.hf.config.hidden_size * (3 if kind == "fused" else 1)
    with torch.no_grad():
        s1, s2, s3 = head_forward(target.hf, drafter.head, full, f, steps=3)
        v1 = head_forward(target.hf, drafter.head, full, f, steps=3, exact=False)
    assert torch.allclose(seen[0][0], s1[0, L - 1], atol=1e-4), (seen[0][0] - s1[0, L - 1]).abs().max()
    assert torch.allclose(seen[1][0], s2[0, L], atol=1e-4), (seen[1][0] - s2[0, L]).abs().max()
    assert torch.allclose(seen[2][0], s3[0, L + 1], atol=1e-4), (seen[2][0] - s3[0, L + 1]).abs().max()
    assert not torch.allclose(seen[1][0], s1[0, L], atol=1e-3)  # step 2 fed the predicted feature, not f_L
    assert torch.allclose(v1[1], s2, atol=1e-5) and not torch.allclose(v1[2][0, L + 1], s3[0, L + 1], atol=1e-3)


@pytest.mark.parametrize("kind", ["plain", "fused"])
def test_dense_verification_and_full_budget_dustin_equal_dense(target, kind, request):
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.verifiers import FullVerifier

    artifact = request.getfixturevalue("artifact" if kind == "plain" else "fused_artifact")
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
    want = dense.generate(prompts, 24).tokens
    eng = SpeculativeEngine(target, EagleDrafter(target, artifact), FullVerifier(target), gamma=3, eos_token_id=-1)
    assert eng.generate(prompts, 24).tokens == want
    assert eng.generate(prompts[1:], 24).tokens == want[1:]  # a batch gives what each sequence gives alone
    # the dense engine records nothing, also on a model an EAGLE drafter was built on (recording hooks change how a
    # fused model runs): the EAGLE engine's prefill records its features, a dense engine's are recomputed
    assert dense.prefill(prompts).hidden is None
    pre = eng.prefill(prompts)
    # (its own layers: the model's union outside the engine's calls may hold another head's, built by another test)
    width = target.hf.config.hidden_size * (1 + len(eng.drafter.records_hidden))
    assert pre.hidden is not None and pre.hidden.shape == (2, 37, width)
    assert eng.generate(prompts, 24, prefilled=pre).tokens == want
    assert eng.generate(prompts, 24, prefilled=dense.prefill(prompts)).tokens == want
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=10_000, sinks=2, recent=4, options={"draft": str(artifact)})
    eng = build_engine(target, cfg, eos_token_id=-1)
    from specdec.lookup import LookupDrafter

    assert isinstance(eng.drafter, LookupDrafter) and isinstance(eng.drafter.inner, EagleDrafter)  # lookup: default
    assert eng.generate(prompts, 24).tokens == want


def test_prompt_features_recomputed_without_recorded_hidden(target, artifact):
    """A `Prefilled` without hidden states (made before any EAGLE drafter): the drafter recomputes them."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.verifiers import FullVerifier

    other = make_tiny("llama", seed=3, num_hidden_layers=3)  # same weights, never seen an EAGLE drafter
    prompts = [list(range(3, 30))] * 2
    dense = build_engine(other, PipelineConfig.make(method="dense"), eos_token_id=-1)
    pre = dense.prefill(prompts)
    assert pre.hidden is None
    d = EagleDrafter(other, artifact)
    # γ fixed: the two calls' τ are compared (an adaptive γ follows each call's timing)
    eng = SpeculativeEngine(other, d, FullVerifier(other), gamma=3, eos_token_id=-1, adaptive=False)
    a = eng.generate(prompts, 16, prefilled=pre)
    b = eng.generate(prompts, 16)
    assert a.tokens == b.tokens == dense.generate(prompts, 16).tokens
    assert a.stats.mean_accepted_length == b.stats.mean_accepted_length  # same drafts: same features


def test_fused_head_started_from_a_plain_one_drafts_the_same(target, artifact, fused_artifact):
    """A fused-feature head whose weights come from a plain head (``train(init=...)``: ``proj`` at zero) predicts
    exactly what the plain head predicts, at every unrolled step; the artifact's layers are checked on load."""
    from specdec.eagle import EagleHead, build_head
    from specdec.train_eagle import _init_weights, features, head_forward

    _, plain = build_head(target, artifact)
    fused = EagleHead(target.hf.model.layers[-1], target.hf.config.hidden_size, [0, 1])
    weights, info = _init_weights(target, artifact, [0, 1])
    assert info["file"] == artifact.name
    fused.load_state_dict(weights, strict=False)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    f, _, _ = features(target.hf, ids, 4, half=False)
    F, _, _ = features(target.hf, ids, 4, half=False, layers=[0, 1])
    assert torch.equal(F[..., : f.shape[-1]], f)
    with torch.no_grad():
        for a, b in zip(head_forward(target.hf, plain, ids, f, steps=3), head_forward(target.hf, fused, ids, F, steps=3)):
            assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(SpecdecError, match="fuses layers"):
        _init_weights(target, fused_artifact, [1])


def test_plain_and_fused_heads_share_one_target(artifact, fused_artifact, tmp_path):
    """Two EAGLE drafters on one model, one reading fused features: the model records the union of their layers and
    each takes its own columns, so each drafts exactly as it does alone (same τ), a `Prefilled` made before the
    fused head existed included."""
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.verifiers import FullVerifier

    prompts = [list(range(3, 30)), [5, 9, 17, 33, 2, 8] * 5]

    def run(model, d, **kw):  # tokens, τ and every draft logit row the head computed
        seen, orig = [], type(d)._logits
        d._logits = lambda f: seen.append(orig(d, f)) or seen[-1]
        eng = SpeculativeEngine(model, d, FullVerifier(model), gamma=3, eos_token_id=-1, adaptive=False)
        try:
            r = eng.generate(prompts, 16, **kw)
        finally:
            del d._logits
        return r.tokens, r.stats.mean_accepted_length, torch.cat(seen).round(decimals=4).tolist()

    alone = {}
    for name, art in (("plain", artifact), ("fused", fused_artifact)):
        m = make_tiny("llama", seed=3, num_hidden_layers=3)
        alone[name] = run(m, EagleDrafter(m, art))
    shared = make_tiny("llama", seed=3, num_hidden_layers=3)
    plain = EagleDrafter(shared, artifact)
    pre = build_engine(shared, PipelineConfig.make(method="dense"), eos_token_id=-1).prefill(prompts)
    fused = EagleDrafter(shared, fused_artifact)
    assert shared.hidden_layers == (0, 1)
    from specdec.artifacts import model_identity
    from specdec.eagle import EagleHead, save_eagle

    third = EagleHead(shared.hf.model.layers[-1], shared.hf.config.hidden_size, [2])  # widens the union: (0, 1, 2)
    save_eagle(tmp_path / "third.safetensors", third, dict(target=model_identity(shared), layer_from=2,
                                                           feature_layers=[2]))
    EagleDrafter(shared, tmp_path / "third.safetensors")
    assert shared.hidden_layers == (0, 1, 2)
    assert run(shared, plain) == alone["plain"] and run(shared, fused) == alone["fused"]
    assert run(shared, fused, prefilled=pre) == alone["fused"]  # recorded before the layers were added: recomputed
    # each engine records its own drafter's layers: a Prefilled of the fused head's engine is recorded with layers
    # (0, 1), used by it and recomputed by the plain head's (no layers) and by the third head's
    pre = SpeculativeEngine(shared, fused, FullVerifier(shared), gamma=3, eos_token_id=-1).prefill(prompts)
    assert pre.hidden.shape[-1] == 3 * shared.hf.config.hidden_size
    assert run(shared, fused, prefilled=pre) == alone["fused"]
    assert run(shared, plain, prefilled=pre) == alone["plain"]
    assert alone["plain"][0] == alone["fused"][0]  # dense verification: both emit dense greedy's tokens


def test_artifact_checks(target, artifact, tmp_path):
    from specdec.eagle import is_eagle

    assert is_eagle(artifact)
    other = make_tiny("llama", seed=4, num_hidden_layers=3)
    with pytest.raises(SpecdecError, match="trained for"):
        build_engine(other, PipelineConfig.make(method="dustin", budget=12, options={"draft": str(artifact)}))
    with pytest.raises(SpecdecError, match="no eagle draft ships"):
        build_engine(target, PipelineConfig.make(method="dustin", budget=12, options={"draft": "eagle"}))
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not a safetensors file")
    assert not is_eagle(bad)


def test_graph_step_key_includes_hidden(target):
    from specdec.graphs import describe_step

    cache = target.new_cache(1, 8)
    x = torch.tensor([[1, 2]])
    target.keep_hidden, target.hidden_layers = False, ()  # (a fused head built earlier on this model set them)
    a = describe_step(target, x, cache, None, (), 0)
    target.keep_hidden = True
    try:
        b = describe_step(target, x, cache, None, (), 0)
    finally:
        target.keep_hidden = False
    assert a != b and b.hidden
    target.keep_hidden, target.hidden_layers = True, (0, 1)
    try:  # a fused-feature head's forwards record more: other graphs
        c = describe_step(target, x, cache, None, (), 0)
    finally:
        target.keep_hidden, target.hidden_layers = False, ()
    assert c != b and c.hidden_layers == (0, 1)


def test_shipped_eagle_head_is_the_default_draft(target, artifact, tmp_path, monkeypatch):
    """With an EAGLE head and a layer-skip adapter shipped for the target, Dustin's default is the EAGLE head;
    `draft=skip` / `draft=eagle` pick each; with only the adapter shipped the default is the adapter."""
    import shutil

    from specdec import train_draft
    from specdec.artifacts import model_identity
    from specdec.eagle import EagleDrafter
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import SkipAdapter, save_draft

    monkeypatch.setattr(train_draft, "DRAFTS_DIR", tmp_path)
    save_draft(tmp_path / "tiny.safetensors", SkipAdapter(64, 8), dict(k=1, t=1, rank=8, target=model_identity(target)))

    def drafter(**options):
        from specdec.lookup import base_drafter

        return base_drafter(build_engine(target, PipelineConfig.make(method="dustin", gamma=3, budget=12,
                                                                     options=options)).drafter)

    assert isinstance(drafter(), SkipLayerDrafter)
    shutil.copy(artifact, tmp_path / "tiny-eagle.safetensors")
    assert isinstance(drafter(), EagleDrafter) and isinstance(drafter(draft="eagle"), EagleDrafter)
    assert isinstance(drafter(draft="skip"), SkipLayerDrafter)


def test_train_eagle_smoke_and_cli_errors(tmp_path):
    """train() on a tiny Llama (the embedded tokenizer) writes a head the drafter loads; bad CLI input is one line."""
    from typer.testing import CliRunner

    from specdec.cli import app
    from specdec.eagle import EagleDrafter, read_meta
    from specdec.models import SpecdecModel
    from specdec.train_eagle import train

    d = tiny_llama_dir(tmp_path, layers=2)
    out = tmp_path / "e.safetensors"
    # collecting the 512 tokens' features may take most of the budget (CPU time inflates on a loaded 2-core box: with
    # 40 % of 9 s a CI run once collected 256)
    res = train(str(d), tokens=512, eval_tokens=128, seq=64, batch=4, minutes=0.3, collect_share=0.9, out=out,
                log=lambda s: None)
    assert res["epochs"] >= 1 and res["tokens"] == 512 and len(res["heldout_top1"]) == 3 and res["recipe"] == "v2"
    assert res["history"][-1]["loss"] < res["history"][0]["loss"] + 1e-6
    assert read_meta(out)["kind"] == "eagle"
    full = train(str(d), tokens=256, eval_tokens=64, seq=32, batch=4, minutes=0.1, collect_share=0.9, teacher="full",
                 steps=2, recipe="v4", log=lambda s: None)  # the full-vocabulary KL (the GPU's default) and v4 run too
    assert full["recipe_settings"]["teacher"] == "full" and len(full["heldout_top1"]) == 2
    assert full["tokens"] > 0 and full["selfgen_rows"] > 0 and "heldout_selfgen_top1" in full["history"][-1]
    six = train(str(d), tokens=2048, eval_tokens=64, seq=32, batch=4, minutes=0.1, collect_share=0.9, recipe="v6",
                log=lambda s: None)  # v6: prose rows with sampled continuations in every third slot
    assert six["genprose_rows"] > 0 and list(six["recipe_settings"]["genprose"]) == [256, 192, 0.8, 3]
    none = train(str(d), tokens=256, eval_tokens=64, seq=32, batch=4, minutes=0.05, collect_share=0.0, log=lambda s: None)
    assert none["tokens"] == 4 * 32  # no collection budget: still one batch, not a head trained on nothing
    EagleDrafter(SpecdecModel.from_pretrained(str(d)), out)
    r = CliRunner().invoke(app, ["train-draft", "--kind", "medusa"])
    assert r.exit_code == 2 and "--kind must be eagle or skip" in r.output
    # v5 (fused features) warm-started from the plain head just written
    warm = train(str(d), tokens=256, eval_tokens=64, seq=32, batch=4, minutes=0.05, collect_share=0.9, recipe="v5",
                 init=out, out=tmp_path / "w.safetensors", log=lambda s: None)
    assert warm["feature_layers"] == [1] and read_meta(tmp_path / "w.safetensors")["feature_layers"] == [1]
    assert warm["recipe_settings"]["init"]["file"] == out.name  # where the weights started is recorded
    assert EagleDrafter(SpecdecModel.from_pretrained(str(d)), tmp_path / "w.safetensors").head.feature_width == 2 * 64
    with pytest.raises(SpecdecError, match="fuses layers"):  # a fused head cannot start a plain one
        train(str(d), tokens=256, minutes=0.05, init=tmp_path / "w.safetensors", log=lambda s: None)
    r = CliRunner().invoke(app, ["train-draft", "--full-vocab", "0.5"])
    assert r.exit_code == 2 and "--full-vocab is for --kind skip" in r.output
    r = CliRunner().invoke(app, ["train-draft", "--recipe", "v9", "--out", str(tmp_path / "x.safetensors")])
    assert r.exit_code == 2 and "--recipe must be one of v1, v2, v3, v4, v5, v6" in r.output
    r = CliRunner().invoke(app, ["train-draft", "--kind", "skip", "--seq", "512", "--out", str(tmp_path / "x.safetensors")])
    assert r.exit_code == 2 and "--seq is for --kind eagle" in r.output


@pytest.mark.parametrize("setting", ["T1", "T0.7-top_p0.8"])
def test_sampling_with_the_eagle_head_follows_the_target(setting, tmp_path):
    """Lossless sampling with the EAGLE drafter + dense verification (chi-square against the exact law of
    3-token continuations, as in tests/test_lossless_stats.py, whose fixtures' recipe is reused here)."""
    from test_lossless_stats import K, N, PROMPT, SETTINGS, V, exact_joint, goodness_of_fit

    from specdec.artifacts import model_identity
    from specdec.eagle import EagleDrafter, EagleHead, save_eagle
    from specdec.engine import SpeculativeEngine
    from specdec.sampling import SamplingConfig
    from specdec.verifiers import FullVerifier

    import itertools

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
    cfg = SamplingConfig(**SETTINGS[setting], seed=1234)
    eng = SpeculativeEngine(m, EagleDrafter(m, path), FullVerifier(m), gamma=3, sampling=cfg, eos_token_id=-1)
    res = eng.generate([PROMPT] * N, max_new_tokens=K)
    seqs = torch.tensor(res.tokens)
    flat = (seqs * torch.tensor([V ** (K - 1 - k) for k in range(K)])).sum(1)
    counts = torch.bincount(flat, minlength=V ** K).double().view((V,) * K)
    probs = exact_joint(nxt, cfg)
    pval, tv, _ = goodness_of_fit(counts, probs)
    p1, tv1, _ = goodness_of_fit(counts.sum(dim=(1, 2)), probs.sum(dim=(1, 2)))
    assert pval > 1e-3 and p1 > 1e-3 and tv1 < 0.03, (pval, p1, tv1)
    assert 1.05 < res.stats.mean_accepted_length < 3.5  # drafts both accepted and rejected


@pytest.mark.slow
def test_shipped_eagle_head_is_default_and_accepted(smol):
    """The EAGLE head shipped for the embedded model (trained on the H200, float16) is Dustin's default draft and
    `draft=eagle`; it fits the 10 MB package budget; it is the recipe-v6 head (fused features of layers 2 and 15)
    of the 7.7-minute H200 run started from the earlier recipe-v5 head (its metadata: 3,305,472 tokens, 4,444 steps;
    docs/dustin.md has the provenance); in float32 on the CPU,
    with dense verification on a held-out module, it is lossless and accepted more often than the shipped
    layer-skipping draft."""
    from specdec.data import context_ids, load_document
    from specdec.eagle import EagleDrafter, read_meta
    from specdec.engine import SpeculativeEngine
    from specdec.sampling import SamplingConfig
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import DRAFTS_DIR, shipped_draft
    from specdec.verifiers import FullVerifier

    path = shipped_draft(smol, "eagle")
    assert path == DRAFTS_DIR / "smollm2-135m-eagle.safetensors" and shipped_draft(smol) == path
    meta = read_meta(path)
    assert path.stat().st_size < 10 * 2**20 and meta["kind"] == "eagle"
    assert (meta.get("recipe"), meta["tokens"], meta["optimizer_steps"], meta["feature_layers"]) == (
        "v6", 3_305_472, 4444, [2, 15]), meta
    assert meta["recipe_settings"]["init"]["recipe"] == "v5" and meta["model"] == "smollm2-135m"
    for options in ({}, {"draft": "eagle"}):
        eng = build_engine(smol, PipelineConfig.make(method="dustin", gamma=4, budget=64, options=options))
        from specdec.lookup import base_drafter

        assert isinstance(base_drafter(eng.drafter), EagleDrafter) and eng.drafter.path == path
    ids = context_ids(smol.tokenizer, load_document("stdlib:argparse"), 512, offset=80)
    drafters = {"eagle": EagleDrafter(smol, path), "skip": SkipLayerDrafter(smol, shipped_draft(smol, "skip"))}
    dense = SpeculativeEngine(smol, method="dense", eos_token_id=-1)
    pre = dense.prefill([ids])
    ref = dense.generate([ids], 32, prefilled=pre)
    tau = {}
    for name, d in drafters.items():
        spec = SpeculativeEngine(smol, d, FullVerifier(smol), gamma=4, sampling=SamplingConfig(), method=name,
                                 eos_token_id=-1, adaptive=False)  # τ of two drafters at the same fixed γ
        res = spec.generate([ids], 32, prefilled=pre)
        assert res.tokens == ref.tokens  # dense verification: lossless
        tau[name] = res.stats.mean_accepted_length
    assert tau["eagle"] > tau["skip"], tau


def test_packed_chunks_keep_short_texts():
    """``_chunks(pack=True)`` (recipe v3): texts shorter than a sequence run on into the next row instead of being
    dropped, a blank line between texts; without it only whole rows of long texts count."""
    from specdec.train_draft import _chunks

    class Tok:  # one id per character
        def __call__(self, texts, add_special_tokens=False):
            one = isinstance(texts, str)
            ids = [[ord(c) for c in t] for t in ([texts] if one else texts)]
            return type("E", (), {"input_ids": ids[0] if one else ids})()

    texts = [("a", "abc"), ("b", "defgh"), ("c", "ij"), ("d", "klmnopqrs")]
    assert _chunks(Tok(), texts, 4, 100).tolist() == [[ord(c) for c in "defg"], [ord(c) for c in "klmn"],
                                                      [ord(c) for c in "opqr"]]
    packed = ["".join(chr(i) for i in row) for row in _chunks(Tok(), texts, 4, 100, pack=True).tolist()]
    assert packed == ["abc\n", "\ndef", "gh\n\n", "ij\n\n", "klmn", "opqr"]  # "s\n\n" is short of a row
    assert len(_chunks(Tok(), texts, 4, 8, pack=True)) == 2  # max_tokens


def test_self_generated_rows_continue_greedily(target):
    """Recipe v4's rows (:func:`specdec.train_eagle.self_generate`): each segment is the row's own text, then the
    target's greedy continuation of everything before it in the row — the engine's dense greedy tokens."""
    from specdec.engine import SpeculativeEngine
    from specdec.train_eagle import self_generate

    torch.manual_seed(1)
    ids = torch.randint(0, target.hf.config.vocab_size, (3, 48))
    out, done = self_generate(target, ids, 16, 5, 2)
    assert done == 3 and out.shape == ids.shape
    dense = SpeculativeEngine(target, method="dense", eos_token_id=-1)
    for r in range(3):
        for c in range(3):
            real = out[r, c * 16 : c * 16 + 11].tolist()
            assert real == ids[r, c * 11 : (c + 1) * 11].tolist()  # the text runs on where it was cut
            ref = dense.generate([out[r, : c * 16 + 11].tolist()], 5).tokens[0]
            assert out[r, c * 16 + 11 : (c + 1) * 16].tolist() == ref, (r, c)
    rows, n = self_generate(target, ids, 16, 5, 2, stop=lambda: True)
    assert n == 2 and torch.equal(rows[:2], out[:2]) and torch.equal(rows[2:], ids[2:])  # the first batch, then stop
    with pytest.raises(SpecdecError, match="tile the sequence length 48"):
        self_generate(target, ids, 20, 5, 2)


def test_self_generated_rows_sample_at_temperature(target):
    """Recipe v6's sampled continuations: with ``temperature`` the generated token follows the target's tempered
    next-token distribution (400 draws of one context against ``softmax(logits / t)``: each of the likeliest tokens
    within 4.5 standard errors, and the total variation small), the text part is kept, and a tiny temperature is
    greedy."""
    from specdec.train_eagle import self_generate

    torch.manual_seed(2)
    ctx = torch.randint(0, target.hf.config.vocab_size, (1, 16))
    ids = ctx.expand(400, -1).clone()
    with torch.no_grad():
        logits = target.hf(ctx[:, :15]).logits[0, -1].float()
    t = 0.7
    p = torch.softmax(logits / t, -1)
    torch.manual_seed(3)
    out, done = self_generate(target, ids, 16, 1, 400, temperature=t)
    assert done == 400 and torch.equal(out[:, :15], ids[:, :15])
    freq = torch.bincount(out[:, 15], minlength=p.numel()).float() / 400
    top = torch.topk(p, 8).indices
    se = (p[top] * (1 - p[top]) / 400).sqrt()
    assert ((freq[top] - p[top]).abs() <= 4.5 * se + 1e-3).all(), (freq[top], p[top])
    assert 0.5 * (freq - p).abs().sum() < 0.35  # 400 draws of a spread distribution: TV far below 1
    greedy, _ = self_generate(target, ids[:3], 16, 1, 3)
    cold, _ = self_generate(target, ids[:3], 16, 1, 3, temperature=1e-4)
    assert torch.equal(cold, greedy)
    with pytest.raises(SpecdecError, match="temperature must be >= 0"):
        self_generate(target, ids[:1], 16, 1, 1, temperature=-1.0)


@pytest.mark.parametrize("method", ["dustin", "dustin-adaptive"])
def test_draft_ahead_starts_the_next_draft_before_the_host_emits(target, artifact, monkeypatch, method):
    """Dustin (fixed γ, greedy) starts each next EAGLE draft right after the verification's commit, before the host
    has appended the iteration's tokens (the host lists are shorter then than at the next draft), and the tokens
    equal those of the same engine without the early start (sparse verification: its own text, equal either way;
    ``dustin-adaptive`` adapts its split from the last draft's signal, which the early start must not overwrite)."""
    from specdec.eagle import EagleDrafter

    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    cfg = PipelineConfig.make(method=method, gamma=3, budget=12, sinks=2, recent=4, options={"draft": str(artifact)})
    eng = build_engine(target, cfg, eos_token_id=-1)
    starts, drafts = [], []
    real_ahead, real_draft = EagleDrafter.draft_ahead, eng.drafter.draft

    def ahead(self, state, gamma):
        starts.append(sum(map(len, state.tokens)))
        return real_ahead(self, state, gamma)

    def draft(state, gamma):
        drafts.append(sum(map(len, state.tokens)))
        return real_draft(state, gamma)

    monkeypatch.setattr(EagleDrafter, "draft_ahead", ahead)
    eng.drafter.draft = draft
    res = eng.generate(prompts, 24)
    assert len(starts) == len(drafts) == res.stats.iterations  # the last start is not used: generation ended
    assert all(s < d for s, d in zip(starts, drafts[1:]))  # started before the tokens were on the host
    monkeypatch.setattr(EagleDrafter, "draft_ahead", lambda self, state, gamma: None)
    assert eng.generate(prompts, 24).tokens == res.tokens


def test_train_eagle_writes_the_best_epoch_and_warns_below_its_init(tmp_path, monkeypatch):
    """Finding 37 of a new user's walk: a warm-started run wrote a head worse than its ``--init`` without a word, and
    a run whose first epoch was better than its last wrote the last. The best epoch's head is written (held-out top-1
    averaged over the unrolled steps) and a ``warning:`` line says when it is still below the init's."""
    from safetensors.torch import load_file
    import specdec.train_eagle as te
    from specdec.eagle import read_meta

    d = tiny_llama_dir(tmp_path, layers=2)
    first = tmp_path / "first.safetensors"
    te.train(str(d), tokens=128, eval_tokens=64, seq=32, batch=4, minutes=0.03, collect_share=0.5, out=first,
             log=lambda s: None)
    scores, seen = iter([0.9, 0.5] + [0.2] * 10_000), []  # the --init head, epoch 1, every later epoch

    def scripted(hf, head, data, steps, exact=True):
        seen.append({k: v.detach().to(torch.float16).clone() for k, v in head.state_dict().items()})
        return [next(scores)] * steps

    monkeypatch.setattr(te, "heldout_agreement", scripted)
    out, logs = tmp_path / "again.safetensors", []
    res = te.train(str(d), tokens=128, eval_tokens=64, seq=32, batch=4, minutes=0.05, collect_share=0.5, out=out,
                   init=first, log=logs.append)
    assert res["epochs"] >= 2, res["epochs"]  # else there is no later, worse epoch to skip
    meta = read_meta(out)
    assert meta["kept_epoch"] == 1 and meta["heldout_top1"] == [0.5] * 3 and meta["heldout_top1_init"] == [0.9] * 3
    written = load_file(str(out))
    assert all(torch.equal(written[k], seen[1][k]) for k in written)  # epoch 1's weights, not the last epoch's
    assert any(s.startswith("kept epoch 1's head") for s in logs), logs
    warn = [s for s in logs if s.startswith("warning:")]
    assert warn == ["warning: the written head's held-out top-1 (0.500, 0.500, 0.500) is below its --init's "
                    "(0.900, 0.900, 0.900); train longer (--minutes) or keep the --init head."], logs
