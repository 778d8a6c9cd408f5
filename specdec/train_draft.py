"""Self-distil a layer-skipping draft from the target (Dustin's draft model).

The draft runs the target's first ``k`` layers, a small trained **adapter**, then the target's last
``t`` layers, the final norm and the LM head (Draft & Verify / SWIFT layer skipping, with a
Kangaroo-style adapter bridging the gap)::

    h = layers[0:k](x)           # exactly the target's computation: shared weights and cache
    h = h + W2 · silu(W1 · rmsnorm(h))        # the adapter (the only trained weights, W2 starts at 0)
    h = layers[N-t:N](h)         # attends to the *target's* K/V of the verified context
    logits = lm_head(norm(h))

Every layer the draft runs is a target layer indexed by its own ``layer_idx``, so the draft reads and
writes the target's cache: no draft cache, no catch-up, rollback is the target's. Its draft rows are
overwritten by the verification pass. The cost of a draft step is ``(k + t) / N`` of a target step
(plus the adapter, one MLP without attention).

Training (:func:`train`) distils the target's next-token distribution restricted to its top-``C``
candidates (KL) on text that ships with Python: standard-library sources and ``pydoc_data``. The
tail layers see the target's K/V at earlier positions and the draft's own K/V at the current one,
as when drafting the first token after a verification. Held out for evaluation (never trained on):
the modules in :data:`HELD_OUT_MODULES` and the ``pydoc`` topics in :data:`held_out_topics`.
The ``specdec train-draft`` command around :func:`train` is :mod:`specdec.train_draft_command`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.eagle import _finish, _qkv  # the Llama layer pieces the draft head runs too
from specdec.errors import SpecdecError

#: standard-library modules never trained on (the benchmark documents + two more for code evaluation)
HELD_OUT_MODULES = ("argparse", "typing", "inspect", "tarfile", "difflib", "textwrap")
#: where the shipped drafts live inside the package
DRAFTS_DIR = Path(__file__).parent / "draft_weights"


def held_out_topics(keys) -> list[str]:
    """``pydoc_data`` topics held out from training: every 5th topic in sorted order."""
    return [k for i, k in enumerate(sorted(keys)) if i % 5 == 0]


class SkipAdapter(nn.Module):
    """Residual MLP bridging the target's layer ``k-1`` output to its layer ``N-t`` input.

    Called by the decoder loop like a decoder layer (``hidden_states`` first, keyword arguments ignored).

    Args:
        hidden: model width ``d``.
        rank: inner width ``r``; weights ``(r, d)`` and ``(d, r)``.
    """

    def __init__(self, hidden: int, rank: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps
        self.w1 = nn.Linear(hidden, rank, bias=False)
        self.w2 = nn.Linear(rank, hidden, bias=False)
        nn.init.zeros_(self.w2.weight)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:  # (B, T, d)
        h = hidden_states
        x = h.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = (self.norm_weight.float() * x).to(h.dtype)
        return h + self.w2(nn.functional.silu(self.w1(x)))


# ---------------------------------------------------------------------------------------------------
# Artifact: safetensors with the adapter + JSON metadata (k, t, rank, target identity)
# ---------------------------------------------------------------------------------------------------


def save_draft(path: str | Path, adapter: SkipAdapter, meta: dict) -> Path:
    """Write the adapter (float16) and its metadata to one ``.safetensors`` file (atomically)."""
    from safetensors.torch import save

    from specdec.outputs import write_bytes

    tensors = {k: v.detach().to(torch.float16).contiguous().cpu() for k, v in adapter.state_dict().items()}
    return write_bytes(path, save(tensors, metadata={"specdec_draft": json.dumps(meta)}), "--out")


def load_draft(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(metadata, tensors)`` of a draft artifact written by :func:`save_draft`."""
    from specdec.artifacts import read_draft_artifact

    path = Path(path)
    meta, tensors = read_draft_artifact(path, "specdec train-draft")
    if isinstance(meta, dict) and meta.get("kind") == "eagle":
        raise SpecdecError(f"{path} is an EAGLE head, not a layer-skipping draft; pass one written by "
                           "`specdec train-draft --kind skip`.")
    if not isinstance(meta, dict) or not {"k", "t", "rank", "target"} <= set(meta):
        raise SpecdecError(f"{path} is not a specdec draft artifact (no k/t/rank/target metadata); "
                           "pass a file written by `specdec train-draft`.")
    return meta, tensors


def shipped_draft(model, kind: str = "any") -> Path | None:
    """The draft shipped in the package for ``model`` (matched by its identity), or ``None``.

    ``kind``: ``"eagle"`` (an EAGLE head, :mod:`specdec.eagle`), ``"skip"`` (a layer-skip adapter) or
    ``"any"`` (an EAGLE head if one ships, else a layer-skip adapter)."""
    from specdec.artifacts import model_identity

    from safetensors import safe_open

    ident = model_identity(model)
    found: dict[str, Path] = {}
    for p in sorted(DRAFTS_DIR.glob("*.safetensors")):
        with safe_open(str(p), framework="pt") as f:  # metadata only
            meta = json.loads((f.metadata() or {}).get("specdec_draft", "null"))
        if isinstance(meta, dict) and meta.get("target") == ident:
            found.setdefault("eagle" if meta.get("kind") == "eagle" else "skip", p)
    if kind == "any":
        return found.get("eagle") or found.get("skip")
    return found.get(kind)


def build_adapter(model, path: str | Path) -> tuple[dict, SkipAdapter]:
    """Load an artifact for ``model`` (checks the target identity) as an adapter on the model's device/dtype."""
    from specdec.artifacts import _describe, model_identity

    meta, tensors = load_draft(path)
    ident = model_identity(model)
    if meta["target"] != ident:
        raise SpecdecError(f"draft artifact {path} was trained for {_describe(meta['target'])}, not this target "
                           f"({_describe(ident)}); train one with `specdec train-draft`.")
    ad = SkipAdapter(model.hf.config.hidden_size, int(meta["rank"]))
    ad.load_state_dict({k: v.float() for k, v in tensors.items()})
    return meta, ad.to(device=model.device, dtype=model.dtype).eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------------
# Training data: text that ships with Python
# ---------------------------------------------------------------------------------------------------


def _held_out_path(rel: Path) -> bool:
    """A stdlib file about a held-out module (``argparse.py``, ``test/test_argparse.py``, ``test/test_inspect/``)."""
    return any(m in part for part in rel.parts for m in HELD_OUT_MODULES)


def _docstrings(text: str) -> str:
    """The module, class and function docstrings of a Python source (English prose), blank-line separated."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ""
    docs = [ast.get_docstring(n) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return "\n\n".join(d for d in docs if d and len(d) > 80)


def training_texts(max_chars: int, wide: bool = False) -> list[tuple[str, str]]:
    """``[(name, text)]`` to train on: stdlib sources (minus :data:`HELD_OUT_MODULES`) and the
    ``pydoc_data`` topics not held out, interleaved code/prose, ``max_chars`` in all.

    ``wide``: every stdlib package and the test suite as code (not only the top-level modules), and as
    prose also the docstrings of those sources and the stdlib's ``.txt`` documents (IDLE's news, README,
    ...); files about a held-out module (``test_argparse.py`` ...) stay out."""
    import sysconfig

    from pydoc_data.topics import topics

    held = set(held_out_topics(topics))
    prose = [(f"pydoc:{k}", topics[k]) for k in sorted(topics) if k not in held and len(topics[k]) > 400]
    lib = Path(sysconfig.get_paths()["stdlib"])
    code = []
    for p in sorted(lib.glob("*.py")):
        if p.stem in HELD_OUT_MODULES or p.stem.startswith("_") or p.stat().st_size < 4000:
            continue
        code.append((f"stdlib:{p.stem}", p.read_text(encoding="utf-8", errors="replace")))
    if wide:  # read lazily: stop once each kind alone could fill max_chars
        seen = {name for name, _ in code}
        files = sorted((p for p in lib.rglob("*.py") if "site-packages" not in p.parts),
                       key=lambda p: (p.relative_to(lib).parts[0] == "test", str(p)))  # the test suite last
        n_code, n_prose = sum(len(t) for _, t in code), sum(len(t) for _, t in prose)
        for p in sorted(lib.rglob("*.txt")):
            rel = p.relative_to(lib)
            if ("site-packages" not in rel.parts and "testcases" not in p.name and not _held_out_path(rel)
                    and p.stat().st_size > 2000):
                prose.append((f"stdlib:{rel.as_posix()}", p.read_text(encoding="utf-8", errors="replace")))
        for p in files:
            if n_code >= max_chars and n_prose >= max_chars:
                break
            rel = p.relative_to(lib)
            if _held_out_path(rel) or p.stat().st_size < 2000:
                continue
            text = p.read_text(encoding="utf-8", errors="replace")
            if (len(rel.parts) > 1 or f"stdlib:{p.stem}" not in seen) and n_code < max_chars:
                code.append((f"stdlib:{rel.as_posix()}", text))
                n_code += len(text)
            doc = _docstrings(text) if n_prose < max_chars and rel.parts[0] != "test" else ""  # tests: few
            if len(doc) > 400:
                prose.append((f"docstrings:{rel.as_posix()}", doc))
                n_prose += len(doc)
    out, n, i = [], 0, 0
    while n < max_chars and (i < len(prose) or i < len(code)):
        for src in (code, prose):
            if i < len(src) and n < max_chars:
                out.append(src[i])
                n += len(src[i][1])
        i += 1
    return out


def held_out_texts() -> list[tuple[str, str]]:
    """Evaluation documents never trained on: held-out pydoc topics (prose) and held-out modules (code)."""
    from pydoc_data.topics import topics

    from specdec.data import load_document

    keys = held_out_topics(topics)
    half = len(keys) // 2
    prose = [(f"pydoc-held-out-{i + 1}", "\n\n".join(topics[k] for k in part)) for i, part in enumerate((keys[:half], keys[half:]))]
    return prose + [(f"stdlib:{m}", load_document(f"stdlib:{m}")) for m in HELD_OUT_MODULES]


def _chunks(tok, texts, T: int, max_tokens: int, pack: bool = False) -> torch.Tensor:
    """``(R, T)`` token rows cut from ``texts`` in order, ``max_tokens`` at most (texts are tokenized 32 at a
    time: a fast tokenizer spreads a batch over its threads).

    ``pack=False``: each text gives its whole rows of ``T`` tokens (a text shorter than ``T`` none, the rest of a
    longer one is dropped). ``pack=True``: the texts run on in one stream, separated by a blank line, cut every
    ``T`` tokens (a row may span texts): short texts -- most docstrings and pydoc topics at ``T = 2048`` -- count."""
    rows, n, stream = [], 0, []
    sep = tok("\n\n", add_special_tokens=False).input_ids if pack else []
    for b in range(0, len(texts), 32):
        for ids in tok([text for _, text in texts[b : b + 32]], add_special_tokens=False).input_ids:
            if pack:
                stream.extend(ids)
                stream.extend(sep)
                ids, stream = stream, []
            s = 0
            for s in range(0, len(ids) - T + 1, T):
                rows.append(ids[s : s + T])
                n += T
                if n >= max_tokens:
                    return torch.tensor(rows)
            if pack:  # the tail that did not fill a row starts the next one
                stream = ids[s + T:] if len(ids) >= T else ids
    return torch.tensor(rows)


# ---------------------------------------------------------------------------------------------------
# Manual Llama pieces (training needs gradients and a custom tail attention)
# ---------------------------------------------------------------------------------------------------


def _target_layer(layer, x, cos, sin):
    """Dense causal target layer: returns ``(out, k, v)``."""
    q, k, v = _qkv(layer, x, cos, sin)
    att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return _finish(layer, x, att), k, v


def _draft_layer(layer, x, k_t, v_t, cos, sin):
    """Draft row ``i`` attends to the target's ``k_t, v_t`` at positions ``< i`` and its own K/V at ``i``."""
    q, k, v = _qkv(layer, x, cos, sin)
    G = q.shape[1] // k.shape[1]
    kt, vt = k_t.repeat_interleave(G, 1), v_t.repeat_interleave(G, 1)
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    scale = q.shape[-1] ** -0.5
    T = q.shape[2]
    s = (q @ kt.transpose(-1, -2)) * scale  # (B, H, T, T)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(), float("-inf"))
    d = (q * k).sum(-1, keepdim=True) * scale  # (B, H, T, 1)
    m = torch.maximum(s.amax(-1, keepdim=True), d)
    p, pd = torch.exp(s - m), torch.exp(d - m)
    att = (p @ vt + pd * v) / (p.sum(-1, keepdim=True) + pd)
    return _finish(layer, x, att)


@torch.no_grad()
def _teacher(hf, ids, k: int, t: int, C: int):
    """Target pass over ``ids (B, T)``: hidden after layer ``k-1``, input of layer ``N-t``, top-``C`` logits."""
    m = hf.model
    N = len(m.layers)
    pos = torch.arange(ids.shape[1]).view(1, -1).expand(ids.shape[0], -1)
    x = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(x, pos)
    hk, kv = None, []
    for i, layer in enumerate(m.layers):
        if i == k:
            hk = x
        x, k_i, v_i = _target_layer(layer, x, cos, sin)
        if i >= N - t:
            kv.append(torch.stack([k_i, v_i]).half())  # (2, B, H_kv, T, D)
    logits = hf.lm_head(m.norm(x)).float()
    top, idx = logits.topk(C, dim=-1)
    return hk.half(), torch.stack(kv), top.half(), idx.int()


def _student_loss(hf, adapter, hk, kv, top, idx, t: int, cos, sin, full_vocab: float = 0.0):
    """KL(teacher ‖ draft) over the teacher's top-C tokens, and the share of rows whose top-1 agree."""
    m = hf.model
    N = len(m.layers)
    x = adapter(hk.float())
    for i, j in enumerate(range(N - t, N)):  # kv: (t, 2, B, H_kv, T, D), the target's tail K/V
        x = _draft_layer(m.layers[j], x, kv[i, 0].float(), kv[i, 1].float(), cos, sin)
    h = m.norm(x)  # (B, T, d)
    W = hf.lm_head.weight  # (V, d)
    z = (h.unsqueeze(-2) @ W[idx.long()].transpose(-1, -2)).squeeze(-2)  # (B, T, C)
    p = torch.softmax(top.float(), -1)
    loss = (p * (torch.log(p + 1e-9) - torch.log_softmax(z, -1))).sum(-1).mean()
    if full_vocab:  # the candidates' KL leaves the other tokens free: also push the teacher's argmax over all of them
        loss = loss + full_vocab * nn.functional.cross_entropy(hf.lm_head(h).flatten(0, 1), idx[..., 0].long().flatten())
    agree = (z.argmax(-1) == 0).float().mean()  # top-1 within the candidates (index 0 = teacher's argmax)
    return loss, agree, h


@torch.no_grad()
def full_agreement(hf, adapter, data, t: int) -> float:
    """Share of held-out rows where the draft's full-vocabulary argmax equals the teacher's."""
    m = hf.model
    hit = n = 0
    for hk, kv, top, idx in data:
        pos = torch.arange(hk.shape[1]).view(1, -1).expand(hk.shape[0], -1)
        cos, sin = m.rotary_emb(hk.float(), pos)
        _, _, h = _student_loss(hf, adapter, hk, kv, top, idx, t, cos, sin)
        pred = hf.lm_head(h).argmax(-1)
        hit += int((pred == idx[..., 0].long()).sum())
        n += pred.numel()
    return hit / max(n, 1)


def check_trainable(sm, name: str) -> None:
    """The training forward (:func:`_target_layer`, :func:`_draft_layer`) is a Llama-style layer with full
    causal attention and the ``head_dim ** -0.5`` scale; refuse a target it would compute wrongly
    (sliding-window layers, soft-capping, another query scale, Gemma's extra norms)."""
    layer = getattr(sm.hf, sm.hf.base_model_prefix).layers[0]
    D = sm.dims.head_dim
    why = ("sliding-window layers" if sm.dims.n_global < sm.dims.n_layers
           else "attention soft-capping" if getattr(sm.hf.config, "attn_logit_softcapping", None)
           else "Gemma-style norms" if hasattr(layer, "pre_feedforward_layernorm")
           else "a query scale other than head_dim ** -0.5"
           if abs(float(getattr(layer.self_attn, "scaling", D ** -0.5)) - D ** -0.5) > 1e-9 else None)
    if why:
        raise SpecdecError(f"train-draft trains Llama-style layers with full attention; {name} has {why}. "
                           "Use Dustin's early-exit draft for it (--option draft=early-exit).")


def check_sequence(seq: int, tokens: int, max_positions: int, seq_option: str | None = "--seq") -> None:
    """Refuse a training sequence longer than the model's positions and a ``tokens`` budget below one sequence
    (the collection cuts whole sequences: fewer tokens would still train on one). ``seq_option``: the option that
    sets the sequence length (``None``: it is fixed)."""
    fix = f"lower {seq_option}" if seq_option else "pick a model with more positions"
    if seq > max_positions:
        what = f"{seq_option} {seq}" if seq_option else f"the training sequence of {seq} tokens"
        raise SpecdecError(f"{what} exceeds the model's {max_positions} positions; {fix} (at most {max_positions}).")
    if tokens < seq:
        what = f"one training sequence (--seq {seq})" if seq_option else f"one training sequence ({seq} tokens)"
        raise SpecdecError(f"--tokens {tokens} is less than {what}; pass --tokens {seq} or more.")


def no_training_rows(seq: int, tokens: int, hint: str = "raise --tokens") -> SpecdecError:
    """The error for training texts that give no whole ``seq``-token sequence within ``tokens``."""
    return SpecdecError(f"no training text gives a whole {seq}-token sequence within --tokens {tokens}, so there is "
                        f"nothing to train on; {hint}.")


def _check_init(init: str | Path, sm, k: int, t: int, rank: int) -> None:
    """Refuse, before any collection, a warm start that is not a layer-skipping draft of this target and shape."""
    from specdec.artifacts import _describe, model_identity, read_draft_artifact

    meta, _ = read_draft_artifact(init, "specdec train-draft --kind skip")
    if isinstance(meta, dict) and meta.get("kind") == "eagle":
        raise SpecdecError(f"--init {init} is an EAGLE head; --kind skip needs a layer-skipping draft (one written by "
                           "`specdec train-draft --kind skip`), or leave --init out.")
    meta, _ = load_draft(init)
    if meta["target"] != model_identity(sm):
        raise SpecdecError(f"--init {init} was trained for {_describe(meta['target'])}, not this target; pass a draft "
                           "trained for it or leave --init out.")
    have, want = (meta["k"], meta["t"], meta["rank"]), (k, t, rank)
    if tuple(int(x) for x in have) != want:
        raise SpecdecError(f"--init {init} has k={have[0]}, t={have[1]}, rank={have[2]}, this run k={k}, t={t}, "
                           f"rank={rank}; pass --k {have[0]} --t {have[1]} --rank {have[2]} or leave --init out.")


def train(model: str = "smollm2-135m", k: int = 6, t: int = 4, rank: int = 384, tokens: int = 30_000,
          eval_tokens: int = 1024, seq: int = 256, batch: int = 4, candidates: int = 64, minutes: float = 4.0,
          lr: float = 2e-3, out: str | Path | None = None, seed: int = 0, log=print, full_vocab: float = 0.0,
          init: str | Path | None = None) -> dict:
    """Collect the target's signals on ``tokens`` training tokens, then fit the adapter until ``minutes``
    of this process's CPU time have passed (collection included; with one thread that is the wall time
    on an idle core, however busy the machine is). Returns a summary; writes the artifact to ``out``."""
    from specdec.models import SpecdecModel
    from specdec.artifacts import model_identity

    t0 = time.perf_counter()
    c0 = time.process_time()
    torch.manual_seed(seed)
    if tokens < seq:  # before the model loads (the positions are checked once it has)
        check_sequence(seq, tokens, 1 << 62, None)
    sm = SpecdecModel.from_pretrained(model)
    hf, tok = sm.hf, sm.tokenizer
    N = sm.dims.n_layers
    check_trainable(sm, model)
    if not (1 <= k and 1 <= t and k + t < N):
        raise SpecdecError(f"need 1 <= k, 1 <= t and k + t < {N} layers (got k={k}, t={t}).")
    check_sequence(seq, tokens, sm.dims.max_positions, None)
    if init is not None:  # checked before the collection's minutes
        _check_init(init, sm, k, t, rank)
    hf.requires_grad_(False)
    d = hf.config.hidden_size
    train_ids = _chunks(tok, training_texts(tokens * 6), seq, tokens)
    if not len(train_ids):
        raise no_training_rows(seq, tokens)
    eval_ids = _chunks(tok, held_out_texts(), seq, eval_tokens)

    budget = minutes * 60

    def collect(ids, share):
        data = []
        for s in range(0, len(ids), batch):
            if time.process_time() - c0 > share * budget:  # keep time to train
                break
            data.append(_teacher(hf, ids[s : s + batch], k, t, candidates))
        return data

    eval_data = collect(eval_ids, 1.0)
    used = time.process_time() - c0
    if used > 0.55 * budget:  # the training collection would stop before its first batch
        more = math.ceil(used / 0.55 * 2 / 60 * 10) / 10
        raise SpecdecError(f"--minutes {minutes:g} ({budget:.0f} CPU s) ran out before any training tokens were "
                           f"collected: loading the model and the {eval_ids.numel()} held-out tokens took {used:.0f} "
                           f"CPU s, past the collection's share ({0.55 * budget:.0f} s); raise --minutes "
                           f"(e.g. --minutes {more:g}).")
    train_data = collect(train_ids, 0.55)
    n_train = sum(x[0].shape[0] * x[0].shape[1] for x in train_data)
    t_collect = time.process_time() - c0
    if not n_train:  # nothing to fit: an error, not an untrained artifact
        raise SpecdecError(f"no training tokens were collected within --minutes {minutes:g}; raise --minutes.")
    log(f"collected {n_train} training / {eval_ids.numel()} held-out tokens in {t_collect:.0f} CPU s "
        f"({time.perf_counter() - t0:.0f} s wall)")
    adapter = SkipAdapter(d, rank)
    if init is not None:  # warm start from an artifact of the same shape (checked before the collection)
        _, tensors = load_draft(init)
        adapter.load_state_dict({k_: v.float() for k_, v in tensors.items()})
    base = full_agreement(hf, adapter, eval_data, t)
    start = "the --init adapter" if init is not None else "adapter = identity"
    log(f"held-out top-1 agreement before training ({start}): {base:.3f}")
    best = None  # (held-out top-1, its index in history, its weights): the adapter written
    opt = torch.optim.AdamW(adapter.parameters(), lr=lr, weight_decay=0.0)
    deadline = c0 + budget
    step, epoch, history = 0, 0, []
    per_epoch = None
    while True:
        e0 = time.process_time()
        order = torch.randperm(len(train_data))
        tot = acc = 0.0
        for i in order.tolist():
            hk, kv, top, idx = train_data[i]
            pos = torch.arange(hk.shape[1]).view(1, -1).expand(hk.shape[0], -1)
            cos, sin = hf.model.rotary_emb(hk.float(), pos)
            loss, agree, _ = _student_loss(hf, adapter, hk, kv, top, idx, t, cos, sin, full_vocab)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += loss.item()
            acc += agree.item()
            step += 1
        epoch += 1
        per_epoch = time.process_time() - e0
        ev = full_agreement(hf, adapter, eval_data, t)
        history.append(dict(epoch=epoch, loss=tot / len(train_data), train_top1=acc / len(train_data), heldout_top1=ev))
        log(f"epoch {epoch}: loss {tot / len(train_data):.3f} train top-1 {acc / len(train_data):.3f} "
            f"held-out top-1 {ev:.3f} ({per_epoch:.0f} CPU s)")
        if best is None or ev > best[0]:  # a later epoch can be worse: the best one is kept
            best = (ev, len(history) - 1, {k_: v.detach().clone() for k_, v in adapter.state_dict().items()})
        for g in opt.param_groups:
            g["lr"] *= 0.7
        if time.process_time() + per_epoch > deadline:
            break
    if not step:  # defensive: never write an adapter no optimizer step has touched
        raise SpecdecError("no optimizer step ran, so nothing was trained and nothing is written; raise --minutes.")
    if best[1] != len(history) - 1:
        adapter.load_state_dict(best[2])
        log(f"kept epoch {best[1] + 1}'s adapter (held-out top-1 {best[0]:.3f}), better than the last epoch's "
            f"({history[-1]['heldout_top1']:.3f})")
    if best[0] < base:
        log(f"warning: the written draft's held-out top-1 ({best[0]:.3f}) is below "
            f"{'its --init' if init is not None else 'the untrained adapter (identity)'}'s ({base:.3f}); train "
            f"longer (--minutes){' or keep the --init draft' if init is not None else ''}.")
    meta = dict(k=k, t=t, rank=rank, target=model_identity(sm), model=model, tokens=int(n_train),
                full_vocab=full_vocab, warm_start=str(init) if init else None,
                seq=seq, candidates=candidates, epochs=epoch, kept_epoch=best[1] + 1, heldout_top1=best[0],
                heldout_top1_identity=base, cpu_seconds=round(time.process_time() - c0, 1),
                wall_seconds=round(time.perf_counter() - t0, 1),
                held_out=dict(modules=list(HELD_OUT_MODULES), pydoc_topics="every 5th topic in sorted order"))
    if out is not None:
        save_draft(out, adapter, meta)
        log(f"wrote {out}")
    return dict(meta, history=history, collect_cpu_seconds=round(t_collect, 1))
