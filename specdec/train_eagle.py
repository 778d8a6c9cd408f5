"""Self-distil an EAGLE-style draft head (:mod:`specdec.eagle`) from the target.

1. **Collect** once: the target runs over training chunks (text that ships with Python, held-out
   documents excluded, :func:`specdec.train_draft.training_texts`) and we keep its final normed hidden
   states ``f (B, T, d)`` and its top-``C`` next-token logits (float16).
2. **Train** the head (``fc`` + one decoder layer) on those features only — the target is not run again.
   Row ``i`` sees ``[embed(t_{i+1}); f_i]`` at position ``i`` and must predict ``f_{i+1}`` (smooth-L1
   feature regression) and the target's next-token distribution at ``i+1`` (KL over its top-``C``
   candidates through the shared LM head).
   **Unrolled steps** (as drafting does, EAGLE-3's "training-time test"): step ``j >= 2`` feeds the previous
   step's prediction ``f̂_i`` (from row ``i-1``) instead of ``f_i``. Its attention sees exactly what draft
   step ``j`` sees: step 1's K/V (true features) at positions ``<= i-j+1`` and step ``m``'s own K/V at
   ``i-(j-m)`` for ``m = 2..j`` (one masked attention over the concatenated K/V of steps ``1..j``).
   (Recipe ``v1``, the first shipped head's: step ``j >= 3`` saw step 1's K/V at every earlier position.)

Recipes (:data:`RECIPES`; ``specdec train-draft --kind eagle --recipe``):

* ``v1`` — 256-token sequences, 3 steps (approximate beyond 2), top-``C`` KL + feature regression + a
  little full-vocabulary CE, linear learning-rate decay, top-level stdlib modules + pydoc topics;
* ``v2`` — 3 exact steps, warm-up + cosine decay, the wide training text (every stdlib package, the test
  suite, docstrings and ``.txt`` documents, held-out modules excluded: :func:`~specdec.train_draft.training_texts`);
  on a GPU also 2048-token sequences (τ fell at 2048 with 256-token training) and the KL to the target's
  **full** next-token distribution, recomputed from the stored features (``lm_head(f_{i+1})``);
* ``v3`` — ``v2`` with the texts packed into one stream before it is cut into sequences
  (:func:`~specdec.train_draft._chunks` ``pack=True``): ``v2`` drops every text shorter than a sequence (at 2048
  tokens most docstrings and pydoc topics, the prose) and the tail of every longer one. On the H200 (6.5 min, 3.3 M
  tokens against ``v2``'s 2.6 M) it was no better off the standard library than the shipped ``v2`` head
  (``benchmarks/results/gpu_eagle_v3_2026-12-02.md``);
* ``v4`` — ``v3`` on rows where every 512 tokens end in 64 of the **target's own greedy continuation** of what
  precedes them (:func:`self_generate`, up to half the collection budget): drafting runs inside the target's
  output, whose statistics the document text does not have (at 512-token segments the draft sees a document,
  then what the target wrote after it, as when it is used);
* ``v6`` — ``v5`` with more English: every third row is prose (docstrings, ``pydoc`` topics, the stdlib's ``.txt``
  documents) whose every 256 tokens end in 192 tokens **sampled** from the target (temperature 0.8) after the 64
  real ones (:func:`self_generate` with ``temperature``; up to a third of the collection budget, the prose used
  again with new samples while time is left). Python ships ~2 M characters of prose against ~30 M of code: in
  ``v5``'s rows prose is about one token in ten, and the drafts off the standard library were weakest on prose.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from specdec.eagle import EagleHead, _finish, _qkv, default_feature_layers, feature_norm, save_eagle
from specdec.errors import SpecdecError
from specdec.train_draft import (HELD_OUT_MODULES, _chunks, _draft_layer, _target_layer, check_sequence,
                                  check_trainable, held_out_texts, no_training_rows, training_texts)


@torch.no_grad()
def features(hf, ids: torch.Tensor, C: int, half: bool = True, layers: list[int] | None = None):
    """Target pass over ``ids (B, T)``: normed final hidden ``f (B, T, d)`` and top-``C`` logits (values, ids),
    stored in float16 unless ``half`` is false. With ``layers`` (a fused-feature head), ``f`` is followed by those
    decoder layers' outputs, :func:`~specdec.eagle.feature_norm`'d: ``(B, T, (1 + n) d)``, what the engine records
    for such a head (:attr:`specdec.models.SpecdecModel.hidden_layers`)."""
    m = hf.model
    pos = torch.arange(ids.shape[1], device=ids.device).view(1, -1).expand(ids.shape[0], -1)
    x = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(x, pos)
    kept = {}
    for i, layer in enumerate(m.layers):
        x, _, _ = _target_layer(layer, x, cos, sin)
        if layers and i in layers:
            kept[i] = feature_norm(x)
    f = m.norm(x)
    top, idx = hf.lm_head(f).float().topk(C, dim=-1)
    if layers:
        f = torch.cat([f] + [kept[i] for i in layers], dim=-1)
    return (f.half(), top.half(), idx.int()) if half else (f, top, idx)


#: training recipes: ``seq``/``teacher`` ``None`` = by device (GPU: 2048 / full, CPU: 256 / top)
RECIPES = {
    "v1": dict(seq=256, steps=3, exact=False, teacher="top", schedule="linear", wide=False, reg_weight=1.0),
    "v2": dict(seq=None, steps=3, exact=True, teacher=None, schedule="cosine", wide=True, reg_weight=1.0),
    "v3": dict(seq=None, steps=3, exact=True, teacher=None, schedule="cosine", wide=True, reg_weight=1.0, pack=True),
    "v4": dict(seq=None, steps=3, exact=True, teacher=None, schedule="cosine", wide=True, reg_weight=1.0, pack=True,
               selfgen=(512, 64)),
    "v5": dict(seq=None, steps=3, exact=True, teacher=None, schedule="cosine", wide=True, reg_weight=1.0, pack=True,
               fused=True),
    "v6": dict(seq=None, steps=3, exact=True, teacher=None, schedule="cosine", wide=True, reg_weight=1.0, pack=True,
               fused=True, genprose=(256, 192, 0.8, 3)),
}


def is_prose(name: str) -> bool:
    """Whether a :func:`~specdec.train_draft.training_texts` entry is prose (a ``pydoc`` topic, docstrings, a
    ``.txt`` document) rather than code."""
    return name.startswith(("pydoc:", "docstrings:")) or name.endswith(".txt")


@torch.no_grad()
def self_generate(sm, ids: torch.Tensor, seg: int, gen: int, batch: int, stop=lambda: False,
                  temperature: float = 0.0):
    """Rows of the same length as ``ids (R, T)`` cut in segments of ``seg`` tokens (``T`` and ``gen`` scaled to it
    when the rows are shorter): the row's own text, then ``gen`` tokens of the target's **greedy continuation** of
    everything before them — what the draft sees when it runs: a document, then the target's own output
    (``temperature > 0``: tokens sampled from the target's distribution at that temperature instead, from torch's
    global generator). ``sm``: the target as a :class:`~specdec.models.SpecdecModel`; its KV-cached forward makes
    the tokens (CUDA graphs on a GPU: :func:`_generation_mode`). Rows are done ``batch`` at a time, the first batch
    always, then until ``stop()``; the rest are returned unchanged. Returns ``(rows, n_done)``."""
    if temperature < 0 or not math.isfinite(temperature):
        raise SpecdecError(f"selfgen temperature must be >= 0 (0: greedy), got {temperature!r}.")
    R, T = ids.shape
    if seg > T:
        seg, gen = T, max(1, gen * T // seg)
    real = seg - gen
    if real < 1 or gen < 1 or T % seg:
        raise SpecdecError(f"selfgen: segments of {seg} tokens with {gen} generated must tile the sequence length {T}.")
    out, done = ids.clone(), 0
    with _generation_mode(sm):
        for s in range(0, R, batch):
            if s and stop():  # at least one batch
                break
            src = ids[s : s + batch].to(sm.device)
            cache = sm.new_cache(src.shape[0], T, reuse=True)  # reused by the next batch of the same size (and graphs)
            lengths = torch.zeros(src.shape[0], dtype=torch.long, device=sm.device)
            parts, last = [], None
            for c in range(T // seg):
                x = src[:, c * real : (c + 1) * real]
                parts.append(x)
                if last is not None:  # the previous segment's last generated token has not been run yet
                    x = torch.cat([last, x], 1)
                for g in range(gen):
                    logits = sm.forward(x, cache, lengths, logits_to_keep=1)[:, -1]
                    lengths = lengths + x.shape[1]
                    if temperature > 0:
                        last = torch.multinomial(torch.softmax(logits / temperature, -1), 1)
                    else:
                        last = logits.argmax(-1, keepdim=True)
                    parts.append(last)
                    x = last  # run next (the segment's last token: with the next segment's text)
            out[s : s + batch] = torch.cat(parts, 1).cpu()
            done += src.shape[0]
    sm.release_cache()
    return out, done


#: rows generated at once on a GPU (float32 K/V of 2,048 positions: ~45 KB a position at the embedded model's
#: shape, 24 GB for 256 rows)
GENERATION_ROWS = 256


@contextmanager
def _generation_mode(sm):
    """On a GPU, :func:`self_generate`'s forwards run on the Triton backend as CUDA graphs (a decode step of the
    embedded model is launch-bound; the torch backend's GQA attention over the whole cache copied K/V per layer and
    made 198 rows in minutes); on the CPU, as they are."""
    if sm.device.type != "cuda":
        yield
        return
    from specdec.registry import BACKENDS

    with sm.using_backend(BACKENDS.build("triton")):
        sm.enable_cuda_graphs()
        try:
            yield
        finally:
            sm.disable_cuda_graphs()


def _own_plus_earlier(layer, x, k1, v1, cos, sin):
    """Row ``i`` attends to ``k1, v1`` (step 1's K/V) at positions ``< i`` and to its own K/V at ``i``."""
    return _draft_layer(layer, x, k1, v1, cos, sin)


def step_mask(T: int, j: int, device=None) -> torch.Tensor:
    """``(T, j·T)`` bool: what row ``i`` of unrolled step ``j`` sees in the K/V of steps ``1..j`` (concatenated):
    step 1 at positions ``<= i-j+1``, step ``m >= 2`` at position ``i-(j-m)`` only — as draft step ``j``."""
    i = torch.arange(T, device=device).view(T, 1)
    p = torch.arange(T, device=device).view(1, T)
    return torch.cat([p <= i - (j - 1)] + [p == i - (j - m) for m in range(2, j + 1)], dim=1)


def head_forward(hf, head: EagleHead, ids, f, steps: int = 1, exact: bool = True):
    """Training forward: per unrolled step, the predicted features ``f̂ (B, T-1, d)`` of positions ``1..T-1``.
    ``exact=False``: recipe v1's attention for steps ``>= 3`` (step 1's K/V at every earlier position)."""
    m = hf.model
    B, T = ids.shape
    emb = m.embed_tokens(ids[:, 1:])  # (B, T-1, d): token t_{i+1} for row i
    pos = torch.arange(T - 1, device=ids.device).view(1, -1).expand(B, -1)
    cos, sin = m.rotary_emb(emb, pos)
    f = head.fuse(f.float())  # (B, T, d): a fused-feature head's reading of the target's features
    x = head.inputs(emb, f[:, :-1])
    q, k1, v1 = _qkv(head.layer, x, cos, sin)
    att = nn.functional.scaled_dot_product_attention(q, k1, v1, is_causal=True, enable_gqa=True)
    pred = m.norm(_finish(head.layer, x, att))
    out = [pred]
    G = q.shape[1] // k1.shape[1]
    ks, vs = [k1.repeat_interleave(G, 1)], [v1.repeat_interleave(G, 1)]  # (B, H, T-1, D): no GQA in masked SDPA
    for j in range(2, steps + 1):
        prev = torch.cat([f[:, :1], pred[:, :-1]], dim=1)  # row i gets f̂_i (row i-1's prediction); row 0 keeps f_0
        x = head.inputs(emb, prev)
        if not exact:
            pred = m.norm(_own_plus_earlier(head.layer, x, k1, v1, cos, sin))
        else:
            q, k, v = _qkv(head.layer, x, cos, sin)
            ks.append(k.repeat_interleave(G, 1))
            vs.append(v.repeat_interleave(G, 1))
            att = nn.functional.scaled_dot_product_attention(q, torch.cat(ks, 2), torch.cat(vs, 2),
                                                             attn_mask=step_mask(T - 1, j, ids.device))
            pred = m.norm(_finish(head.layer, x, att))
        out.append(pred)
    return out


def loss_terms(hf, pred, f, top, idx, kl_weight: float, full_rows: int = 32, reg_weight: float = 1.0):
    """Smooth-L1 to ``f_{i+1}`` + ``kl_weight`` · KL(teacher top-C ‖ draft) + the full-vocabulary cross-entropy
    to the teacher's argmax on ``full_rows`` random rows (the candidates' KL leaves the other tokens free),
    and the top-1 agreement within the candidates."""
    tgt = f[:, 1:, : pred.shape[-1]].float()  # the final hidden (a fused feature's first d)
    reg = nn.functional.smooth_l1_loss(pred, tgt)
    flat = pred.flatten(0, 1)
    pick = torch.randperm(flat.shape[0], device=flat.device)[:full_rows]
    ce = nn.functional.cross_entropy(hf.lm_head(flat[pick]), idx[:, 1:, 0].long().flatten()[pick])
    W = hf.lm_head.weight  # (V, d)
    ix = idx[:, 1:].long()
    z = (pred.unsqueeze(-2) @ W[ix].transpose(-1, -2)).squeeze(-2)  # (B, T-1, C)
    p = torch.softmax(top[:, 1:].float(), -1)
    kl = (p * (torch.log(p + 1e-9) - torch.log_softmax(z, -1))).sum(-1).mean()
    return reg_weight * reg + kl_weight * kl + 0.5 * ce, (z.argmax(-1) == 0).float().mean()


def loss_full(hf, pred, p_t, argmax_t, reg_tgt, reg_weight: float):
    """``reg_weight`` · smooth-L1 to ``f_{i+1}`` + the cross-entropy to the target's **full** next-token
    distribution ``p_t (B, T-1, V)`` (recomputed from its stored features; = KL(target ‖ draft) + the target's
    entropy, a constant). Also the top-1 agreement."""
    z = hf.lm_head(pred).float()  # (B, T-1, V)
    ce = nn.functional.cross_entropy(z.flatten(0, 1), p_t.flatten(0, 1))
    reg = nn.functional.smooth_l1_loss(pred, reg_tgt)
    return reg_weight * reg + ce, (z.argmax(-1) == argmax_t).float().mean()


@torch.no_grad()
def heldout_agreement(hf, head, data, steps: int, exact: bool = True) -> list[float]:
    """Per unrolled step, share of held-out rows whose full-vocabulary argmax equals the target's."""
    hits, n = [0] * steps, 0
    for ids, f, top, idx in data:
        preds = head_forward(hf, head, ids, f, steps, exact)
        for j, p in enumerate(preds):
            hits[j] += int((hf.lm_head(p).argmax(-1) == idx[:, 1:, 0].long()).sum())
        n += preds[0].shape[0] * preds[0].shape[1]
    return [h / max(n, 1) for h in hits]


def train(model: str = "smollm2-135m", tokens: int = 100_000, eval_tokens: int = 1024, seq: int | None = None,
          batch: int = 4, candidates: int = 64, minutes: float = 8.0, collect_share: float = 0.4, lr: float = 1e-3,
          steps: int | None = None, kl_weight: float = 1.0, out: str | Path | None = None, seed: int = 0, log=print,
          device: str = "cpu", recipe: str = "v2", teacher: str | None = None,
          selfgen: tuple[int, int] | None = None, init: str | Path | None = None) -> dict:
    """Collect the target's features on ``tokens`` training tokens (at most ``collect_share`` of the budget),
    then train the head until ``minutes`` have passed: this process's CPU time on the CPU (one thread: the
    wall time of an idle core, however busy the machine is), wall time on a GPU (``device="cuda"``).
    ``recipe``: :data:`RECIPES` (``seq`` / ``steps`` / ``teacher`` given here override it; ``teacher``:
    ``"top"``, the KL over the target's stored top-``candidates`` logits, or ``"full"``; ``selfgen``: ``(segment,
    generated)`` tokens of :func:`self_generate`, overriding the recipe's). ``init``: an EAGLE artifact for this
    target (``"shipped"``: the packaged one) whose weights start the head (a fused-feature head's ``proj`` starts at
    zero when the artifact has none: the training starts from that head's drafts exactly).
    Writes ``out`` (after every epoch too, so a stopped run leaves a usable head)."""
    if recipe not in RECIPES:
        raise SpecdecError(f"unknown EAGLE training recipe {recipe!r}; known: {', '.join(RECIPES)}.")
    rc = dict(RECIPES[recipe])
    gpu = device != "cpu"
    rc["seq"] = seq or rc["seq"] or (2048 if gpu else 256)
    rc["steps"] = steps if steps is not None else rc["steps"]
    rc["teacher"] = teacher or rc["teacher"] or ("full" if gpu else "top")
    if selfgen is not None:
        rc["selfgen"] = tuple(selfgen)
    if rc["teacher"] not in ("top", "full"):
        raise SpecdecError(f"teacher must be top or full (got {rc['teacher']!r}).")
    if rc["seq"] < 2:
        raise SpecdecError(f"--seq must be >= 2 (got {rc['seq']}).")
    clock = time.process_time if device == "cpu" else time.perf_counter
    t0, c0 = time.perf_counter(), clock()
    torch.manual_seed(seed)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    if gpu:  # TF32 matmuls for the training only (restored on return)
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return _train(model, tokens, eval_tokens, batch, candidates, collect_share, lr, kl_weight, out, log, device,
                      recipe, rc, clock, t0, c0, budget=minutes * 60, init=init)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _train(model, tokens, eval_tokens, batch, candidates, collect_share, lr, kl_weight, out, log, device, recipe, rc,
           clock, t0, c0, budget, init=None) -> dict:
    from specdec.models import SpecdecModel

    seq, steps, exact = rc["seq"], rc["steps"], rc["exact"]
    if steps < 1:
        raise SpecdecError(f"steps must be >= 1 (got {steps}).")
    sm = SpecdecModel.from_pretrained(model, device=device)
    hf, tok = sm.hf, sm.tokenizer
    check_trainable(sm, model)
    check_sequence(seq, tokens, sm.dims.max_positions)  # before the collection's minutes (the positions first)
    hf.requires_grad_(False)
    n_layers = len(hf.model.layers)
    fl = default_feature_layers(n_layers) if rc.get("fused") else None
    rc["feature_layers"] = fl
    start = None
    if init is not None:  # checked before the collection's minutes
        start, rc["init"] = _init_weights(sm, init, fl)
    texts = training_texts(tokens * 6, wide=rc["wide"])
    train_ids = _chunks(tok, texts, seq, tokens, pack=rc.get("pack", False))
    if not len(train_ids):
        raise no_training_rows(seq, tokens, "raise --tokens or lower --seq" + (
            "" if rc.get("pack") else ", or pick --recipe v3 or later (it packs short texts into whole sequences)"))
    eval_ids = _chunks(tok, held_out_texts(), seq, max(eval_tokens, seq))
    if not len(eval_ids):
        raise SpecdecError(f"no held-out document gives a whole {seq}-token sequence to evaluate on; lower --seq.")
    n_gen = 0
    if rc.get("selfgen"):  # at most half the collection budget: the features of every row are collected after it
        seg, gen = rc["selfgen"]
        c1 = clock()
        until = c1 + 0.5 * max(0.0, collect_share * budget - (c1 - c0))
        rows = GENERATION_ROWS if device != "cpu" else 8 * batch
        train_ids, n_gen = self_generate(sm, train_ids, seg, gen, rows, stop=lambda: clock() > until)
        eval_gen, _ = self_generate(sm, eval_ids, seg, gen, rows)
        log(f"selfgen: {n_gen} of {len(train_ids)} rows hold the target's greedy continuations "
            f"(segments of {min(seg, seq)} tokens ending in generated ones) ({clock() - c0:.0f} s)")

    n_prose_gen = 0
    if rc.get("genprose"):
        c1 = clock()
        until = c1 + max(0.0, collect_share * budget - (c1 - c0)) / 3  # a third of what is left to collect in
        train_ids, n_prose_gen = _with_generated_prose(sm, tok, texts, train_ids, rc["genprose"], seq, tokens, device,
                                                       batch, stop_at=until, clock=clock)
        rc["genprose_rows"] = n_prose_gen  # recorded in the artifact (how much of the recipe the budget allowed)
        log(f"genprose: {n_prose_gen} of {len(train_ids)} rows are prose with sampled continuations, made in "
            f"{clock() - c1:.0f} s of {until - c1:.0f} ({clock() - c0:.0f} s)")

    def collect(ids, share):
        data = []
        for s in range(0, len(ids), batch):
            if s and clock() - c0 > share * budget:  # at least one batch: a tight budget still trains on something
                break
            x = ids[s : s + batch]
            x = x.to(device)
            data.append((x, *features(hf, x, candidates, layers=fl)))
        return data

    eval_data = collect(eval_ids, 1.0)
    eval_gen_data = collect(eval_gen, 1.0) if n_gen else []
    train_data = collect(train_ids, collect_share)
    n_train = sum(x[0].numel() for x in train_data)
    t_collect = clock() - c0
    if not n_train:  # nothing to fit: an error, not an untrained head
        raise SpecdecError("no training tokens were collected; raise --tokens or --minutes.")
    log(f"recipe {recipe} ({rc}): collected target features on {n_train} training / "
        f"{sum(x[0].numel() for x in eval_data)} held-out tokens in {t_collect:.0f} s "
        f"({time.perf_counter() - t0:.0f} s wall)")
    layer_from = n_layers - 1
    head = EagleHead(hf.model.layers[layer_from], hf.config.hidden_size, fl).to(device)
    if start is not None:
        res = head.load_state_dict(start, strict=False)
        if res.unexpected_keys or set(res.missing_keys) - {"proj.weight"}:
            raise SpecdecError(f"init={str(init)!r} does not fit this head (missing {res.missing_keys}, unexpected "
                               f"{res.unexpected_keys}); pass an EAGLE head of this target.")
    init_ev = heldout_agreement(hf, head, eval_data, steps, exact) if start is not None else None
    if init_ev is not None:  # the bar the trained head is held to (the same held-out rows)
        log(f"--init head: held-out top-1 per step {', '.join(f'{x:.3f}' for x in init_ev)}")
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    left = budget - (clock() - c0)
    history, step, epoch = [], 0, 0
    best = None  # (mean held-out top-1 over the steps, its index in history, its weights): the head written
    e_est = None

    def lr_at(frac: float) -> float:
        if rc["schedule"] == "linear":
            return lr * max(0.05, 1.0 - frac)
        warm = 0.03
        if frac < warm:
            return lr * max(frac / warm, 0.02)
        return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - warm) / (1 - warm)))))

    while True:
        e0 = clock()
        tot = acc = 0.0
        n_b = 0
        for i in torch.randperm(len(train_data)).tolist():
            ids, f, top, idx = train_data[i]
            frac = min(1.0, (clock() - c0 - t_collect) / max(left, 1.0))
            for g in opt.param_groups:
                g["lr"] = lr_at(frac)
            preds = head_forward(hf, head, ids, f, steps, exact)
            if rc["teacher"] == "full":
                with torch.no_grad():
                    tgt = f[:, 1:, : hf.config.hidden_size].float()  # the final hidden (a fused feature's first d)
                    p_t = torch.softmax(hf.lm_head(tgt).float(), -1)
                losses = [loss_full(hf, p, p_t, idx[:, 1:, 0].long(), tgt, rc["reg_weight"]) for p in preds]
                del p_t
            else:
                losses = [loss_terms(hf, p, f, top, idx, kl_weight, reg_weight=rc["reg_weight"]) for p in preds]
            loss = sum(l for l, _ in losses) / len(losses)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            tot += loss.item()
            acc += losses[0][1].item()
            step += 1
            n_b += 1
            if clock() - c0 > budget - (e_est or 0) * 0.02:
                break
        epoch += 1
        e_est = clock() - e0
        ev = heldout_agreement(hf, head, eval_data, steps, exact)
        history.append(dict(epoch=epoch, loss=tot / max(n_b, 1), train_top1=acc / max(n_b, 1), heldout_top1=ev))
        msg = ""
        if eval_gen_data:  # the same held-out rows with the target's own continuations in them
            history[-1]["heldout_selfgen_top1"] = eg = heldout_agreement(hf, head, eval_gen_data, steps, exact)
            msg = f", with its continuations {', '.join(f'{x:.3f}' for x in eg)}"
        log(f"epoch {epoch}: loss {tot / max(n_b, 1):.3f} train top-1 {acc / max(n_b, 1):.3f} held-out top-1 "
            f"per step {', '.join(f'{x:.3f}' for x in ev)}{msg} ({e_est:.0f} s)")
        if not step:  # defensive: never write a head no optimizer step has touched
            raise SpecdecError("no optimizer step ran, so nothing was trained and nothing is written; raise --minutes.")
        if best is None or sum(ev) / len(ev) > best[0]:  # a later epoch can be worse: the best one is kept
            best = (sum(ev) / len(ev), len(history) - 1, {k: v.detach().clone() for k, v in head.state_dict().items()})
            if out is not None:  # a checkpoint per better epoch: a stopped run still leaves the best head so far
                save_eagle(out, head, _meta(sm, model, layer_from, n_train, seq, candidates, steps, kl_weight, epoch,
                                            step, history, c0, t0, clock, device, recipe, rc, kept=best[1]))
        if clock() - c0 + e_est > budget:
            break
    if best[1] != len(history) - 1:
        head.load_state_dict(best[2])
        log(f"kept epoch {best[1] + 1}'s head (held-out top-1 per step "
            f"{', '.join(f'{x:.3f}' for x in history[best[1]]['heldout_top1'])}), better than the last epoch's")
    kept = history[best[1]]["heldout_top1"]
    if init_ev is not None and sum(kept) / len(kept) < sum(init_ev) / len(init_ev):
        log(f"warning: the written head's held-out top-1 ({', '.join(f'{x:.3f}' for x in kept)}) is below its "
            f"--init's ({', '.join(f'{x:.3f}' for x in init_ev)}); train longer (--minutes) or keep the --init head.")
    meta = _meta(sm, model, layer_from, n_train, seq, candidates, steps, kl_weight, epoch, step, history, c0, t0,
                 clock, device, recipe, rc, kept=best[1])
    if init_ev is not None:
        meta["heldout_top1_init"] = init_ev
    if out is not None:
        save_eagle(out, head, meta)
        log(f"wrote {out}")
    return dict(meta, history=history, collect_cpu_seconds=round(t_collect, 1), selfgen_rows=n_gen,
                genprose_rows=n_prose_gen)


def _with_generated_prose(sm, tok, texts, train_ids, setting, seq, tokens, device, batch, stop_at, clock):
    """Recipe ``v6``: ``train_ids`` with every ``every``-th row replaced by a prose row whose segments end in tokens
    sampled from the target (:func:`self_generate`), made until ``clock() > stop_at`` (one batch at least), the
    prose used again with new samples while time is left. Returns ``(rows, n_generated_rows)``."""
    seg, gen, temperature, every = setting
    prose = _chunks(tok, [t for t in texts if is_prose(t[0])], seq, tokens, pack=True)
    if not len(prose):
        return train_ids, 0
    slots = torch.arange(every - 1, len(train_ids), every)
    rows = GENERATION_ROWS if device != "cpu" else 8 * batch
    made, have = [], 0
    while have < len(slots) and (not made or clock() <= stop_at):
        part, n = self_generate(sm, prose[: len(slots) - have], seg, gen, rows,
                                stop=lambda: clock() > stop_at, temperature=temperature)
        made.append(part[:n])
        have += n
    out = train_ids.clone()
    out[slots[:have]] = torch.cat(made)
    return out, have


def _init_weights(sm, init, fl) -> tuple[dict, dict]:
    """The weights of the EAGLE artifact ``init`` (``"shipped"``: the packaged one) for a head with fused layers ``fl``:
    the target must be ``sm``'s and the artifact's fused layers ``fl`` or none (then ``proj`` keeps its zeros). Also
    what the new head's metadata records of it (file name, recipe, held-out top-1)."""
    from specdec.artifacts import _describe, model_identity, read_draft_artifact
    from specdec.train_draft import shipped_draft

    path = shipped_draft(sm, "eagle") if str(init) == "shipped" else Path(init)
    if path is None:
        raise SpecdecError("no EAGLE head ships for this target; "
                           "pass init=<path of an EAGLE artifact> or none.")
    meta, tensors = read_draft_artifact(path, "specdec train-draft --kind eagle")
    if not isinstance(meta, dict) or meta.get("kind") != "eagle":
        raise SpecdecError(f"init={str(init)!r}: {path} is not an EAGLE head artifact; pass one written by "
                           "`specdec train-draft --kind eagle`.")
    if meta.get("target") != model_identity(sm):
        raise SpecdecError(f"init={str(init)!r} was trained for {_describe(meta['target'])}, not this target; "
                           "pass a head trained for it.")
    have = meta.get("feature_layers") or None
    if have is not None and have != fl:
        raise SpecdecError(f"init={str(init)!r} fuses layers {have}, this recipe {fl}; start from a head with the "
                           "same layers or none.")
    info = dict(file=path.name, recipe=meta.get("recipe"), heldout_top1=meta.get("heldout_top1"))
    return {k: v.float() for k, v in tensors.items()}, info


def _meta(sm, model, layer_from, n_train, seq, candidates, steps, kl_weight, epoch, step, history, c0, t0, clock,
          device, recipe, rc, kept: int | None = None) -> dict:
    """The artifact's metadata; ``kept``: the index in ``history`` of the epoch whose head is written (default the
    last)."""
    from specdec.artifacts import model_identity

    return dict(target=model_identity(sm), model=model, layer_from=layer_from, tokens=int(n_train), seq=seq,
                feature_layers=rc.get("feature_layers"),
                recipe=recipe, recipe_settings=rc,
                candidates=candidates, steps=steps, kl_weight=kl_weight, epochs=epoch, optimizer_steps=step,
                heldout_top1=history[-1 if kept is None else kept]["heldout_top1"] if history else None,
                kept_epoch=(len(history) if kept is None else kept + 1) if history else None,
                device=device, budget_seconds_used=round(clock() - c0, 1), wall_seconds=round(time.perf_counter() - t0, 1),
                held_out=dict(modules=list(HELD_OUT_MODULES), pydoc_topics="every 5th topic in sorted order"))
