"""Semantic Retrieval Heads (SRHs): Attention Recall Rate, the offline greedy search, the JSON artifact,
and the ``specdec profile-srh`` command.

**ARR** (Dustin): the share of the full (dense) attention mass of the verification rows that a
sparse verification set keeps visible. For target layer ``l``, sequence ``b``, set ``I``::

    ARR_l(I) = 1/(H·T) · Σ_h Σ_t Σ_{i ∈ I ∪ new} p^{(l,h)}_{t,i}

where ``p`` is the dense softmax attention of the ``T = γ+1`` verify rows and ``new`` are the
rows' own positions (always visible). ARR = 1 when ``I`` covers the context.

**Calibration** (teacher-forced on real text): at each probe point ``p`` of a prefilled document,
the *target history* is the target's attention of the γ+1 rows just before ``p``, the *draft
lookahead* is the drafter's attention of the γ rows from ``p``, and the *truth* is the target's
dense attention of the γ+1 rows from ``p``. Per (layer, head) signals are recorded once; the
search then only builds sets and sums masses.

**Greedy search** (Dustin's Algorithm 1, our reading): start from no heads; at each step try
adding every candidate head (the best ``pool`` heads of each model by their own ARR) to the
draft or the target set, for every split ``m`` on a grid, and keep the (head, m) that raises the
mean ARR over all target layers most; stop at ``max_heads`` or when the gain is below ``min_gain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from specdec.artifacts import FORMAT, load_srh, model_identity, save_srh  # noqa: F401 - the artifact lives in the library
from specdec.errors import SpecdecError
from specdec.interfaces import ScoreRequest

# ---------------------------------------------------------------------------------------------------
# ARR
# ---------------------------------------------------------------------------------------------------
def visible_set(indices: torch.Tensor, lengths: torch.Tensor, L: int) -> torch.Tensor:
    """``(B, L)`` float mask of ``indices`` ``(B, K)`` (``-1`` = unused) ∪ positions ``>= lengths``."""
    B = indices.shape[0]
    sel = torch.zeros(B, L + 1, device=indices.device)
    sel.scatter_(1, torch.where((indices < 0) | (indices >= L), torch.full_like(indices, L), indices), 1.0)
    new = torch.arange(L, device=indices.device).view(1, L) >= lengths.view(B, 1)
    return torch.maximum(sel[:, :L], new.float())


def attention_recall(indices: torch.Tensor, mass: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """ARR per layer and sequence.

    Args:
        indices: ``(B, K)`` the sparse set (``-1`` = unused).
        mass: ``(N, B, L)`` dense attention of the verify rows per layer, averaged over query heads
            and rows (each ``(l, b)`` row sums to 1).
        lengths: ``(B,)`` verified tokens (positions ``>= lengths`` are the rows themselves).

    Returns:
        ``(N, B)`` float32.
    """
    vis = visible_set(indices, lengths, mass.shape[-1])
    return (mass * vis.unsqueeze(0)).sum(-1)


# ---------------------------------------------------------------------------------------------------
# calibration
# ---------------------------------------------------------------------------------------------------
def head_request(rows: Sequence[int]) -> ScoreRequest:
    """Record every query head's dense softmax attention of ``rows`` over the context, summed over the
    rows: ``scores[layer]`` ``(B, H, L)``."""
    return ScoreRequest(rows=list(rows), kind="softmax", heads="each", source="context")


@dataclass
class Calibration:
    """Signals at ``J`` probe points (each ``L`` wide).

    Attributes:
        lengths: ``(J,)`` verified tokens at each probe point.
        truth: ``(N_t, J, L)`` dense attention of the γ+1 verify rows per target layer (mean over heads and rows).
        history: ``(N_t, H_t, J, L)`` target attention of the previous γ+1 rows per head (sum over rows).
        lookahead: ``(N_d, H_d, J, L)`` draft attention of the γ draft rows per head (sum over rows), the
            draft fed its own greedy tokens as when it drafts online.
    """

    lengths: torch.Tensor
    truth: torch.Tensor
    history: torch.Tensor
    lookahead: torch.Tensor
    meta: dict = field(default_factory=dict)

    @staticmethod
    def cat(parts: list["Calibration"]) -> "Calibration":
        L = max(p.truth.shape[-1] for p in parts)

        def pad(x):
            return torch.nn.functional.pad(x, (0, L - x.shape[-1]))

        return Calibration(torch.cat([p.lengths for p in parts]), torch.cat([pad(p.truth) for p in parts], 1),
                           torch.cat([pad(p.history) for p in parts], 2), torch.cat([pad(p.lookahead) for p in parts], 2),
                           dict(parts[0].meta))


def probe_positions(C: int, gamma: int) -> int:
    """How many distinct probe points a context of ``C`` tokens has: the positions of its second half that leave
    ``γ + 1`` tokens after them."""
    return max(0, C - gamma - 1 - C // 2 + 1)


def probe_points(C: int, gamma: int, points: int) -> list[int]:
    """``points`` probe points spread evenly over :func:`probe_positions`, each once (more points than positions
    give every position once: ``linspace(...).round()`` repeated them, each measured and weighted twice)."""
    return sorted(set(torch.linspace(C // 2, C - gamma - 1, points).round().long().tolist()))


@torch.no_grad()
def calibrate(target, drafter, ids: list[int], gamma: int, points: int, prefilled=None,
              probes: Sequence[int] | None = None) -> Calibration:
    """Record the three signals at ``points`` probe points in the second half of ``ids`` (teacher-forced).

    ``prefilled``: an :class:`specdec.engine.Prefilled` of ``ids`` to skip the target prefill.
    ``probes``: explicit probe points instead (each needs ``γ+1`` tokens before it and ``γ+1`` after).
    """
    from specdec.engine import SpeculativeEngine

    C = len(ids)
    if C < 4 * (gamma + 2) or points < 1:
        raise SpecdecError(f"calibration needs a context of at least {4 * (gamma + 2)} tokens and points >= 1 (got {C}, {points}).")
    if probes is not None and any(not gamma + 1 <= p <= C - gamma - 1 for p in probes):
        raise SpecdecError(f"probe points must lie in [{gamma + 1}, {C - gamma - 1}] for {C} tokens and gamma {gamma}.")
    dev = target.device
    if target.dims.n_global < target.dims.n_layers:
        # sliding-window layers: the probes re-run earlier positions, so their rings must not wrap
        cache = target.new_cache(1, C, slack=C)
        x = torch.tensor([ids], device=dev)
        for s in range(0, C, 1024):
            target.forward(x[:, s : s + 1024], cache, torch.tensor([s], device=dev), logits_to_keep=1)
    else:
        pre = prefilled or SpeculativeEngine(target, eos_token_id=-1).prefill([ids])
        cache = target.new_cache(1, C)
        cache.k.copy_(pre.k[..., :C, :])
        cache.v.copy_(pre.v[..., :C, :])
    probe = list(probes) if probes is not None else probe_points(C, gamma, points)
    truths, hists, looks, lens = [], [], [], []
    draft_model = drafter.draft_model
    for p in probe:
        # target: rows p-γ-1 .. p+γ (the previous pass's rows, then this pass's rows), dense
        start = p - gamma - 1
        rec, rec2 = head_request(range(gamma + 1)), head_request(range(gamma + 1))
        x = torch.tensor([ids[start : p + gamma + 1]], device=dev)
        target.forward(x[:, : gamma + 1], cache, torch.tensor([start], device=dev), scores=rec, logits_to_keep=1)
        target.forward(x[:, gamma + 1 :], cache, torch.tensor([p], device=dev), scores=rec2, logits_to_keep=1)
        N = target.dims.n_global  # signals live on the global (full-context) layers
        hists.append(torch.stack([rec.scores[l][0] for l in range(N)]))  # (N, H, L)
        t = torch.stack([rec2.scores[l][0] for l in range(N)])  # (N, H, L)
        truths.append(t.sum(1) / (t.shape[1] * (gamma + 1)))
        # draft: γ rows from position p, fed its *own* greedy tokens as online (not the true text: a weak
        # drafter's attention over a wrong continuation is what the selector really gets); its cache is the
        # target's first layers for early exit, else its own; the positions it writes are restored after
        dcache = _draft_cache_for(drafter, cache, ids, p)
        saved = (dcache.k[:, :, :, p : p + gamma].clone(), dcache.v[:, :, :, p : p + gamma].clone())
        tok, look = x[:, gamma + 1 : gamma + 2], 0
        for j in range(gamma):
            rec3 = head_request([0])
            logits = draft_model.forward(tok, dcache, torch.tensor([p + j], device=dev), scores=rec3, logits_to_keep=1)
            look = look + torch.stack([rec3.scores[l][0] for l in range(draft_model.dims.n_global)])
            tok = logits[:, -1].argmax(-1, keepdim=True)
        dcache.k[:, :, :, p : p + gamma] = saved[0]
        dcache.v[:, :, :, p : p + gamma] = saved[1]
        looks.append(look)
        lens.append(p)
    return Calibration(torch.tensor(lens, device=dev), torch.stack(truths, 1), torch.stack(hists, 2),
                       torch.stack(looks, 2), dict(gamma=gamma))


#: filler of the retrieval calibration prompts: not a document the fidelity study evaluates on
RETRIEVAL_FILLER = "stdlib:typing"


def retrieval_calibration(target, drafter, n: int, context: int, gamma: int, filler: str = RETRIEVAL_FILLER,
                          seed: int = 1234) -> Calibration:
    """Probe points where the target must *retrieve*: ``n`` pass-key prompts (the key at evenly spaced
    depths of ``filler``), teacher-forced on the answer; the probe is the first answer token.

    Prose calibration alone is dominated by local attention, so the search picks heads that see the
    recent past and hands every free slot to one signal; these probes make it value the heads that
    find a far-away fact (the Semantic Retrieval Heads proper).
    """
    import random

    from specdec.data import load_document
    from specdec.data import passkey_prompt

    if n < 1:
        raise SpecdecError(f"retrieval calibration needs n >= 1 prompts (got {n}).")
    rng = random.Random(seed)
    text = load_document(filler)
    parts, needles = [], []
    for i in range(n):
        key = str(rng.randint(10000, 99999))
        answer = target.tokenizer(f" {key}.\n", add_special_tokens=False).input_ids
        if len(answer) < gamma + 1:
            answer = answer + target.tokenizer("\n" * (gamma + 1), add_special_tokens=False).input_ids
        prompt = passkey_prompt(target.tokenizer, text, context - len(answer), (i + 0.5) / n, key)
        parts.append(calibrate(target, drafter, prompt + answer, gamma, 1, probes=[len(prompt)]))
        digits = target.tokenizer(key, add_special_tokens=False).input_ids
        needles.append([p for p in range(len(prompt) - len(digits)) if prompt[p : p + len(digits)] == digits][:1])
    cal = Calibration.cat(parts)
    cal.meta["key_positions"] = [[p + j for p in ps for j in range(len(digits))] for ps in needles]
    return cal


def _draft_cache_for(drafter, cache, ids, p):
    n = drafter.draft_model.dims.n_layers
    if hasattr(drafter, "exit_layers"):
        return cache.first_layers(n)
    if getattr(drafter, "_calib_cache", None) is None or drafter._calib_ids != ids:
        dc = drafter.draft_model.new_cache(1, len(ids), slack=len(ids))
        x = torch.tensor([ids], device=cache.k.device)
        for s in range(0, len(ids), 1024):
            drafter.draft_model.forward(x[:, s : s + 1024], dc, torch.tensor([s], device=cache.k.device), logits_to_keep=1)
        drafter._calib_cache, drafter._calib_ids = dc, ids
    return drafter._calib_cache


# ---------------------------------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------------------------------
def _signal(stack: torch.Tensor, heads: list[tuple[int, int]]) -> torch.Tensor | None:
    """Sum of per-head signals ``stack`` ``(N, H, J, L)`` over ``heads`` → ``(J, L)``."""
    if not heads:
        return None
    return sum(stack[l, h] for l, h in heads)


def evaluate(cal: Calibration, budget: int, sinks: int, recent: int, t_heads, d_heads, m_ratio: float) -> torch.Tensor:
    """ARR per target layer ``(N_t,)`` averaged over the probe points for one SRH choice and split."""
    from specdec.selectors.base import fixed_positions
    from specdec.selectors.hybrid_srh import hybrid_select

    lengths = cal.lengths
    b = torch.minimum(torch.full_like(lengths, budget), lengths)
    _, room = fixed_positions(lengths, b, sinks, recent)
    m = torch.round(room.double() * m_ratio).long()
    idx = hybrid_select(lengths, b, sinks, recent, _signal(cal.lookahead, d_heads), _signal(cal.history, t_heads), m)
    return attention_recall(idx, cal.truth, lengths).mean(1)


def per_layer_signals(cal: Calibration, budget: int, sinks: int, recent: int, layer_map: list[int],
                      grid: Sequence[float]) -> dict[str, list[float]]:
    """The complementarity analysis: at each target layer ``l``, ARR of the set chosen from the draft's
    attention at draft layer ``layer_map[l]`` (all heads), from the target's own history at ``l``, and the
    best hybrid of the two on ``grid``."""
    H_t, H_d = cal.history.shape[1], cal.lookahead.shape[1]
    out: dict[str, list[float]] = {"draft_only": [], "target_only": [], "hybrid": [], "hybrid_m_ratio": []}
    for l in range(cal.truth.shape[0]):
        t = [(l, h) for h in range(H_t)]
        d = [(layer_map[l], h) for h in range(H_d)]
        one = cal.truth[l : l + 1]
        sub = Calibration(cal.lengths, one, cal.history, cal.lookahead)
        scores = [float(evaluate(sub, budget, sinks, recent, t, d, r)[0]) for r in grid]
        out["draft_only"].append(scores[-1])
        out["target_only"].append(scores[0])
        best = max(range(len(grid)), key=lambda i: scores[i])
        out["hybrid"].append(scores[best])
        out["hybrid_m_ratio"].append(float(grid[best]))
    return out


def greedy_search(cal: Calibration, budget: int, sinks: int = 4, recent: int = 16, max_heads: int = 8,
                  pool: int = 12, grid: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0), min_gain: float = 1e-4,
                  progress=None) -> dict[str, Any]:
    """Pick target/draft retrieval heads and the split ``m`` maximising the mean ARR over target layers.

    Returns ``dict(target_heads, draft_heads, m_ratio, arr, trace)``; ``trace`` lists each step's gain.
    """
    N_t, H_t = cal.history.shape[:2]
    N_d, H_d = cal.lookahead.shape[:2]

    def score(t, d, r) -> float:
        return float(evaluate(cal, budget, sinks, recent, t, d, r).mean())

    # candidate pools. A head is ranked *in a hybrid*, not alone: a retrieval head's history signal
    # alone misses the local context a hybrid gets from the other signal, and would rank last.
    # 1) the best draft head alone; 2) each target head with it, best split; 3) each draft head with
    # the best target head of 2), best split.
    d0 = max(((score([], [(l, h)], 1.0), (l, h)) for l in range(N_d) for h in range(H_d)))[1]
    solo_t = sorted(((max(score([(l, h)], [d0], r) for r in grid), (l, h)) for l in range(N_t) for h in range(H_t)),
                    reverse=True)
    if progress:
        progress(0.3)
    t0 = solo_t[0][1]
    solo_d = sorted(((max(score([t0], [(l, h)], r) for r in grid), (l, h)) for l in range(N_d) for h in range(H_d)),
                    reverse=True)
    if progress:
        progress(0.5)
    cand_t = [h for _, h in solo_t[:pool]]
    cand_d = [h for _, h in solo_d[:pool]]
    t_sel: list = []
    d_sel: list = []
    best_r, best = 0.0, 0.0
    trace = []
    for step in range(max_heads):
        trial = None
        for which, cands in (("target", cand_t), ("draft", cand_d)):
            for c in cands:
                if c in (t_sel if which == "target" else d_sel):
                    continue
                t = t_sel + [c] if which == "target" else t_sel
                d = d_sel + [c] if which == "draft" else d_sel
                for r in grid:
                    if (not d and r > 0) or (not t and r < 1):
                        continue  # a signal without heads gets no slots
                    s = score(t, d, r)
                    if trial is None or s > trial[0]:
                        trial = (s, which, c, r)
        if trial is None or trial[0] - best < min_gain:
            break
        best, which, c, best_r = trial
        (t_sel if which == "target" else d_sel).append(c)
        trace.append(dict(step=step + 1, added=which, head=list(c), m_ratio=best_r, mean_arr=best))
        if progress:
            progress(0.5 + 0.5 * (step + 1) / max_heads)
    # guarantee both signals have at least one head (so the hybrid is defined online)
    if not t_sel:
        t_sel = [cand_t[0]]
    if not d_sel:
        d_sel = [cand_d[0]]
    return dict(target_heads=[list(x) for x in t_sel], draft_heads=[list(x) for x in d_sel], m_ratio=best_r,
                arr=best, trace=trace, solo_target_best=solo_t[0][0], solo_draft_best=solo_d[0][0])


def srh_report(cal: Calibration, result: dict, budget: int, sinks: int, recent: int) -> dict[str, list[float]]:
    """ARR per target layer for the chosen SRHs: draft-only, target-only and hybrid (at the chosen m)."""
    t, d, r = [tuple(x) for x in result["target_heads"]], [tuple(x) for x in result["draft_heads"]], result["m_ratio"]
    return dict(draft_only=evaluate(cal, budget, sinks, recent, t, d, 1.0).tolist(),
                target_only=evaluate(cal, budget, sinks, recent, t, d, 0.0).tolist(),
                hybrid=evaluate(cal, budget, sinks, recent, t, d, r).tolist())


def profile_srh(target, drafter, documents: Sequence[str], context: int, budget: int, gamma: int = 4,
                points: int = 12, sinks: int = 4, recent: int = 16, max_heads: int = 8, pool: int = 12,
                progress=None, retrieval: int = 0, retrieval_filler: str = RETRIEVAL_FILLER) -> dict[str, Any]:
    """Calibrate on ``documents`` (plus ``retrieval`` pass-key probes) and search; returns the artifact
    payload (not yet written)."""
    from specdec.data import context_ids, load_document

    parts = []
    steps = len(documents) + (1 if retrieval else 0)
    for i, doc in enumerate(documents):
        # the window ends 2,000 tokens before the document's end: the end is what fidelity and eval read
        ids = context_ids(target.tokenizer, load_document(doc), context, offset=2000, name=doc)
        parts.append(calibrate(target, drafter, ids, gamma, points))
        if progress:
            progress("calibrate", (i + 1) / steps)
    if retrieval:
        parts.append(retrieval_calibration(target, drafter, retrieval, context, gamma, retrieval_filler))
        if progress:
            progress("calibrate", 1.0)
    cal = Calibration.cat(parts)
    res = greedy_search(cal, budget, sinks, recent, max_heads, pool,
                        progress=(lambda f: progress("search", f)) if progress else None)
    layer_map = drafter.layer_map(target.dims.n_global)
    return dict(
        target=model_identity(target), draft=drafter.identity(),
        target_heads=res["target_heads"], draft_heads=res["draft_heads"], layer_map=layer_map,
        m_ratio=res["m_ratio"],
        # the probe points measured per document (each position once: fewer than ``points`` past the positions)
        calibration=dict(documents=list(documents), context=context, budget=budget, gamma=gamma,
                         points=len(probe_points(context, gamma, points)),
                         sinks=sinks, recent=recent, retrieval=retrieval, retrieval_filler=retrieval_filler),
        search=dict(mean_arr=res["arr"], trace=res["trace"], solo_target_best=res["solo_target_best"],
                    solo_draft_best=res["solo_draft_best"]),
        arr_per_layer_srh=srh_report(cal, res, budget, sinks, recent),
        arr_per_layer_full_signals=per_layer_signals(cal, budget, sinks, recent, layer_map, (0.0, 0.25, 0.5, 0.75, 1.0)),
    )


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------
def register(app) -> None:
    """Add ``specdec profile-srh``."""
    import typer

    from specdec.friendly import friendly
    from specdec.loading import load_model

    @app.command("profile-srh")
    @friendly
    def profile_srh_cmd(
        output: Path = typer.Option(..., "--output", help="where to write the SRH JSON artifact"),
        model: str = typer.Option("smollm2-135m", "--model", help="target model: embedded name, local dir, .gguf file or cached hub id"),
        draft_model: Optional[str] = typer.Option(None, "--draft-model", help="separate draft model (default: early exit)"),
        draft_layers: int = typer.Option(9, "--draft-layers", help="early-exit depth when no --draft-model"),
        documents: str = typer.Option("pydoc,stdlib:argparse", "--documents", help="calibration documents"),
        context: int = typer.Option(2048, "--context-tokens", help="calibration context length in tokens"),
        budget: int = typer.Option(512, "--budget", help="verification budget the heads are chosen for (KV entries)"),
        gamma: int = typer.Option(4, "--gamma", help="draft length γ"),
        points: int = typer.Option(12, "--points", help="probe points per document (at most the distinct "
                                  "positions: the context's second half less γ + 1 at its end)"),
        max_heads: int = typer.Option(8, "--max-heads", help="most heads the greedy search picks per model"),
        retrieval: int = typer.Option(8, "--retrieval", help="pass-key probes added to the calibration (0 = prose only)"),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
    ) -> None:
        """Find the Semantic Retrieval Heads and the split m of a (target, draft) pair (Dustin, Algorithm 1)."""
        from rich.progress import Progress

        from specdec.drafters import EarlyExitDrafter, ModelDrafter

        from specdec.outputs import check_outputs

        check_outputs([(output, "--output")])
        if budget < 1 or gamma < 1 or points < 1 or max_heads < 1:
            raise SpecdecError("--budget, --gamma, --points and --max-heads must be >= 1.")
        if retrieval < 0:
            raise SpecdecError(f"--retrieval must be >= 0 (got {retrieval}).")
        if context < 24:
            raise SpecdecError(f"--context-tokens must be >= 24 (got {context}).")
        n = probe_positions(context, gamma)
        if points > n:  # linspace(...).round() measured positions twice
            raise SpecdecError(f"--points {points} exceeds the {n} distinct probe positions of --context-tokens "
                               f"{context} (its second half, less γ + 1 = {gamma + 1} at the end); use "
                               f"--points <= {n} or a longer --context-tokens.")
        if budget >= context:  # every head recalls everything: an artifact of arbitrary heads (ARR 1.000)
            raise SpecdecError(f"--budget {budget} must be smaller than --context-tokens {context}: a budget holding "
                               "the whole context selects nothing to rank the heads by.")
        if budget <= 4 + 16:  # the sinks and the recent window the calibration keeps
            raise SpecdecError(f"--budget {budget} leaves no slot after the 4 sinks and the 16 recent tokens "
                               "always kept; use --budget > 20.")
        docs = [d.strip() for d in documents.split(",") if d.strip()]
        if not docs and not retrieval:
            raise SpecdecError("nothing to calibrate on: --documents is empty and --retrieval is 0; give a document "
                               "or pass-key probes.")
        from specdec.data import check_documents

        for line in check_documents(docs):  # before the model loads
            typer.echo(f"note: {line}", err=True)
        target = load_model(model, "float32", device, "reference")
        top = target.dims.max_positions  # it failed in the prefill, naming max_new_tokens and context_tokens=
        if context > top:
            raise SpecdecError(f"--context-tokens {context} exceeds the model's {top} positions; use "
                               f"--context-tokens <= {top}.")
        if draft_model:
            drafter = ModelDrafter(load_model(draft_model, "float32", device, "reference"))
        else:
            drafter = EarlyExitDrafter(target, draft_layers)
        with Progress() as bar:
            task = bar.add_task("profile-srh", total=1.0)

            def progress(phase: str, frac: float) -> None:
                done = 0.5 * frac if phase == "calibrate" else 0.5 + 0.5 * frac
                bar.update(task, completed=done, description=f"profile-srh: {phase}")

            payload = profile_srh(target, drafter, docs, context, budget, gamma, points, max_heads=max_heads,
                                  progress=progress, retrieval=retrieval)
        save_srh(output, payload)
        s = payload["arr_per_layer_srh"]
        avg = {k: sum(v) / len(v) for k, v in s.items()}
        typer.echo(f"SRH: target {payload['target_heads']}, draft {payload['draft_heads']}, m_ratio {payload['m_ratio']}; "
                   f"mean ARR draft-only {avg['draft_only']:.3f}, target-only {avg['target_only']:.3f}, "
                   f"hybrid {avg['hybrid']:.3f} → {output}")
