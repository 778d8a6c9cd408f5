"""Shared fixtures: the embedded model (loaded once per session) and tiny random HF models."""

from __future__ import annotations

import os

import pytest
import torch

from specdec.testing.models import tiny_config, tiny_model  # noqa: F401 - the kit's, shared with the tests

# One thread per test process, and the same for the CLI processes the tests start (they inherit the
# environment). The tests run tiny models, whose steps are too small to gain from more threads, on
# shared 2-core CI machines where several test runs compete: torch's default of one OpenMP thread per
# core oversubscribes them (the demo took 117 s instead of 19 s). One thread also fixes the order of
# floating-point reductions, so results do not depend on the machine's core count.
TEST_THREADS = 1
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(TEST_THREADS)
torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def _one_thread():
    """A CLI command run in-process (``main_options`` picks threads from the CPU affinity) must not
    leave the rest of the session on more threads."""
    yield
    if torch.get_num_threads() != TEST_THREADS:
        torch.set_num_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def smol():
    """SmolLM2-135M-Instruct in float32 through the reference backend."""
    from specdec import SpecdecModel

    return SpecdecModel.from_pretrained("smollm2-135m", dtype="float32", device="cpu")


FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]


def tiny_llama_dir(tmp_path, layers: int):
    """A random-weight llama of ``layers`` layers with the embedded SmolLM2's vocabulary and tokenizer, saved under
    ``tmp_path / "tiny"`` (what ``specdec train-draft`` loads by path); returns that folder."""
    from transformers import AutoTokenizer

    from specdec.models import _cache_dir, embedded_model_path, load_hf

    g = embedded_model_path("smollm2-135m")
    cached = _cache_dir() / f"{g.stem}-{g.stat().st_size}"
    if not (cached / "tokenizer_config.json").is_file():
        load_hf("smollm2-135m")
    d = tmp_path / "tiny"
    make_tiny("llama", seed=6, vocab_size=49152, num_hidden_layers=layers).hf.save_pretrained(d)
    AutoTokenizer.from_pretrained(str(cached), local_files_only=True).save_pretrained(d)
    return d


def make_tiny(family: str, seed: int = 0, **over):
    """A tiny random :class:`SpecdecModel` (no tokenizer) of ``family`` (:func:`specdec.testing.tiny_model`)."""
    return tiny_model(family, seed=seed, **over)


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    return make_tiny(request.param)


def real_prompts(tokenizer, n_tokens: int, count: int = 2) -> list[list[int]]:
    """``count`` real prompts of ``n_tokens`` tokens: pydoc prose and standard-library source."""
    from specdec.data import load_document

    docs = ["pydoc", "stdlib:argparse", "stdlib:typing"][:count]
    out = []
    for i, d in enumerate(docs):
        ids = tokenizer(load_document(d), add_special_tokens=False).input_ids
        start = 5000 + 3000 * i
        out.append(ids[start : start + n_tokens])
    return out


# -- GPU sessions: no test module may switch Triton to its interpreter while being collected ---------
_SET_INTERPRET: list[str] = []  # the collectors (modules, conftest folders) that did


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Pytest imports every test module before running any; a CPU-only module that sets
    ``TRITON_INTERPRET=1`` at import would make every later Triton kernel (inductor's included) run in
    the interpreter in a GPU session. Its collection fails instead, naming it and the fix: a collection
    error ends a plain session before any test runs, and pytest-xdist's workers report it like any other
    (a ``UsageError`` raised in a worker reached the terminal only as a bare INTERNALERROR)."""
    before = os.environ.get("TRITON_INTERPRET")
    report = yield
    now = os.environ.get("TRITON_INTERPRET")
    if os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cuda" and now != before and now not in (None, "", "0"):
        _SET_INTERPRET.append(collector.nodeid)
        report.outcome, report.result = "failed", []
        report.longrepr = (
            f"{collector.nodeid or 'a conftest'} set TRITON_INTERPRET={now} during collection of a GPU session "
            "(SPECDEC_TEST_DEVICE=cuda); guard its os.environ.setdefault('TRITON_INTERPRET', '1') with the device "
            "check the kernel test modules use.")
    return report


def pytest_collection_modifyitems(config, items):
    """pytest-xdist workers run their tests despite a collection error: in a GPU session where a module
    switched on the interpreter (see above), they run none (every worker imports every module)."""
    if _SET_INTERPRET:
        config.hook.pytest_deselected(items=list(items))
        items[:] = []
