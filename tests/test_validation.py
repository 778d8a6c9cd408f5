"""Input validation of the Python API: every bad input is one ``SpecdecError`` sentence naming the problem.

Written over ``method_names()`` / ``SELECTORS.names()`` / ``BACKENDS.names()`` so methods, selectors and
backends added later are covered as they land. The CLI side (exit code, one line, nothing written) is
``tests/test_cli_errors.py``.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from pydantic import ValidationError

from specdec import BACKENDS, SELECTORS, PipelineConfig, SpecdecModel, SpeculativeEngine, build_engine, method_names
from specdec.errors import SpecdecError
from specdec.interfaces import AttentionMetadata
from specdec.presets import get_method
from specdec.sampling import SamplingConfig

from conftest import make_tiny

PROMPT = list(range(3, 30))


def one_sentence(msg: str) -> None:
    """A user-facing message: one line, ends with a period, no Python repr noise."""
    assert "\n" not in msg.strip(), msg
    assert msg.rstrip().endswith("."), msg
    assert "Traceback" not in msg


@pytest.fixture(scope="module")
def model():
    return make_tiny("llama", seed=1)


# -- unknown names list the known ones ---------------------------------------------------------
def test_unknown_method_lists_every_known_method():
    with pytest.raises(SpecdecError) as exc:
        get_method("nope")
    one_sentence(str(exc.value))
    for name in method_names():
        assert name in str(exc.value)


@pytest.mark.parametrize("registry", [SELECTORS, BACKENDS], ids=["selector", "backend"])
def test_unknown_component_lists_every_known_name(registry):
    with pytest.raises(SpecdecError) as exc:
        registry.get("nope")
    one_sentence(str(exc.value))
    assert f"unknown {registry.kind} 'nope'" in str(exc.value)
    for name in registry.names():
        assert name in str(exc.value)


# -- pipeline fields ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(gamma=0), "gamma"),
        (dict(gamma=-2), "gamma"),
        (dict(gamma=65), "gamma"),
        (dict(gamma=10_000), "gamma"),
        (dict(budget=0), "budget"),
        (dict(budget=-5), "budget"),
        (dict(budget_ratio=0.0), "budget_ratio"),
        (dict(budget_ratio=-0.1), "budget_ratio"),
        (dict(budget_ratio=1.5), "budget_ratio"),
        (dict(budget=8, budget_ratio=0.1), "budget or budget_ratio"),
        (dict(sinks=-1), "sinks"),
        (dict(recent=-1), "recent"),
        (dict(gama=3), "gama"),
    ],
)
def test_bad_pipeline_field_names_the_field(bad, field):
    with pytest.raises(SpecdecError) as exc:
        PipelineConfig.make(method="magicdec", **bad)
    one_sentence(str(exc.value))
    assert field in str(exc.value)


@pytest.mark.parametrize(
    "bad, field",
    [(dict(temperature=-0.5), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.01), "top_p"),
     (dict(top_p=-1.0), "top_p"), (dict(top_k=-1), "top_k")],
)
def test_bad_sampling_field_names_the_field(bad, field):
    with pytest.raises(ValidationError) as exc:
        SamplingConfig(**bad)
    assert field in str(exc.value)
    from specdec.registry import format_validation_error

    one_sentence(format_validation_error("sampling", exc.value))


def budget_selectors() -> list[str]:
    """Selectors whose config takes the shared budget fields with no other required field."""
    out = [n for n in SELECTORS.names()
           if not any(f.is_required() for f in SELECTORS.get(n).config_cls.model_fields.values())]
    for n in out:  # no try: a config that breaks fails these tests instead of leaving the list
        SELECTORS.config(n, budget=8)
    return out


@pytest.mark.parametrize("name", budget_selectors())
@pytest.mark.parametrize("bad", [dict(budget=0), dict(budget_ratio=0.0), dict(budget_ratio=2.0), dict(sinks=-1)])
def test_bad_selector_budget_is_refused(name, bad):
    with pytest.raises(SpecdecError) as exc:
        SELECTORS.build(name, **bad)
    one_sentence(str(exc.value))
    assert next(iter(bad)) in str(exc.value)


def test_engine_refuses_gamma_below_one(model):
    with pytest.raises(SpecdecError, match="gamma"):
        SpeculativeEngine(model, gamma=0)


# -- prompts -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompts, match",
    [
        ([], "no prompts"),
        ([""], "empty or whitespace"),
        (["  \n\t "], "empty or whitespace"),
        ([[]], "no tokens"),
        ("a single string", "not one string"),
        ([[1000]], "outside the model's vocabulary"),
        ([[5, -1]], "outside the model's vocabulary"),
    ],
)
def test_bad_prompt_is_refused(model, prompts, match):
    for method in ("dense", "magicdec"):
        eng = build_engine(model, PipelineConfig.make(method=method, budget=8), eos_token_id=-1)
        with pytest.raises(SpecdecError, match=match) as exc:
            eng.generate(prompts, max_new_tokens=4)
        one_sentence(str(exc.value))


def test_text_prompt_without_tokenizer_is_refused(model):
    with pytest.raises(SpecdecError, match="tokenizer"):
        SpeculativeEngine(model).generate(["hello"], max_new_tokens=2)


@pytest.mark.parametrize("n", [0, -3])
def test_max_new_tokens_below_one_is_refused(model, n):
    with pytest.raises(SpecdecError, match="max_new_tokens"):
        SpeculativeEngine(model).generate([PROMPT], max_new_tokens=n)


def test_prompt_beyond_positions_is_refused_before_any_work():
    m = make_tiny("qwen2", max_position_embeddings=32)
    for method in method_names():
        eng = build_engine(m, PipelineConfig.make(method=method, budget=8), eos_token_id=-1)
        with pytest.raises(SpecdecError, match="positions") as exc:
            eng.generate([list(range(40))], max_new_tokens=2)
        one_sentence(str(exc.value))
        with pytest.raises(SpecdecError, match="positions"):  # prompt fits, prompt + new tokens does not
            eng.generate([list(range(30))], max_new_tokens=3)


# -- models ------------------------------------------------------------------------------------
def test_missing_model_path(tmp_path):
    with pytest.raises(SpecdecError, match="not an embedded name") as exc:
        SpecdecModel.from_pretrained(str(tmp_path / "nowhere" / "model"))
    one_sentence(str(exc.value))
    with pytest.raises(SpecdecError, match="does not exist"):
        SpecdecModel.from_pretrained(str(tmp_path / "missing.gguf"))


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(SpecdecError, match="no config.json") as exc:
        SpecdecModel.from_pretrained(str(tmp_path))
    one_sentence(str(exc.value))


@pytest.mark.parametrize("content", [b"GGUF" + bytes(range(256)) * 2, b"not a gguf file at all" * 10, b""],
                         ids=["bad-version", "no-magic", "empty"])
def test_corrupt_gguf_is_refused(tmp_path, content, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(SpecdecError, match="could not load model") as exc:
        SpecdecModel.from_pretrained(str(path))
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "half-written cache"


def test_truncated_embedded_gguf_is_refused(tmp_path, monkeypatch):
    from specdec.models import EMBEDDED_MODELS, embedded_model_path

    try:
        src = embedded_model_path(next(iter(EMBEDDED_MODELS)))
    except SpecdecError:
        pytest.skip("embedded model package not installed")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "truncated.gguf"
    with open(src, "rb") as f:
        path.write_bytes(f.read(1 << 20))  # the header and part of the tensor table
    with pytest.raises(SpecdecError, match="could not load model") as exc:
        SpecdecModel.from_pretrained(str(path))
    assert "\n" not in str(exc.value)


def test_unknown_dtype():
    from specdec.models import resolve_dtype

    with pytest.raises(SpecdecError, match="float32, bfloat16, float16"):
        resolve_dtype("float64")


def _tiny_hf(kind: str):
    import transformers as tf

    torch.manual_seed(0)
    if kind == "bert":  # an encoder: bidirectional attention
        return tf.BertLMHeadModel(tf.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                                intermediate_size=32, vocab_size=50))
    if kind == "mamba":  # no attention at all
        return tf.MambaForCausalLM(tf.MambaConfig(num_hidden_layers=1, hidden_size=16, vocab_size=50))
    if kind == "t5":  # encoder-decoder
        return tf.T5ForConditionalGeneration(tf.T5Config(num_layers=1, num_heads=2, d_model=16, d_kv=8, d_ff=32,
                                                         vocab_size=50, decoder_start_token_id=0))
    raise ValueError(kind)


@pytest.mark.parametrize("kind, match", [("bert", "bidirectional"), ("mamba", "no attention geometry"),
                                         ("t5", "encoder-decoder")])
def test_unsupported_architecture_is_refused(kind, match):
    hf = _tiny_hf(kind)
    impl = hf.config._attn_implementation
    with pytest.raises(SpecdecError, match=match) as exc:
        SpecdecModel(hf)
    one_sentence(str(exc.value))
    assert "supported: decoder-only" in str(exc.value)
    assert hf.config._attn_implementation == impl, "a refused model must be left as it was"


# -- backends ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BACKENDS.names())
def test_backend_explains_refusal_or_runs(name, monkeypatch):
    """Every backend either runs here (and then matches float64 attention) or says why in one sentence.

    Without ``TRITON_INTERPRET`` the Triton backend must decline the CPU; under the interpreter (as CI
    runs) it must run. The test extras install every optional dependency, so building never fails here.
    """
    be = BACKENDS.build(name)
    ran = 0
    for interpret in (False, True):
        if interpret:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        else:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            reason = be.validate(torch.device("cpu"), dtype)
            if reason is not None:
                assert isinstance(reason, str), reason
                one_sentence(reason)
                continue
            if interpret and name != "triton":
                continue  # the interpreter only matters to Triton
            check_backend_runs(be, dtype)
            ran += 1
    assert ran, f"backend {name!r} runs no dtype on the CPU, not even under TRITON_INTERPRET"


def check_backend_runs(be, dtype: torch.dtype) -> None:
    """``be`` equals float64 attention over a ragged cache: dense with 3 rows (a verify pass), dense with
    one row (a decode step) and sparse over a plan plus its dense tail (a draft step), since a backend
    may run its own kernel for some of these and delegate the others."""
    g = torch.Generator().manual_seed(5)
    B, H, Hkv, D, L = 2, 4, 2, 16, 24
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.tensor([5, 17])
    plan = torch.tensor([[[0, 2, -1], [1, 3, 4]], [[0, 9, 12], [15, 2, -1]]])  # (B, H_kv, K), -1 = unused
    dense_from = torch.tensor([4, 16])
    for T, sparse in ((3, False), (1, False), (2, True)):
        q = torch.randn(B, H, T, D, generator=g).to(dtype)
        if sparse:
            out, _ = be.attend(q, k, v, AttentionMetadata(lengths, D ** -0.5, plan_indices=plan, dense_from=dense_from))
        else:
            out, _ = be.attend(q, k, v, AttentionMetadata(lengths, D ** -0.5))
        pos = torch.arange(L).view(1, 1, 1, L)
        row = lengths.view(B, 1, 1, 1) + torch.arange(T).view(1, 1, T, 1)
        seen = pos <= row  # (B, 1, T, L) causal
        if sparse:
            in_plan = torch.zeros(B, Hkv, L, dtype=torch.bool)
            for b in range(B):
                for h in range(Hkv):
                    idx = plan[b, h][plan[b, h] >= 0]
                    in_plan[b, h, idx[idx < dense_from[b]]] = True
            tail = pos >= dense_from.view(B, 1, 1, 1)
            seen = seen & (in_plan.repeat_interleave(H // Hkv, dim=1).unsqueeze(2) | tail)
        kk = k.double().repeat_interleave(H // Hkv, dim=1)
        vv = v.double().repeat_interleave(H // Hkv, dim=1)
        logits = torch.einsum("bhtd,bhld->bhtl", q.double(), kk) * D ** -0.5
        want = torch.einsum("bhtl,bhld->bhtd", torch.softmax(logits.masked_fill(~seen, float("-inf")), -1), vv)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol, msg=lambda m: f"T={T} sparse={sparse}: {m}")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_backend_without_gpu_or_interpreter_says_why(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = BACKENDS.build("triton").validate(torch.device("cpu"), torch.float32)
    assert reason is not None and "CUDA" in reason and "TRITON_INTERPRET" in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_device_without_gpu_is_refused():
    from specdec.cli import resolve_device

    with pytest.raises(SpecdecError, match="no CUDA GPU") as exc:
        resolve_device("cuda")
    one_sentence(str(exc.value))
    with pytest.raises(SpecdecError, match="unknown device"):
        resolve_device("tpu")


# -- draft model pairs (Dustin) -----------------------------------------------------------------
def test_model_drafter_with_other_vocabulary_is_refused(model):
    from specdec.drafters import ModelDrafter

    draft = make_tiny("llama", seed=2, vocab_size=80)
    with pytest.raises(SpecdecError, match="vocab"):
        SpeculativeEngine(model, ModelDrafter(draft), gamma=2, eos_token_id=-1).generate([PROMPT], max_new_tokens=4)


def word_tokenizer(vocab_size: int):
    """A word-level fast tokenizer of ``vocab_size`` entries (no download): ``w0 w1 ...`` plus ``[UNK]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def save_tiny_dir(path, vocab_size: int = 96, seed: int = 3, nan: bool = False, **over):
    """A tiny Llama saved as a transformers directory with a word-level tokenizer."""
    m = make_tiny("llama", seed=seed, vocab_size=vocab_size, **over)
    m.detach()
    if nan:
        with torch.no_grad():
            m.hf.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    m.hf.save_pretrained(path)
    word_tokenizer(vocab_size).save_pretrained(path)
    return path


def test_dustin_draft_model_with_other_vocabulary_is_refused(model, tmp_path):
    assert "dustin" in method_names()  # a de-registered Dustin fails here instead of skipping
    d = save_tiny_dir(tmp_path / "draft", 80)
    cfg = PipelineConfig.make(method="dustin", budget=8, options={"draft_model": str(d)})
    with pytest.raises(SpecdecError, match="vocabulary") as exc:
        build_engine(model, cfg)
    one_sentence(str(exc.value))


def test_srh_artifact_for_another_model_pair_is_refused(tmp_path):
    assert "dustin" in method_names()
    from specdec.srh import model_identity, save_srh

    a, b = make_tiny("llama", seed=11), make_tiny("llama", seed=12)
    eng = build_engine(a, PipelineConfig.make(method="dustin", budget=8))
    drafter = eng.drafter
    path = save_srh(tmp_path / "a.srh.json", dict(
        target=model_identity(a), draft=drafter.identity(), target_heads=[[1, 0]], draft_heads=[[0, 0]],
        layer_map=drafter.layer_map(a.dims.n_layers), m_ratio=0.5))
    build_engine(a, PipelineConfig.make(method="dustin", budget=8, options={"srh": str(path)}))  # its own pair: fine
    with pytest.raises(SpecdecError, match="profiled for") as exc:
        build_engine(b, PipelineConfig.make(method="dustin", budget=8, options={"srh": str(path)}))
    one_sentence(str(exc.value))
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(SpecdecError, match="not valid JSON"):
        build_engine(a, PipelineConfig.make(method="dustin", budget=8, options={"srh": str(bad)}))


def test_nothing_is_patched_by_a_refused_model():
    """A refused architecture leaves transformers' global registries usable for other models."""
    with pytest.raises(SpecdecError):
        SpecdecModel(_tiny_hf("bert"))
    m = make_tiny("mistral")
    out = SpeculativeEngine(m, eos_token_id=-1).generate([PROMPT], max_new_tokens=3)
    assert len(out.tokens[0]) == 3


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad-config"])
def test_corrupt_model_directory_is_refused(tmp_path, damage):
    d = save_tiny_dir(tmp_path / "m")
    w = d / "model.safetensors"
    if damage == "garbage":
        w.write_bytes(os.urandom(3000))
    elif damage == "truncated":
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    else:
        (d / "config.json").write_text("{oops")
    with pytest.raises(SpecdecError, match="could not load model") as exc:
        SpecdecModel.from_pretrained(str(d))
    one_sentence(str(exc.value))
