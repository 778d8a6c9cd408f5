"""Presets ``dustin`` and ``dustin-adaptive``: a draft model + sparse verification over Dustin's hybrid set.

Pipeline (the Dustin paper; docs page *Dustin*)::

    drafter.draft      γ tokens, records the lookahead signal on the draft SRHs
    verifier.verify    I_verify = sinks + recent + top-m(draft) + rest(target history), sparse target pass,
                       records the target SRH attention over the full context (next history signal)
    accept / rollback  as usual — but the verify distribution is the *sparse* target's: near-lossless

``PipelineConfig.options`` (``--option key=value`` style dict), validated by :class:`DustinOptions`:

* ``srh``: path of a ``specdec profile-srh`` artifact (heads, layer map, m) for this (target, draft) pair;
* ``draft_layers``: early-exit depth of the embedded drafter (default ``max(1, round(0.3 N))``);
* ``draft``: a ``specdec train-draft`` artifact (an EAGLE head, :mod:`specdec.eagle`, or a layer-skipping
  draft, :mod:`specdec.skip_drafter`), ``eagle`` / ``skip`` (the one of that kind shipped for the target), or
  ``early-exit``; default: the draft shipped for the target if there is one (the embedded model has both:
  the EAGLE head is the default), else early exit;
* ``draft_model``: a separate draft model (embedded name, directory or hub id) sharing the target's tokenizer;
* ``m`` / ``m_ratio``: the static split; ``adaptive``: input-aware ``m`` per iteration;
* ``history_decay``: EMA of the target history; ``dense_every`` / ``disagree``: the safety valve;
* ``dense_first``: the first verification of a generation is dense (default true; it seeds the target history);
* ``layer_share`` / ``page_size``: a share of the free slots chosen per layer and KV head by Quest page bounds of
  the verify rows' queries (beyond the paper; 0 = the paper's one shared set);
* ``layer_scores`` / ``key_rank``: how the per-layer part ranks tokens: Quest page bounds (``pages``, default) or the
  verify rows' queries against rank-``key_rank`` keys (``keys``, Loki-style, :mod:`specdec.selectors.key_rank`;
  beyond the paper; with ``layer_share > 0``);
* ``margin``: confidence-gated dense re-verification of a pass whose deciding rows have a small logit margin;
* ``lookup_min`` / ``lookup_max``: prompt lookup (:mod:`specdec.lookup`): where the context holds an earlier
  occurrence of the last ``n`` tokens (``n = lookup_max .. lookup_min``), its continuation is the draft, else
  the draft model's; ``lookup_min=0`` turns it off. ``lookup_trust``: a match shorter than this is used only
  where its first token equals the draft model's first draft (default 4 behind an EAGLE head, else 2).
  ``lookup_policy`` (``replace`` | ``chain``), ``lookup_candidates``, ``lookup_veto``, ``lookup_by_head``: how a
  match and the EAGLE head's draft combine (:class:`specdec.lookup.LookupDrafter`; docs page *Dustin*, "Lookup
  policies"). ``lookup_search``: where the ``replace`` policy searches (``auto``: on the device on a GPU with CUDA graphs);
* ``verify``: ``sparse`` (Dustin's, the default) or ``dense`` (the whole context: lossless, the same drafts — how the
  draft's τ is measured); ``tree``: with ``verify=dense``, the draft is a tree (:mod:`specdec.tree`; ``true``: the
  default tree, ``n``: the ``n`` most frequent rank paths, or a list of rank paths), with a lookup branch when prompt
  lookup is on.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator

from specdec.errors import SpecdecError
from specdec.presets import PipelineConfig, register_method, selector_options
from specdec.selectors.hybrid_srh import HybridSRHConfig


#: prompt lookup combined with the draft (:mod:`specdec.lookup`) by default: on held-out prose and code it raised
#: τ with dense verification over the EAGLE head alone (docs page *Dustin*, "Prompt lookup")
LOOKUP_MIN, LOOKUP_MAX = 2, 4
#: ``lookup_trust`` unless given (:func:`default_trust`). Behind an EAGLE head 4: a 2- or 3-token match is used only
#: where its first token is the head's own first draft (chosen on documents apart from the evaluation ones with the
#: recipe-v6 head: τ 2.84 against every match's 2.77). Behind any other drafter 2, every match: the weaker v1 head
#: drafted better so, and an early exit, accepted ~3 % of the time, would veto the matches that carry it.
LOOKUP_TRUST_EAGLE, LOOKUP_TRUST = 4, 2
#: how a match combines with the EAGLE head's draft (:class:`specdec.lookup.LookupDrafter`; docs page *Dustin*, "Lookup
#: policies"): "replace" (a match's continuation replaces the head's tokens). The opt-in "chain" (the head follows the
#: match and continues from it, vetoing a token at >= 0.9 confidence) was >= "replace" on each of 22 (document,
#: context) pairs on the CPU (dense verification), ahead on 3, but its draft step took 1.007 vs 0.493 ms on the H200
#: at B 64 (dustin-25 %: 1.15x vs 1.45x dense; 2026-12-01 23:36 UTC), so it stays opt-in (lookup_policy=chain)
LOOKUP_POLICY, LOOKUP_CANDIDATES, LOOKUP_VETO, LOOKUP_BY_HEAD = "replace", 1, 0.9, False
#: the context of a prompt-lookup match (n-gram, continuation, this many tokens either side) goes first into the
#: draft part of the verification set (:meth:`specdec.lookup.LookupDrafter.keep_copied`): with the EAGLE head's
#: lookahead alone, one needle answer of five at 4,096 tokens and a 25 % budget lost a digit that dense copied
LOOKUP_KEEP = 16


def default_trust(drafter) -> int:
    """Dustin's ``lookup_trust`` behind ``drafter``: :data:`LOOKUP_TRUST_EAGLE` for an EAGLE head, else
    :data:`LOOKUP_TRUST`."""
    from specdec.eagle import EagleDrafter

    return LOOKUP_TRUST_EAGLE if isinstance(drafter, EagleDrafter) else LOOKUP_TRUST


def default_lookup(drafter):
    """``drafter`` behind prompt lookup with Dustin's defaults (the constants above), as ``--method dustin`` builds it:
    the veto applies to the ``"chain"`` policy only (for scripts that time a draft the way Dustin drafts)."""
    from specdec.lookup import LookupDrafter

    return LookupDrafter(drafter, LOOKUP_MIN, LOOKUP_MAX, default_trust(drafter), policy=LOOKUP_POLICY,
                         veto=LOOKUP_VETO if LOOKUP_POLICY == "chain" else None, candidates=LOOKUP_CANDIDATES,
                         by_head=LOOKUP_BY_HEAD, keep=LOOKUP_KEEP)


class DustinOptions(selector_options(HybridSRHConfig, "_HybridOptions",
                                      include={"m", "m_ratio", "m_grid", "history_decay", "adaptive",
                                               "layer_share", "page_size", "page_kernels", "layer_scores",
                                               "key_rank"})):
    """Options of ``dustin`` / ``dustin-adaptive``. The split and history fields are
    :class:`~specdec.selectors.hybrid_srh.HybridSRHConfig`'s (defaults there); an unset ``m_ratio``
    comes from the ``srh`` artifact when one is given; an unset ``adaptive`` is the method's
    (``dustin-adaptive``: true)."""

    srh: Optional[str] = Field(default=None, description="path of a `specdec profile-srh` artifact for this pair")
    draft: Optional[str] = Field(default=None, description="a `specdec train-draft` artifact, eagle / skip (the "
                                 "shipped one of that kind), or early-exit (default: the draft shipped for the "
                                 "target if any, EAGLE first, else early exit)")
    draft_layers: Optional[int] = Field(default=None, ge=1, description="early-exit depth (default max(1, round(0.3 N)))")
    draft_model: Optional[str] = Field(default=None, description="a separate draft model instead of early exit")
    dense_every: int = Field(default=0, ge=0, description="dense verification every N passes (0 = never)")
    disagree: Optional[float] = Field(default=None, ge=0, le=1, description="dense when the signals disagree more")
    dense_first: bool = Field(default=True, description="the first verification is dense (seeds the target history)")
    margin: Optional[float] = Field(default=None, ge=0, description="re-verify densely when a deciding row's sparse "
                                    "top-1/top-2 logit margin is below this (None = off, 0 = record margins only)")
    lookup_min: int = Field(default=LOOKUP_MIN, ge=0, description="prompt lookup: shortest context n-gram whose "
                            "continuation replaces the draft's tokens (0 = off, draft only)")
    lookup_max: int = Field(default=LOOKUP_MAX, ge=1, description="prompt lookup: longest n-gram tried (first)")
    lookup_trust: Optional[int] = Field(default=None, ge=1, description="prompt lookup: a shorter match is used only "
                                        "where its first token equals the draft model's first draft (default: 4 "
                                        "behind an EAGLE head, else 2: every match)")
    lookup_policy: str = Field(default=LOOKUP_POLICY, description="prompt lookup: 'replace' (a match's continuation "
                               "replaces the draft's tokens) or 'chain' (the EAGLE head follows the context's candidates "
                               "and continues from the tokens it took; greedy only, else replace)")
    lookup_candidates: int = Field(default=LOOKUP_CANDIDATES, ge=1, description="prompt lookup, chain: continuations "
                                   "per sequence (> 1: also what followed the last token elsewhere, taken where the "
                                   "head's token agrees)")
    lookup_veto: Optional[float] = Field(default=LOOKUP_VETO, description="prompt lookup, chain: drop a context token the "
                                         "head disagrees with at this confidence or more (None = never; only with chain)")
    lookup_keep: Optional[int] = Field(default=LOOKUP_KEEP, ge=0, description="prompt lookup: the matched context "
                                       "(n-gram, what followed it, this many tokens either side) goes first into the "
                                       "verification set's draft part (None: only the draft's attention picks it)")
    lookup_by_head: bool = Field(default=LOOKUP_BY_HEAD, description="prompt lookup, chain: of the allowed candidates, "
                                 "take the one the head finds most probable (else the longest match, latest)")
    lookup_search: Literal["auto", "host", "device"] = Field(
        default="auto", description="prompt lookup, replace: search the context on the device (no per-sequence host "
        "work, no host read) or in per-sequence dictionaries on the host; 'auto': device on a GPU with CUDA graphs, host "
        "elsewhere. The same drafts either way")
    verify: Literal["sparse", "dense"] = Field(
        default="sparse", description="'sparse': Dustin's verification on the hybrid signals (near-lossless); 'dense': "
        "the whole context (FullVerifier: lossless, the same drafts; the budget and the sparse verifier's options do "
        "not apply)")
    tree: Union[bool, int, list[list[int]]] = Field(
        default=False, description="draft a tree (specdec.tree) instead of a chain: true for the default 16-node tree, "
        "a node count n for the n most frequent rank paths (1 to 32; 8 verifies 13 rows a sequence where the default "
        "verifies 21), or a list of rank paths such as [[0],[1],[0,0]]; plus a 4-node lookup branch with prompt lookup "
        "on. Needs verify=dense and an EAGLE draft")

    @field_validator("tree", mode="before")
    @classmethod
    def _tree_value(cls, v: Any) -> Any:
        from specdec.tree import RANKED_PATHS

        ok = (isinstance(v, bool) or (isinstance(v, int) and 1 <= v <= len(RANKED_PATHS))
              or (isinstance(v, (list, tuple)) and all(isinstance(p, (list, tuple)) and p
                                                       and all(isinstance(r, int) and not isinstance(r, bool)
                                                               for r in p) for p in v)))
        if not ok:
            raise ValueError("takes true / false, a node count (1 to 32) or a list of rank paths such as "
                             "[[0],[1],[0,0]]")
        return v


def default_heads(n_layers: int, n_heads: int, draft_layers: int) -> tuple[list, list]:
    """Retrieval heads used when no artifact is given: every head of one mid-depth target layer and of
    the draft's last layer. ``specdec profile-srh`` finds better ones."""
    t_layer = min(n_layers - 1, (2 * n_layers) // 3)
    d_layer = max(0, draft_layers - 1)
    draft = [[d_layer, h] for h in range(n_heads)] if draft_layers else []  # a draft of local layers only: no lookahead
    target = [[t_layer, h] for h in range(n_heads)] if n_layers else []  # every layer local: nothing to select
    return target, draft


def _trained_draft(model, o: "DustinOptions"):
    """Path of the trained draft (EAGLE head or layer-skip adapter) to use, or ``None`` (early exit / ``draft_model``)."""
    from specdec.train_draft import shipped_draft

    d = o.draft
    if d is not None and d != "early-exit":
        if o.draft_layers is not None:
            raise SpecdecError("draft and draft_layers exclude each other; draft_layers is for draft=early-exit.")
        if d in ("eagle", "skip"):
            p = shipped_draft(model, d)
            if p is None:
                raise SpecdecError(f"no {d} draft ships for this target; train one with `specdec train-draft"
                                   f"{' --kind eagle' if d == 'eagle' else ''}` and pass draft=PATH.")
            return p
        return d
    if d is None and o.draft_layers is None:
        return shipped_draft(model)
    return None


@register_method("dustin", "draft model + near-lossless sparse verification on hybrid draft/target SRH signals (Dustin)",
                 lossless=False, options=DustinOptions)
@register_method("dustin-adaptive", "Dustin with an input-aware split m chosen per iteration (beyond the paper)",
                 lossless=False, options=DustinOptions)
def build_dustin(model, cfg: PipelineConfig, options: DustinOptions, **kw: Any):
    """Engine with an :class:`~specdec.drafters.EarlyExitDrafter` (or ``draft_model``), a
    :class:`~specdec.selectors.hybrid_srh.HybridSRHSelector` and a :class:`~specdec.verifiers.SparseVerifier`."""
    from specdec.artifacts import load_srh
    from specdec.drafters import EarlyExitDrafter, ModelDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.registry import SELECTORS
    from specdec.verifiers import SparseVerifier

    o = options
    N = model.dims.n_layers
    if o.draft_model:
        from specdec.drafters import check_same_tokenizer
        from specdec.models import SpecdecModel

        draft = SpecdecModel.from_pretrained(o.draft_model, dtype=model.dtype, device=str(model.device))
        check_same_tokenizer(model, draft)
        drafter = ModelDrafter(draft)
    elif _trained_draft(model, o):
        from specdec.eagle import EagleDrafter, is_eagle
        from specdec.skip_drafter import SkipLayerDrafter

        path = _trained_draft(model, o)
        drafter = EagleDrafter(model, path) if is_eagle(path) else SkipLayerDrafter(model, path)
    else:
        # by default deep enough to include a global layer (Gemma 3: layer 5), whose attention is the lookahead
        first_global = model.dims.global_layers[0] + 1 if model.dims.global_layers else 1
        if N < 2:
            raise SpecdecError("dustin's early-exit drafter needs a target with at least 2 layers; pass draft_model.")
        drafter = EarlyExitDrafter(model, min(max(1, round(0.3 * N), first_global), N - 1) if o.draft_layers is None else o.draft_layers)
    split = {k: getattr(o, k) for k in ("m", "m_ratio", "m_grid", "history_decay", "layer_share", "page_size",
                                    "page_kernels", "layer_scores", "key_rank")
             if k in o.model_fields_set}
    sel_kw: dict[str, Any] = dict(cfg.budget_kwargs(), **split)
    sel_kw["adaptive"] = o.adaptive if "adaptive" in o.model_fields_set else cfg.method == "dustin-adaptive"
    if o.srh:
        art = load_srh(o.srh, model, drafter)
        sel_kw.setdefault("m_ratio", art["m_ratio"])
        sel_kw.update(target_heads=[tuple(x) for x in art["target_heads"]],
                      draft_heads=[tuple(x) for x in art["draft_heads"]], layer_map=art["layer_map"])
    else:
        Ng = model.dims.n_global  # heads and layer maps index global (full-context) layers
        t_heads, d_heads = default_heads(Ng, model.dims.n_heads, drafter.n_layers)
        sel_kw.update(target_heads=[tuple(x) for x in t_heads], draft_heads=[tuple(x) for x in d_heads],
                      layer_map=drafter.layer_map(Ng))
    if sel_kw.get("layer_scores") == "keys" and sel_kw.get("key_rank", 16) > model.dims.head_dim:  # before the prefill
        raise SpecdecError(f"key_rank {sel_kw.get('key_rank', 16)} exceeds the head dimension {model.dims.head_dim}; "
                           f"use key_rank <= {model.dims.head_dim}.")
    selector = SELECTORS.build("hybrid_srh", **sel_kw)
    selector.check_heads(drafter.n_layers, drafter.draft_model.dims.n_heads, "draft")
    drafter.set_heads(selector.draft_heads)
    if o.lookup_min:
        from specdec.lookup import LookupDrafter

        # the veto default (0.9) applies to "chain" only: `lookup_policy=replace` (the default) has none
        veto = o.lookup_veto if o.lookup_policy == "chain" or "lookup_veto" in o.model_fields_set else None
        trust = default_trust(drafter) if o.lookup_trust is None else o.lookup_trust
        drafter = LookupDrafter(drafter, o.lookup_min, o.lookup_max, trust, policy=o.lookup_policy,
                                veto=veto, candidates=o.lookup_candidates, by_head=o.lookup_by_head,
                                keep=o.lookup_keep, search=o.lookup_search)
    if o.verify == "dense":
        from specdec.verifiers import FullVerifier

        sparse_only = sorted({"dense_every", "disagree", "dense_first", "margin"} & o.model_fields_set)
        if sparse_only:
            raise SpecdecError(f"option(s) {', '.join(sparse_only)} belong to Dustin's sparse verification; drop "
                               "them with verify=dense (which reads the whole context).")
        verifier = FullVerifier(model)
    else:
        if o.tree is not False:
            raise SpecdecError("a draft tree is verified densely; add the option verify=dense (lossless), or drop "
                               f"tree={json.dumps(o.tree)}.")
        verifier = SparseVerifier(model, selector, drafter, dense_every=o.dense_every, disagree=o.disagree,
                                  dense_first=o.dense_first, margin=o.margin)
    if o.tree is not False:  # true, a node count or rank paths (with a lookup branch behind prompt lookup)
        kw.setdefault("tree", o.tree)
    return SpeculativeEngine(model, drafter, verifier, gamma=cfg.gamma, sampling=cfg.sampling, method=cfg.method, **kw)
