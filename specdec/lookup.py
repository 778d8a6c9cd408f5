"""Prompt-lookup drafting combined with another drafter (Dustin's ``lookup`` option).

Prompt lookup decoding (Saxena, 2023; vLLM's ``ngram`` speculator, SGLang's lookahead): the draft is what
followed the most recent earlier occurrence of the sequence's last ``n`` tokens in its own context (prompt +
emitted tokens), trying ``n = max_n .. min_n``. Code and greedy text repeat themselves, so the continuation
of a match is often exactly what the target writes next, at no model cost.

Combined policy, per sequence and iteration: **a match → its continuation, else the inner drafter's
drafts** (an EAGLE head, a layer-skipping draft, ...). The inner drafter always runs (its state, e.g. the
EAGLE head's cache, stays in step, and a batch keeps one fixed-shape draft forward); only its proposed
tokens are replaced. When the continuation is shorter than γ (the match ends near the end of the context)
it is extended periodically (the repetition it found goes on), so a match always gives γ tokens.

Policy ``chain`` (greedy, with a drafter that has ``draft_chain``: the EAGLE head) instead feeds the context's
candidates into the head's own chain: the head takes a candidate's tokens, continues **from them** when they run
out or the head vetoes one, and may take, among several candidates (``candidates > 1``), one that only followed the
last token elsewhere where its first token is the head's own. Same head calls; the head's state and lookahead
signal then follow the tokens actually drafted (no ``drafts_replaced``).

Lossless either way: a lookup draft is a deterministic proposal, ``q = one-hot`` in rejection sampling
(:func:`specdec.sampling.accept` then accepts with probability ``p(x)`` and resamples from ``p`` without ``x``).
With sparse verification (Dustin), the lookahead signal comes from the inner drafter's attention, and with ``keep``
the context of each match (the matched n-gram, what followed it, ``keep`` tokens either side) is put first in it
(:meth:`LookupDrafter.keep_copied`): a copied draft is then verified against the tokens it was copied from.

Host cost: per sequence one dict per ``n`` mapping an n-gram to the end of its latest occurrence, built at
prefill and extended with the tokens emitted since the last draft (the engine reads them anyway).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.errors import SpecdecError
from specdec.interfaces import Drafter, ScoreRequest


def check_lookup(min_n: int, max_n: int) -> None:
    """``1 <= min_n <= max_n``, or one line naming the fix."""
    if not 1 <= min_n <= max_n:
        raise SpecdecError(f"prompt lookup needs 1 <= lookup_min <= lookup_max (got lookup_min={min_n}, "
                           f"lookup_max={max_n}); set lookup_min=0 to turn it off.")


#: what :meth:`LookupDrafter.keep_copied` adds to the lookahead signal at a match's context: the signal is a sum of
#: softmax weights over draft heads and steps (at most heads × γ), so these positions rank first
KEPT_MASS = 1e6

#: how a match and the inner drafter's draft combine (:class:`LookupDrafter` ``policy``)
POLICIES = ("replace", "chain")
#: where :class:`LookupDrafter` searches for matches (``search``)
SEARCHES = ("auto", "host", "device")


def check_policy(policy: str, veto: float | None, candidates: int = 1) -> None:
    """A known policy, a veto in ``(0, 1]`` and ``candidates >= 1`` (both beyond the defaults only with ``chain``), or
    one line naming the fix."""
    if policy not in POLICIES:
        raise SpecdecError(f"unknown prompt lookup policy {policy!r}; use one of {', '.join(POLICIES)}.")
    if not isinstance(candidates, int) or candidates < 1 or (candidates > 1 and policy != "chain"):
        raise SpecdecError(f"lookup_candidates={candidates!r} needs an integer >= 1, and lookup_policy='chain' "
                           f"when > 1.")
    if veto is not None and (policy != "chain" or not 0 < veto <= 1):
        raise SpecdecError(f"lookup_veto={veto!r} needs lookup_policy='chain' and 0 < lookup_veto <= 1 "
                           f"(None: the head never vetoes a proposal).")


class NgramIndex:
    """For one token list: ``n``-gram → end index of its latest occurrence that is not the list's suffix.

    With ``follow`` (the ``chain`` policy's several candidates), also ``n``-gram → its followers, ``{token: end of
    the latest occurrence of the n-gram followed by token}`` in order of recency, for ``n = 1 .. max_n``."""

    def __init__(self, min_n: int, max_n: int, follow: bool = False) -> None:
        self.ns = range(max_n, min_n - 1, -1)
        self.maps: dict[int, dict[tuple, int]] = {n: {} for n in self.ns}
        self.max_n = max_n
        self.follow: dict[int, dict[tuple, dict[int, int]]] | None = (
            {n: {} for n in range(1, max_n + 1)} if follow else None)
        self.done = 0  # end indices < done are indexed

    def update(self, toks: list[int]) -> None:
        """Index every n-gram ending at ``done .. len(toks) - 2`` (the last position is the query's end)."""
        for n, mp in self.maps.items():
            for e in range(max(self.done, n - 1), len(toks) - 1):
                mp[tuple(toks[e - n + 1 : e + 1])] = e
        if self.follow is not None:
            for n, fm in self.follow.items():
                for e in range(max(self.done, n - 1), len(toks) - 1):
                    f = fm.setdefault(tuple(toks[e - n + 1 : e + 1]), {})
                    f.pop(toks[e + 1], None)  # re-inserted last: dict order = recency
                    f[toks[e + 1]] = e
        self.done = max(self.done, len(toks) - 1)

    def candidates(self, toks: list[int], gamma: int, k: int, periodic: bool = True) -> list[tuple[list[int], int]]:
        """Up to ``k`` continuations ``(tokens, n)`` of earlier occurrences of the list's suffix, one per distinct
        first token: for each, the occurrence with the longest matching suffix ``n`` (``<= max_n``; ties: the latest),
        sorted by ``n`` then recency. The first is :meth:`propose`'s (when its ``n >= min_n``); the others are what
        followed shorter suffixes, down to the last token alone. Host cost ``O(k · max_n)`` dict steps (needs
        ``follow``)."""
        if self.follow is None:
            raise SpecdecError("NgramIndex.candidates needs an index built with follow=True.")
        self.update(toks)
        L = len(toks)
        out: list[tuple[list[int], int]] = []
        seen: set[int] = set()
        for n in range(min(self.max_n, L - 1), 0, -1):
            for x, e in reversed(self.follow[n].get(tuple(toks[L - n :]), {}).items()):
                if len(out) == k:
                    return out
                if x in seen:
                    continue
                seen.add(x)
                cont = toks[e + 1 : e + 1 + gamma]
                while periodic and len(cont) < gamma:  # past the end: toks[L + m] = toks[e + 1 + m]
                    cont.append(cont[len(cont) - (L - e - 1)])
                out.append((cont, n))
        return out

    def locate(self, toks: list[int]) -> tuple[int, int]:
        """``(e, n)``: the end index of the latest earlier occurrence of the longest matching suffix (``n <= max_n``,
        ``>= min_n``) and ``n``; ``(-1, 0)``: no match."""
        self.update(toks)
        L = len(toks)
        for n in self.ns:
            if L < n + 1:
                continue
            e = self.maps[n].get(tuple(toks[L - n :]))
            if e is not None:
                return e, n
        return -1, 0

    def propose(self, toks: list[int], gamma: int, periodic: bool = True) -> tuple[list[int], int]:
        """Up to ``gamma`` tokens after the latest earlier occurrence of the longest matching suffix, and
        that suffix's length ``n`` (``([], 0)``: no match). ``periodic``: a continuation that runs into the end
        of the list goes on periodically (always ``gamma`` tokens); else it stops there."""
        e, n = self.locate(toks)
        return (self.continuation(toks, e, gamma, periodic), n) if n else ([], 0)

    @staticmethod
    def continuation(toks: list[int], e: int, gamma: int, periodic: bool = True) -> list[int]:
        """Up to ``gamma`` tokens after index ``e`` of ``toks`` (:meth:`propose`'s, for a :meth:`locate` result)."""
        L, out = len(toks), []
        for i in range(gamma):  # periodic extension past the end: toks[L + m] = toks[e + 1 + m]
            j = e + 1 + i
            if j >= L and not periodic:
                break
            out.append(toks[j] if j < L else out[j - L])
        return out

    def copy(self) -> "NgramIndex":
        c = NgramIndex.__new__(NgramIndex)
        c.ns, c.maps, c.done = self.ns, {n: dict(m) for n, m in self.maps.items()}, self.done
        c.max_n = self.max_n
        c.follow = None if self.follow is None else {
            n: {g: dict(f) for g, f in fm.items()} for n, fm in self.follow.items()}
        return c


def locate_batch(toks: torch.Tensor, last: torch.Tensor, min_n: int, max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`NgramIndex.locate` for a batch, on ``toks``' device with no host read: ``toks (B, W)`` holds each
    sequence's tokens (ids >= 0) at ``0 .. last[b]`` (anything after), ``last (B,)`` the index of its last token.
    Returns ``(e, n)``, each ``(B,)`` int64: the end index of the latest earlier occurrence (``e <= last - 1``) of the
    longest matching suffix of ``n`` tokens (``min_n <= n <= max_n``), ``(-1, 0)`` where none matches.

    Every end ``e`` at once: ``run[e]``, the number of tokens ending at ``e`` that equal the sequence's last ones, is
    built up one shifted comparison at a time; the best ``e`` maximises ``run · W + e`` (longest, then latest).
    ``O(B · W · max_n)`` element work in about ``4 · max_n + 15`` small kernels (one CUDA graph replay in
    :class:`LookupDrafter`), the same whatever the text."""
    B, W = toks.shape
    dev = toks.device
    last = last.view(B, 1)
    query = toks.gather(1, (last - torch.arange(max_n, device=dev)).clamp(min=0))  # (B, max_n): toks[last - j]
    match = toks == query[:, :1]
    run = match.to(torch.int32)
    for j in range(1, max_n):  # toks[e - j] == toks[last - j] (before the start: -1, never a token)
        match = match & (torch.nn.functional.pad(toks[:, : W - j], (j, 0), value=-1) == query[:, j : j + 1])
        run = run + match
    pos = torch.arange(W, device=dev).view(1, W)
    best = torch.where((pos < last) & (run >= min_n), run * W + pos, -1).amax(dim=1)
    found = best >= 0
    return torch.where(found, best % W, -1), torch.where(found, best // W, 0)


def continuation_batch(toks: torch.Tensor, last: torch.Tensor, e: torch.Tensor, n: torch.Tensor, gamma: int,
                       periodic: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`NgramIndex.continuation` for a batch (:func:`locate_batch`'s ``e``, ``n``): ``(look, valid)``, each ``(B,
    γ)``; ``valid`` is false where there is no match (``n == 0``) and, without ``periodic``, past the sequence's end.
    Periodic: ``toks[last + 1 + m] = toks[e + 1 + m]``, i.e. position ``e + 1 + (i mod (last - e))``."""
    B, W = toks.shape
    i = torch.arange(gamma, device=toks.device).view(1, gamma)
    e, last, has = e.view(B, 1), last.view(B, 1), (n > 0).view(B, 1)
    if periodic:
        idx, valid = e + 1 + i % (last - e).clamp(min=1), has.expand(B, gamma)
    else:
        idx = e + 1 + i
        valid = has & (idx <= last)
    return toks.gather(1, idx.clamp(0, W - 1)), valid


class LookupDrafter(Drafter):
    """Prompt lookup (n-gram from the context) first, ``inner`` where no n-gram matches.

    Args:
        inner: the drafter used where the context has no match (its other attributes are forwarded).
        min_n: shortest n-gram tried.
        max_n: longest n-gram tried (first).
        trust_n: a match of at least ``trust_n`` tokens is taken as is; a shorter one only where its first
            token equals the inner drafter's first draft (checked on the device, no host read), so a chance
            short match does not replace a draft the inner drafter is sure of. ``trust_n <= min_n``: always.
        policy: ``"replace"`` (a match's continuation replaces the inner drafter's tokens) or ``"chain"`` (the EAGLE
            head follows the candidates and continues from the tokens taken; greedy only, else ``replace``).
        veto: ``chain``: a candidate token the head disagrees with is dropped when the head's top probability is at
            least this (``None``: never).
        periodic: a continuation running into the end of the context goes on periodically (else it stops there:
            ``replace`` keeps the inner drafter's tokens after it, ``chain`` the head's chain continued from it).
        candidates: ``chain``: continuations per sequence (:meth:`NgramIndex.candidates`); ``> 1`` adds what
            followed shorter suffixes (down to the last token), each taken only where the head's token agrees.
        by_head: ``chain``: of the allowed candidates take the one the head finds most probable (else the first:
            longest match, latest).
        keep: sparse verification (Dustin): the context of each sequence's match — the matched n-gram, the ``γ``
            tokens that followed it and ``keep`` tokens either side — goes first into the inner drafter's lookahead
            signal (:meth:`keep_copied`), so the verification set holds what a copied draft copies (``None``: not).
        search: where the ``replace`` policy looks matches up: ``"device"`` (:func:`locate_batch` on a token buffer on
            the drafts' device: no per-sequence host work but copying the tokens emitted since the last round, and no
            host read; one CUDA graph replay when the draft's model captures graphs), ``"host"`` (:class:`NgramIndex`
            dictionaries per sequence), ``"auto"`` (device on a GPU with CUDA graphs, host elsewhere). Both give the
            same drafts; ``chain`` always searches on the host.
    """

    def __init__(self, inner: Drafter, min_n: int = 2, max_n: int = 4, trust_n: int | None = None,
                 policy: str = "replace", veto: float | None = None, periodic: bool = True, candidates: int = 1,
                 by_head: bool = False, keep: int | None = None, search: str = "auto") -> None:
        check_lookup(min_n, max_n)
        if search not in SEARCHES:
            raise SpecdecError(f"unknown lookup search {search!r}; use one of {', '.join(SEARCHES)}.")
        self.search = search
        if keep is not None and (not isinstance(keep, int) or keep < 0):
            raise SpecdecError(f"lookup_keep={keep!r} needs an integer >= 0 (tokens kept either side of a match) or "
                               "None (off).")
        self.keep = keep
        check_policy(policy, veto, candidates)
        self.candidates, self.by_head = candidates, by_head
        self.inner, self.min_n, self.max_n = inner, min_n, max_n
        self.trust_n = min_n if trust_n is None else trust_n
        self.policy, self.veto, self.periodic = policy, veto, periodic
        self._index: list[NgramIndex] = []
        #: per round: sequences drafting, sequences whose drafts came from the context (``stats()``)
        self.rounds = 0
        self._matched: torch.Tensor | None = None
        #: ``search="device"``: each sequence's tokens ``(B, W)`` on the device, and how many of them are there
        self._toks: torch.Tensor | None = None
        self._copied: list[int] | None = None
        self._calls, self._graphs_of = None, None  # the device round's CUDA graphs (:meth:`_captured`)

    def __getattr__(self, name: str) -> Any:  # draft_model, lookahead, heads, n_layers, layer_map, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def dense_steps_ok(self) -> bool:  # type: ignore[override]
        return self.inner.dense_steps_ok

    def prefill(self, state) -> None:
        self.inner.prefill(state)
        memo: dict[tuple, NgramIndex] = {}
        self._index = []
        for toks in state.tokens:  # equal prompts (a benchmark's batch) are indexed once
            key = tuple(toks)
            if key not in memo:
                memo[key] = NgramIndex(self.min_n, self.max_n, follow=self.policy == "chain" and self.candidates > 1)
                memo[key].update(toks)
            self._index.append(memo[key].copy())
        self._copied = None  # the device buffer (kept: its address keys a graph) is refilled at the first search

    #: fills a draft tree's lookup branch (:meth:`draft_tree`; the engine checks this)
    lookup_branch = True

    @torch.no_grad()
    def draft_tree(self, state, tree) -> torch.Tensor:
        """A :class:`~specdec.tree.DraftTree`'s tokens ``(B, N)``: the inner drafter's tree (its ``draft_tree``), and on
        the tree's lookup branch the continuation of each sequence's longest match (``min_n .. max_n`` tokens, the
        latest; ``periodic`` as for a chain) where there is one. Every match is taken: the branch is verified beside
        the inner drafter's nodes, never instead of them. Host search (:class:`NgramIndex`), one tensor write."""
        if not tree.lookup:
            raise SpecdecError("a prompt-lookup drafter drafts a tree with a lookup branch; use "
                               "DraftTree(paths, lookup=4) (or tree=True), or draft the tree with the inner drafter.")
        tokens = self.inner.draft_tree(state, tree).contiguous()  # (B, N): the branch repeats the argmax chain
        B, k = tokens.shape[0], tree.lookup
        vals, at, found = [], [], 0
        for b in range(B):
            prop, _ = self._index[b].propose(state.tokens[b], k, self.periodic)
            vals += prop
            at += [b * tokens.shape[1] + r - 1 for r in tree.lookup_rows[: len(prop)]]
            found += bool(prop)
        self.rounds += B
        self._matched = found + (self._matched if self._matched is not None else 0)
        if vals:
            # pinned and queued: a pageable copy would hold the host until the GPU has finished the head's tree
            flat = torch.tensor(vals + at, dtype=torch.long, pin_memory=tokens.is_cuda).to(tokens.device,
                                                                                             non_blocking=True)
            tokens.view(-1).index_copy_(0, flat[len(vals):], flat[: len(vals)])
        return tokens

    def chains(self, state) -> bool:
        """Whether this round drafts with the ``chain`` policy: asked for, greedy, and an inner drafter that can
        continue a chain from given tokens (``draft_chain``: the EAGLE head); otherwise ``replace``."""
        return self.policy == "chain" and state.sampling.greedy and hasattr(self.inner, "draft_chain")

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.chains(state):
            return self._draft_chain(state, gamma)
        drafts, q = self.inner.draft(state, gamma)  # (B, γ), (B, γ, V) or None
        B = drafts.shape[0]
        if self._device_search(drafts.device):
            last = self._tokens_on(state, drafts.device)
            la = getattr(self.inner, "lookahead", None) if self.keep is not None else None
            args = (self._toks, last, drafts) + (() if la is None else (la,))
            calls = self._captured(drafts.device)
            if calls is None:
                out = self._device_round(*args)
            else:  # one graph replay instead of ~50 small launches from the host
                key = ("lookup", self.min_n, self.max_n, self.trust_n, self.periodic, self.keep)
                out = calls(key, self._device_round, *args, keep=self)  # the graph's buffers: used before the next
                out = (out[0].clone(),) + tuple(out[1:])  # round, but the drafts are kept (the engine's commit)
            merged, look, mask = out[:3]
            if la is not None:
                la.copy_(out[3])
            self.rounds += B
            return self._merged(state, merged, q, look, mask)
        # host lists, then one tensor each: per-sequence tensor writes cost ~4 small torch calls per sequence
        # (B = 64, 2 of 3 sequences matching: 0.56-0.89 ms -> 0.11 ms of host time per draft on the dev CPU)
        look_l, mask_l, trusted_l, located = [], [], [], []
        for b in range(B):
            toks = state.tokens[b]
            e, n = self._index[b].locate(toks)
            prop = NgramIndex.continuation(toks, e, gamma, self.periodic) if n else []
            located.append((e, n))
            look_l.append(prop + [0] * (gamma - len(prop)))
            mask_l.append([True] * len(prop) + [False] * (gamma - len(prop)))
            trusted_l.append([bool(prop) and n >= self.trust_n])
        self.rounds += B
        self.keep_copied(state, gamma, located)
        if not any(row[0] for row in mask_l):
            return drafts, q
        dev = drafts.device
        pin = dev.type == "cuda"
        look, mask, trusted = (torch.tensor(x, dtype=dt, pin_memory=pin).to(dev, non_blocking=True)
                               for x, dt in ((look_l, torch.long), (mask_l, torch.bool), (trusted_l, torch.bool)))
        merged, mask = _combine(drafts, look, mask, trusted)
        return self._merged(state, merged, q, look, mask)

    def _merged(self, state, drafts: torch.Tensor, q: torch.Tensor | None, look: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Count the sequences drafting from the context, tell the inner drafter, and make ``q`` one-hot there."""
        self._matched = mask[:, 0].sum() + (self._matched if self._matched is not None else 0)  # device: no read
        self.inner.drafts_replaced(state, drafts, mask)
        if q is not None:  # a lookup draft is deterministic: q = one-hot
            one = torch.nn.functional.one_hot(look, q.shape[-1]).to(q.dtype)
            q = torch.where(mask.unsqueeze(-1), one, q)
        return drafts, q

    def _device_round(self, toks: torch.Tensor, last: torch.Tensor, drafts: torch.Tensor,
                      la: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """One round of the device search as a fixed-shape function of tensors (a CUDA graph on a GPU with graphs):
        ``(drafts with the matches' continuations, look, mask[, la with the kept mass])``; ``la`` is not written."""
        B, gamma = drafts.shape
        e, n = locate_batch(toks, last, self.min_n, self.max_n)
        look, mask = continuation_batch(toks, last, e, n, gamma, self.periodic)
        merged, mask = _combine(drafts, look, mask, (n >= self.trust_n).view(B, 1))
        out = (merged, look, mask)
        if la is None:
            return out
        has = n > 0
        lo = torch.where(has, (e - n + 1 - self.keep).clamp(min=0), 0)
        hi = torch.where(has, torch.minimum(last + 1, e + 1 + gamma + self.keep).clamp(max=la.shape[1]), 0)
        return out + (self._add_kept(la, torch.stack([lo, hi]), gamma, inplace=False),)

    def _captured(self, device: torch.device):
        """The :class:`~specdec.graphs.CapturedCall` replaying :meth:`_device_round`, or ``None`` (eager): graphs are
        used on a GPU when the draft's model captures its forwards (:meth:`SpecdecModel.enable_cuda_graphs`)."""
        model = getattr(self.inner, "target", None)
        if model is None:
            model = getattr(self.inner, "draft_model", None)
        g = getattr(model, "_graphs", None)
        if g is None or device.type != "cuda":
            return None
        if self._graphs_of is not g:  # new graphs of the model (or none before): new ones here
            from specdec.graphs import CapturedCall

            self._calls, self._graphs_of = CapturedCall(max_graphs=4), g
        return self._calls

    def _device_search(self, device: torch.device) -> bool:
        # "auto": only where the round is one graph replay; run eagerly its ~50 launches cost the host more than the
        # dictionaries (H200, B 64 x 8k: 0.86-0.97x the host search's tokens/s eagerly, 0.93-1.14x as a graph)
        return self.search == "device" or (self.search == "auto" and self._captured(device) is not None)

    def _tokens_on(self, state, device: torch.device) -> torch.Tensor:
        """Copy the tokens emitted since the last round into the device buffer :attr:`_toks` (one transfer; the whole
        prompts the first time) and return each sequence's last index ``(B,)`` on ``device``."""
        toks = state.tokens
        B, need = len(toks), max(len(t) for t in toks)
        if self._toks is None or self._toks.shape[0] != B or self._toks.shape[1] < need or self._toks.device != device:
            from specdec.graphs import forget_address, keep_address

            cap = getattr(getattr(state, "cache", None), "capacity", 0)
            if self._toks is not None:
                forget_address(self._toks)
            # read in place by the device round's graph (its address is part of the graph's key)
            self._toks = keep_address(torch.zeros(B, max(need, cap, 2 * need if self._toks is not None else need),
                                                  dtype=torch.long, device=device))
            self._copied = None
        if self._copied is None:  # a new generation or buffer: whole sequences (equal prompts copied on the device)
            self._copied, first = [0] * B, {}
            for b, t in enumerate(toks):
                key = tuple(t)
                if key in first:
                    self._toks[b, : len(t)] = self._toks[first[key], : len(t)]
                else:
                    first[key] = b
                    self._toks[b, : len(t)] = torch.tensor(t, dtype=torch.long).to(device, non_blocking=True)
                self._copied[b] = len(t)
        W, vals, at = self._toks.shape[1], [], []
        for b, t in enumerate(toks):
            done = self._copied[b]
            if len(t) > done:
                vals += t[done:]
                at += range(b * W + done, b * W + len(t))
                self._copied[b] = len(t)
        flat = torch.tensor(vals + at + [len(t) - 1 for t in toks], dtype=torch.long,
                            pin_memory=device.type == "cuda").to(device, non_blocking=True)
        if vals:
            self._toks.view(-1).index_copy_(0, flat[len(vals) : 2 * len(vals)], flat[: len(vals)])
        return flat[2 * len(vals) :]

    def _draft_chain(self, state, gamma: int) -> tuple[torch.Tensor, None]:
        """``policy="chain"``: the EAGLE head drafts following the context's candidate continuations (host lists, one
        tensor each) and continues from the tokens it took (:meth:`specdec.eagle.EagleDrafter.draft_chain`).

        Candidates per sequence (:meth:`NgramIndex.candidates`, at most ``candidates``): a match of ``n >= trust_n``
        tokens is followed from its first token (unless the head vetoes: ``veto``); a shorter one (``n >= min_n``,
        or any ``n >= 1`` when ``candidates > 1``) only where its first token equals the head's own first draft."""
        B, K = state.lengths.shape[0], self.candidates
        never = 2.0 if self.veto is None else self.veto
        cand_l, mask_l, conf_l = [], [], []
        for b in range(B):
            idx = self._index[b]
            cs = idx.candidates(state.tokens[b], gamma, K, self.periodic) if K > 1 else [
                idx.propose(state.tokens[b], gamma, self.periodic)]
            cs = [(c, n) for c, n in cs if c and n >= (self.min_n if K == 1 else 1)] + [([], 0)] * K
            cand_l.append([c + [0] * (gamma - len(c)) for c, _ in cs[:K]])
            mask_l.append([[True] * len(c) + [False] * (gamma - len(c)) for c, _ in cs[:K]])
            conf_l.append([[never if n >= self.trust_n else 0.0] + [never] * (gamma - 1) for _, n in cs[:K]])
        self.rounds += B
        if not any(row[0][0] for row in mask_l):
            out = self.inner.draft(state, gamma)
            self.keep_copied(state, gamma)
            return out
        dev = state.lengths.device
        pin = dev.type == "cuda"
        cand, cmask, conf = (torch.tensor(x, dtype=dt, pin_memory=pin).to(dev, non_blocking=True)
                             for x, dt in ((cand_l, torch.long), (mask_l, torch.bool), (conf_l, torch.float32)))
        drafts = self.inner.draft_chain(state, gamma, cand, cmask, conf, by_head=self.by_head)
        taken = (cmask[:, :, 0] & (cand[:, :, 0] == drafts[:, :1])).any(dim=1)  # (B,) first token from the context
        self._matched = taken.sum() + (self._matched if self._matched is not None else 0)  # device: no read
        self.keep_copied(state, gamma)
        return drafts, None

    def keep_copied(self, state, gamma: int, located: list[tuple[int, int]] | None = None) -> None:
        """Puts each sequence's match context first in the inner drafter's lookahead signal (``keep``; after the
        inner drafter has recorded it this round): the positions of the matched n-gram, of the ``γ`` tokens after
        it and ``keep`` on either side gain :data:`KEPT_MASS`, more than any attention sum, so Dustin's draft part
        of the verification set takes them first. A copied answer (a key, a number, an identifier from the
        context) otherwise depends on the draft's attention having found it; at 4,096 tokens and a 25 % budget
        the EAGLE head's did not once in five needle samples, and the verification dropped a digit.

        ``located``: each sequence's :meth:`NgramIndex.locate` result when the caller has it (the draft just
        looked it up). Host work: one span per sequence and one ``(2, B)`` transfer; the device adds the mass
        with one ``scatter_add_`` over ``(B, γ + max_n + 2·keep)`` (per-position index lists built on the host cost
        ~0.4 ms per round at B 64 on the dev CPU)."""
        la = getattr(self.inner, "lookahead", None)
        if self.keep is None or la is None:
            return
        spans: list[list[int]] = [[], []]
        for b, idx in enumerate(self._index):
            toks = state.tokens[b]
            e, n = located[b] if located is not None else idx.locate(toks)
            lo, hi = (max(0, e - n + 1 - self.keep), min(len(toks), la.shape[1], e + 1 + gamma + self.keep)) if n else (0, 0)
            spans[0].append(lo)
            spans[1].append(hi)
        if any(h > lo for lo, h in zip(*spans)):
            pin = la.device.type == "cuda"
            self._add_kept(la, torch.tensor(spans, dtype=torch.long, pin_memory=pin).to(la.device, non_blocking=True),
                           gamma)

    def _add_kept(self, la: torch.Tensor, lo_hi: torch.Tensor, gamma: int, inplace: bool = True) -> torch.Tensor:
        """:data:`KEPT_MASS` added to ``la (B, C)`` on each sequence's span ``lo_hi (2, B)`` (empty: ``lo >= hi``), in
        place or (``inplace=False``) into a new tensor."""
        width = gamma + self.max_n + 2 * self.keep  # the widest span: hi - lo <= γ + n + 2·keep
        pos = lo_hi[0].view(-1, 1) + torch.arange(width, device=la.device).view(1, -1)  # (B, width)
        inside = pos < lo_hi[1].view(-1, 1)
        # outside a span: + 0 at a clamped position (a no-op), so one fixed-shape scatter serves every row
        add = (la.scatter_add_ if inplace else la.scatter_add)
        return add(1, pos.clamp(max=la.shape[1] - 1), inside.to(la.dtype) * KEPT_MASS)

    def take_flags(self) -> torch.Tensor | None:
        take = getattr(self.inner, "take_flags", None)  # (a duck-typed plugin drafter may not have it)
        return take() if take is not None else None

    def draft_ahead(self, state, gamma: int) -> None:
        """The inner drafter's early start (the context search reads the host's token lists: it waits for
        :meth:`draft`); none for the ``chain`` policy, whose inner draft follows the search."""
        ahead = getattr(self.inner, "draft_ahead", None)  # (a duck-typed plugin drafter may not have it)
        if ahead is not None and not self.chains(state):
            ahead(state, gamma)

    def score_request(self, gamma: int) -> ScoreRequest | None:
        return self.inner.score_request(gamma)

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        self.inner.on_verify(state, scores)

    def stats(self, reset: bool = False) -> dict:
        """Share of (sequence, round) drafts taken from the context (one host read)."""
        out = dict(rounds=self.rounds, matched=int(self._matched) if self._matched is not None else 0)
        out["matched_share"] = out["matched"] / max(self.rounds, 1)
        if reset:
            self.rounds, self._matched = 0, None
        return out


def _combine(drafts: torch.Tensor, look: torch.Tensor, mask: torch.Tensor,
             trusted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(drafts, mask)`` merged: the context's continuation ``look (B, γ)`` where ``mask`` has one and the match is
    ``trusted (B, 1)`` or its first token is the inner drafter's own first draft; else the inner drafter's."""
    mask = mask & (trusted | (look[:, :1] == drafts[:, :1]))
    return torch.where(mask, look, drafts), mask


def base_drafter(drafter: Drafter) -> Drafter:
    """The draft model's drafter under a :class:`LookupDrafter` (``drafter`` itself if not wrapped)."""
    return drafter.inner if isinstance(drafter, LookupDrafter) else drafter
