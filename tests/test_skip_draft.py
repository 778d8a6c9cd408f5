"""Layer-skipping trained draft: training forward == engine forward, full-budget Dustin == dense, artifact checks,
tokenizer check by token->id map, and the shipped draft is the embedded model's default and is accepted."""

from types import SimpleNamespace

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.errors import SpecdecError

from conftest import make_tiny, tiny_llama_dir


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=3, num_hidden_layers=6)


@pytest.fixture(scope="module")
def artifact(target, tmp_path_factory):
    from specdec.artifacts import model_identity
    from specdec.train_draft import SkipAdapter, save_draft

    torch.manual_seed(0)
    ad = SkipAdapter(64, 32)
    torch.nn.init.normal_(ad.w2.weight, std=0.05)  # not the identity: the test must see the adapter
    path = tmp_path_factory.mktemp("draft") / "tiny.safetensors"
    save_draft(path, ad, dict(k=2, t=2, rank=32, target=model_identity(target)))
    return path


def test_training_forward_equals_engine_draft(target, artifact):
    """The draft the engine runs is the function training fits: row L of the training forward (target K/V
    before L, the draft's own at L) equals the drafter's logits for the pending token at position L."""
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import _draft_layer, build_adapter

    drafter = SkipLayerDrafter(target, artifact)
    ids = torch.randint(0, 96, (2, 21), generator=torch.Generator().manual_seed(1))
    L = 20
    cache = target.new_cache(2, 32)
    target.forward(ids[:, :L], cache, torch.zeros(2, dtype=torch.long))
    got = drafter.draft_model.forward(ids[:, L:], cache, torch.full((2,), L))[:, -1]
    # training path
    hf = target.hf
    m = hf.model
    pos = torch.arange(L + 1).view(1, -1).expand(2, -1)
    x = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(x, pos)
    from specdec.train_draft import _target_layer

    kv = []
    with torch.no_grad():
        for i, layer in enumerate(m.layers):
            if i == 2:
                hk = x
            x, k_i, v_i = _target_layer(layer, x, cos, sin)
            kv.append((k_i, v_i))
        _, ad = build_adapter(target, artifact)
        y = ad(hk)
        for j in (4, 5):
            y = _draft_layer(m.layers[j], y, kv[j][0], kv[j][1], cos, sin)
        want = hf.lm_head(m.norm(y))[:, L]
        dense = hf.lm_head(m.norm(x))[:, L]
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert not torch.allclose(got, dense, atol=1e-2)  # the draft is not the target


def test_full_budget_dustin_with_skip_draft_equals_dense(target, artifact):
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 24)
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=10_000, sinks=2, recent=4, options={"draft": str(artifact)})
    eng = build_engine(target, cfg, eos_token_id=-1)
    from specdec.skip_drafter import SkipLayerDrafter

    from specdec.lookup import base_drafter

    assert isinstance(base_drafter(eng.drafter), SkipLayerDrafter)  # under prompt lookup (Dustin's default)
    res = eng.generate(prompts, 24)
    assert res.tokens == dense.tokens


def test_artifact_checks(target, artifact, tmp_path):
    other = make_tiny("llama", seed=4, num_hidden_layers=6)
    with pytest.raises(SpecdecError, match="trained for"):
        build_engine(other, PipelineConfig.make(method="dustin", budget=12, options={"draft": str(artifact)}))
    with pytest.raises(SpecdecError, match="exclude each other"):
        build_engine(target, PipelineConfig.make(method="dustin", budget=12, options={"draft": str(artifact), "draft_layers": 2}))
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(SpecdecError, match="could not read draft artifact"):
        build_engine(target, PipelineConfig.make(method="dustin", budget=12, options={"draft": str(bad)}))
    with pytest.raises(SpecdecError, match="does not exist"):
        build_engine(target, PipelineConfig.make(method="dustin", budget=12, options={"draft": str(tmp_path / "none")}))


def test_tokenizer_checked_by_token_to_id_map():
    from specdec.drafters import check_same_tokenizer

    def fake(vocab):
        return SimpleNamespace(dims=SimpleNamespace(vocab_size=len(vocab)), tokenizer=SimpleNamespace(get_vocab=lambda: dict(vocab)))

    a = {"a": 0, "b": 1, "c": 2}
    check_same_tokenizer(fake(a), fake(dict(a)))
    with pytest.raises(SpecdecError, match="maps tokens to ids differently"):
        check_same_tokenizer(fake(a), fake({"a": 1, "b": 0, "c": 2}))  # same size, other ids
    with pytest.raises(SpecdecError, match="vocabulary of 2"):
        check_same_tokenizer(fake(a), fake({"a": 0, "b": 1}))


@pytest.mark.slow
def test_shipped_draft_is_default_and_accepted(smol):
    """The embedded model's shipped layer-skip draft is Dustin's `draft=skip` (the EAGLE head is the default,
    tests/test_eagle.py); with dense verification on held-out code it
    is lossless and accepted more often than the untrained early exit of about the same cost (9 layers)."""
    from specdec.data import load_document
    from specdec.drafters import EarlyExitDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.sampling import SamplingConfig
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import shipped_draft
    from specdec.verifiers import FullVerifier

    path = shipped_draft(smol, "skip")
    assert path is not None and path.stat().st_size < 10 * 2**20
    eng = build_engine(smol, PipelineConfig.make(method="dustin", gamma=4, budget=64, options={"draft": "skip"}))
    from specdec.lookup import base_drafter

    assert isinstance(base_drafter(eng.drafter), SkipLayerDrafter) and eng.drafter.path == path
    ids = smol.tokenizer(load_document("stdlib:textwrap"), add_special_tokens=False).input_ids[2000:2256]
    dense = build_engine(smol, PipelineConfig.make(method="dense"), eos_token_id=-1).generate([ids], 40)
    tau = {}
    for name, d in (("trained", SkipLayerDrafter(smol, path)), ("early-exit", EarlyExitDrafter(smol, 9))):
        spec = SpeculativeEngine(smol, d, FullVerifier(smol), gamma=4, sampling=SamplingConfig(), method=name,
                                 eos_token_id=-1, adaptive=False)  # τ of two drafters at the same fixed γ
        res = spec.generate([ids], 40)
        assert res.tokens == dense.tokens  # dense verification: lossless
        tau[name] = res.stats.mean_accepted_length
    assert tau["trained"] > tau["early-exit"], tau


def test_train_draft_smoke_and_cli_errors(tmp_path):
    """train() on a tiny Llama (the embedded tokenizer) writes an artifact the drafter loads; bad CLI input is one line."""
    from typer.testing import CliRunner

    from specdec.cli import app
    from specdec.models import SpecdecModel
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import load_draft, train

    d = tiny_llama_dir(tmp_path, layers=4)
    out = tmp_path / "d.safetensors"
    res = train(str(d), k=1, t=2, rank=16, tokens=512, eval_tokens=256, seq=64, batch=4, minutes=0.2, out=out,
                log=lambda s: None)
    assert res["epochs"] >= 1 and res["history"][-1]["loss"] < res["history"][0]["loss"] + 1e-6
    meta, tensors = load_draft(out)
    assert (meta["k"], meta["t"], meta["rank"]) == (1, 2, 16) and tensors["w1.weight"].dtype == torch.float16
    SkipLayerDrafter(SpecdecModel.from_pretrained(str(d)), out)
    r = CliRunner().invoke(app, ["train-draft", "--k", "0"])
    assert r.exit_code == 2 and "--k must be >= 1" in r.output


def test_train_skip_writes_the_best_epoch_and_warns_below_the_start(tmp_path, monkeypatch):
    """Finding 37, the layer-skipping draft: the last epoch was written even when an earlier one was better, and a
    draft worse than where it started was written without a word."""
    import specdec.train_draft as td

    d = tiny_llama_dir(tmp_path, layers=4)
    scores, seen = iter([0.9, 0.5] + [0.2] * 10_000), []  # before training, epoch 1, every later epoch

    def scripted(hf, adapter, data, t):
        seen.append({k: v.detach().to(torch.float16).clone() for k, v in adapter.state_dict().items()})
        return next(scores)

    monkeypatch.setattr(td, "full_agreement", scripted)
    out, logs = tmp_path / "d.safetensors", []
    res = td.train(str(d), k=1, t=2, rank=16, tokens=256, eval_tokens=128, seq=64, batch=4, minutes=0.1, out=out,
                   log=logs.append)
    assert res["epochs"] >= 2, res["epochs"]
    meta, tensors = td.load_draft(out)
    assert meta["kept_epoch"] == 1 and meta["heldout_top1"] == 0.5
    assert all(torch.equal(tensors[k], seen[1][k]) for k in tensors)  # epoch 1's weights
    assert any(s.startswith("kept epoch 1's adapter") for s in logs), logs
    assert [s for s in logs if s.startswith("warning:")] == [
        "warning: the written draft's held-out top-1 (0.500) is below the untrained adapter (identity)'s (0.900); "
        "train longer (--minutes)."], logs
