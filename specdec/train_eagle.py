"""Self-distil an EAGLE-style draft head (:mod:`specdec.eagle`) from the target.

1. **Collect** once: the target runs over training chunks (text that ships with Python, held-out
   documents excluded, :func:`specdec.train_draft.training_texts`) and we keep its final normed hidden
   states ``f (B, T, d)`` and its top-``C`` next-token logits (float16).
2. **Train** the head (``fc`` + one decoder layer) on those features only — the target is not run again.
   Row ``i`` sees ``[embed(t_{i+1}); f_i]`` at position ``i`` and must predict ``f_{i+1}`` (smooth-L1
   feature regression) and the target's next-token distribution at ``i+1`` (KL over its top-``C``
   candidates through the shared LM head).
   **Unrolled steps** (as drafting does): step ``j >= 2`` feeds the previous step's prediction
   ``f̂_i`` (from row ``i-1``) instead of ``f_i``; its attention reads step 1's K/V at earlier positions
   and its own at ``i`` — exactly what draft step 2 sees, an approximation for later steps.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from specdec.eagle import EagleHead, _finish, _qkv, save_eagle
from specdec.errors import SpecdecError
from specdec.train_draft import HELD_OUT_MODULES, _chunks, _draft_layer, _target_layer, check_trainable, held_out_texts, training_texts


@torch.no_grad()
def features(hf, ids: torch.Tensor, C: int, half: bool = True):
    """Target pass over ``ids (B, T)``: normed final hidden ``f (B, T, d)`` and top-``C`` logits (values, ids),
    stored in float16 unless ``half`` is false."""
    m = hf.model
    pos = torch.arange(ids.shape[1], device=ids.device).view(1, -1).expand(ids.shape[0], -1)
    x = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(x, pos)
    for layer in m.layers:
        x, _, _ = _target_layer(layer, x, cos, sin)
    f = m.norm(x)
    top, idx = hf.lm_head(f).float().topk(C, dim=-1)
    return (f.half(), top.half(), idx.int()) if half else (f, top, idx)


def _own_plus_earlier(layer, x, k1, v1, cos, sin):
    """Row ``i`` attends to ``k1, v1`` (step 1's K/V) at positions ``< i`` and to its own K/V at ``i``."""
    return _draft_layer(layer, x, k1, v1, cos, sin)


def head_forward(hf, head: EagleHead, ids, f, steps: int = 1):
    """Training forward: per unrolled step, the predicted features ``f̂ (B, T-1, d)`` of positions ``1..T-1``."""
    m = hf.model
    B, T = ids.shape
    emb = m.embed_tokens(ids[:, 1:])  # (B, T-1, d): token t_{i+1} for row i
    pos = torch.arange(T - 1, device=ids.device).view(1, -1).expand(B, -1)
    cos, sin = m.rotary_emb(emb, pos)
    f = f.float()
    x = head.inputs(emb, f[:, :-1])
    q, k1, v1 = _qkv(head.layer, x, cos, sin)
    att = nn.functional.scaled_dot_product_attention(q, k1, v1, is_causal=True, enable_gqa=True)
    pred = m.norm(_finish(head.layer, x, att))
    out = [pred]
    for _ in range(steps - 1):
        prev = torch.cat([f[:, :1], pred[:, :-1]], dim=1)  # row i gets f̂_i (row i-1's prediction); row 0 keeps f_0
        x = head.inputs(emb, prev)
        pred = m.norm(_own_plus_earlier(head.layer, x, k1, v1, cos, sin))
        out.append(pred)
    return out


def loss_terms(hf, pred, f, top, idx, kl_weight: float, full_rows: int = 32):
    """Smooth-L1 to ``f_{i+1}`` + ``kl_weight`` · KL(teacher top-C ‖ draft) + the full-vocabulary cross-entropy
    to the teacher's argmax on ``full_rows`` random rows (the candidates' KL leaves the other tokens free),
    and the top-1 agreement within the candidates."""
    tgt = f[:, 1:].float()
    reg = nn.functional.smooth_l1_loss(pred, tgt)
    flat = pred.flatten(0, 1)
    pick = torch.randperm(flat.shape[0], device=flat.device)[:full_rows]
    ce = nn.functional.cross_entropy(hf.lm_head(flat[pick]), idx[:, 1:, 0].long().flatten()[pick])
    W = hf.lm_head.weight  # (V, d)
    ix = idx[:, 1:].long()
    z = (pred.unsqueeze(-2) @ W[ix].transpose(-1, -2)).squeeze(-2)  # (B, T-1, C)
    p = torch.softmax(top[:, 1:].float(), -1)
    kl = (p * (torch.log(p + 1e-9) - torch.log_softmax(z, -1))).sum(-1).mean()
    return reg + kl_weight * kl + 0.5 * ce, (z.argmax(-1) == 0).float().mean()


@torch.no_grad()
def heldout_agreement(hf, head, data, steps: int) -> list[float]:
    """Per unrolled step, share of held-out rows whose full-vocabulary argmax equals the target's."""
    hits, n = [0] * steps, 0
    for ids, f, top, idx in data:
        preds = head_forward(hf, head, ids, f, steps)
        for j, p in enumerate(preds):
            hits[j] += int((hf.lm_head(p).argmax(-1) == idx[:, 1:, 0].long()).sum())
        n += preds[0].shape[0] * preds[0].shape[1]
    return [h / max(n, 1) for h in hits]


def train(model: str = "smollm2-135m", tokens: int = 100_000, eval_tokens: int = 1024, seq: int = 256, batch: int = 4,
          candidates: int = 64, minutes: float = 8.0, collect_share: float = 0.4, lr: float = 1e-3, steps: int = 3,
          kl_weight: float = 1.0, out: str | Path | None = None, seed: int = 0, log=print, device: str = "cpu") -> dict:
    """Collect the target's features on ``tokens`` training tokens (at most ``collect_share`` of the budget),
    then train the head until ``minutes`` have passed: this process's CPU time on the CPU (one thread: the
    wall time of an idle core, however busy the machine is), wall time on a GPU (``device="cuda"``).
    Writes ``out`` (after every epoch too, so a stopped run leaves a usable head)."""
    from specdec.artifacts import model_identity
    from specdec.models import SpecdecModel

    clock = time.process_time if device == "cpu" else time.perf_counter
    t0, c0 = time.perf_counter(), clock()
    torch.manual_seed(seed)
    sm = SpecdecModel.from_pretrained(model, device=device)
    hf, tok = sm.hf, sm.tokenizer
    check_trainable(sm, model)
    if steps < 1:
        raise SpecdecError(f"steps must be >= 1 (got {steps}).")
    hf.requires_grad_(False)
    budget = minutes * 60
    train_ids = _chunks(tok, training_texts(tokens * 6), seq, tokens)
    eval_ids = _chunks(tok, held_out_texts(), seq, eval_tokens)

    def collect(ids, share):
        data = []
        for s in range(0, len(ids), batch):
            if clock() - c0 > share * budget:
                break
            x = ids[s : s + batch]
            x = x.to(device)
            data.append((x, *features(hf, x, candidates)))
        return data

    eval_data = collect(eval_ids, 1.0)
    train_data = collect(train_ids, collect_share)
    n_train = sum(x[0].numel() for x in train_data)
    t_collect = clock() - c0
    log(f"collected target features on {n_train} training / {sum(x[0].numel() for x in eval_data)} held-out tokens "
        f"in {t_collect:.0f} CPU s ({time.perf_counter() - t0:.0f} s wall)")
    layer_from = len(hf.model.layers) - 1
    head = EagleHead(hf.model.layers[layer_from], hf.config.hidden_size).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    left = budget - (clock() - c0)
    history, step, epoch = [], 0, 0
    e_est = None
    while True:
        e0 = clock()
        tot = acc = 0.0
        for i in torch.randperm(len(train_data)).tolist():
            ids, f, top, idx = train_data[i]
            frac = min(1.0, (clock() - c0 - t_collect) / max(left, 1.0))
            for g in opt.param_groups:  # linear decay over the remaining budget
                g["lr"] = lr * max(0.05, 1.0 - frac)
            preds = head_forward(hf, head, ids, f, steps)
            losses = [loss_terms(hf, p, f, top, idx, kl_weight) for p in preds]
            loss = sum(l for l, _ in losses) / len(losses)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            tot += loss.item()
            acc += losses[0][1].item()
            step += 1
            if clock() - c0 > budget - (e_est or 0) * 0.02:
                break
        epoch += 1
        e_est = clock() - e0
        ev = heldout_agreement(hf, head, eval_data, steps)
        history.append(dict(epoch=epoch, loss=tot / len(train_data), train_top1=acc / len(train_data), heldout_top1=ev))
        log(f"epoch {epoch}: loss {tot / len(train_data):.3f} train top-1 {acc / len(train_data):.3f} held-out top-1 "
            f"per step {', '.join(f'{x:.3f}' for x in ev)} ({e_est:.0f} CPU s)")
        if out is not None:  # a checkpoint per epoch: a stopped run still leaves a usable head
            save_eagle(out, head, _meta(sm, model, layer_from, n_train, seq, candidates, steps, kl_weight, epoch, step,
                                        history, c0, t0, clock, device))
        if clock() - c0 + e_est > budget:
            break
    meta = _meta(sm, model, layer_from, n_train, seq, candidates, steps, kl_weight, epoch, step, history, c0, t0,
                 clock, device)
    if out is not None:
        save_eagle(out, head, meta)
        log(f"wrote {out}")
    return dict(meta, history=history, collect_cpu_seconds=round(t_collect, 1))


def _meta(sm, model, layer_from, n_train, seq, candidates, steps, kl_weight, epoch, step, history, c0, t0, clock,
          device) -> dict:
    from specdec.artifacts import model_identity

    return dict(target=model_identity(sm), model=model, layer_from=layer_from, tokens=int(n_train), seq=seq,
                candidates=candidates, steps=steps, kl_weight=kl_weight, epochs=epoch, optimizer_steps=step,
                heldout_top1=history[-1]["heldout_top1"] if history else None,
                device=device, budget_seconds_used=round(clock() - c0, 1), wall_seconds=round(time.perf_counter() - t0, 1),
                held_out=dict(modules=list(HELD_OUT_MODULES), pydoc_topics="every 5th topic in sorted order"))
