"""Presets ``dustin`` and ``dustin-adaptive``: a draft model + sparse verification over Dustin's hybrid set.

Pipeline (the Dustin paper; docs page *Dustin*)::

    drafter.draft      γ tokens, records the lookahead signal on the draft SRHs
    verifier.verify    I_verify = sinks + recent + top-m(draft) + rest(target history), sparse target pass,
                       records the target SRH attention over the full context (next history signal)
    accept / rollback  as usual — but the verify distribution is the *sparse* target's: near-lossless

``PipelineConfig.options`` (``--option key=value`` style dict) understood here:

* ``srh``: path of a ``specdec profile-srh`` artifact (heads, layer map, m) for this (target, draft) pair;
* ``draft_layers``: early-exit depth of the embedded drafter (default ``max(1, round(0.3 N))``);
* ``draft_model``: a separate draft model (embedded name, directory or hub id) instead of early exit;
* ``m`` / ``m_ratio``: the static split; ``adaptive``: input-aware ``m`` per iteration;
* ``history_decay``: EMA of the target history; ``dense_every`` / ``disagree``: the safety valve;
* ``dense_first``: the first verification of a generation is dense (default true; it seeds the target history).
"""

from __future__ import annotations

from typing import Any

from specdec.errors import SpecdecError
from specdec.presets import PipelineConfig, register_method

OPTIONS = {"srh", "draft_layers", "draft_model", "m", "m_ratio", "adaptive", "history_decay", "dense_every",
           "disagree", "m_grid", "dense_first"}


def _flag(name: str, v: Any) -> bool:
    """A boolean option that may arrive as a string (``--option adaptive=false``)."""
    if isinstance(v, str):
        if v.lower() in ("1", "true", "yes", "on"):
            return True
        if v.lower() in ("0", "false", "no", "off"):
            return False
        raise SpecdecError(f"{name} must be true or false (got {v!r}).")
    return bool(v)


def default_heads(n_layers: int, n_heads: int, draft_layers: int) -> tuple[list, list]:
    """Retrieval heads used when no artifact is given: every head of one mid-depth target layer and of
    the draft's last layer. ``specdec profile-srh`` finds better ones."""
    t_layer = min(n_layers - 1, (2 * n_layers) // 3)
    d_layer = max(0, draft_layers - 1)
    return [[t_layer, h] for h in range(n_heads)], [[d_layer, h] for h in range(n_heads)]


def build_dustin(model, cfg: PipelineConfig, adaptive: bool = False, method: str = "dustin", **kw: Any):
    """Engine with an :class:`~specdec.drafters.EarlyExitDrafter` (or ``draft_model``), a
    :class:`~specdec.selectors.hybrid_srh.HybridSRHSelector` and a :class:`~specdec.verifiers.SparseVerifier`."""
    from specdec.drafters import EarlyExitDrafter, ModelDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.registry import SELECTORS
    from specdec.srh import load_srh

    opts = dict(cfg.options)
    unknown = set(opts) - OPTIONS
    if unknown:
        raise SpecdecError(f"unknown dustin option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(OPTIONS))}.")
    N = model.dims.n_layers
    if opts.get("draft_model"):
        from specdec.models import SpecdecModel

        draft = SpecdecModel.from_pretrained(str(opts["draft_model"]), dtype=model.dtype, device=str(model.device))
        if draft.dims.vocab_size != model.dims.vocab_size:
            raise SpecdecError(
                f"draft_model has a vocabulary of {draft.dims.vocab_size}, the target {model.dims.vocab_size}; "
                "use a draft that shares the target's tokenizer."
            )
        drafter = ModelDrafter(draft)
    else:
        n = int(opts.get("draft_layers", max(1, round(0.3 * N))))
        if N < 2:
            raise SpecdecError("dustin's early-exit drafter needs a target with at least 2 layers; pass draft_model.")
        drafter = EarlyExitDrafter(model, min(n, N - 1) if "draft_layers" not in opts else n)
    sel_kw: dict[str, Any] = dict(cfg.budget_kwargs())
    for key in ("m", "m_ratio", "history_decay", "m_grid"):
        if key in opts:
            sel_kw[key] = opts[key]
    sel_kw["adaptive"] = _flag("adaptive", opts.get("adaptive", adaptive))
    if opts.get("srh"):
        art = load_srh(str(opts["srh"]), model, drafter)
        sel_kw.setdefault("m_ratio", art["m_ratio"])
        sel_kw.update(target_heads=[tuple(x) for x in art["target_heads"]],
                      draft_heads=[tuple(x) for x in art["draft_heads"]], layer_map=art["layer_map"])
    else:
        t_heads, d_heads = default_heads(N, model.dims.n_heads, drafter.n_layers)
        sel_kw.update(target_heads=[tuple(x) for x in t_heads], draft_heads=[tuple(x) for x in d_heads],
                      layer_map=drafter.layer_map(N))
    selector = SELECTORS.build("hybrid_srh", **sel_kw)
    selector.check_heads(drafter.n_layers, drafter.draft_model.dims.n_heads, "draft")
    drafter.set_heads(selector.draft_heads)
    from specdec.verifiers import SparseVerifier

    verifier = SparseVerifier(model, selector, drafter, dense_every=int(opts.get("dense_every", 0)),
                              disagree=opts.get("disagree"), dense_first=_flag("dense_first", opts.get("dense_first", True)))
    return SpeculativeEngine(model, drafter, verifier, gamma=cfg.gamma, sampling=cfg.sampling, method=method, **kw)


@register_method("dustin", "draft model + near-lossless sparse verification on hybrid draft/target SRH signals (Dustin)",
                 lossless=False)
def _dustin(model, cfg: PipelineConfig, **kw: Any):
    return build_dustin(model, cfg, adaptive=False, method="dustin", **kw)


@register_method("dustin-adaptive", "Dustin with an input-aware split m chosen per iteration (beyond the paper)",
                 lossless=False)
def _dustin_adaptive(model, cfg: PipelineConfig, **kw: Any):
    return build_dustin(model, cfg, adaptive=True, method="dustin-adaptive", **kw)
