"""Draft trees: several continuations verified in one target pass (lossless, greedy or sampled).

A chain draft of ``γ`` tokens is verified by ``γ + 1`` target rows; when the draft's first guess is wrong, the
whole chain is lost. A **tree** drafts, at some nodes, the draft's second or third choice too, and verifies every
node in the same pass: row ``u`` attends to the context and to its ancestors only (a tree mask) at position
``L + depth(u)``. The verifier's greedy token after a node decides which child (if any) is accepted; the longest
accepted path is emitted, exactly the tokens plain greedy decoding would emit (SpecInfer, Miao et al. 2024;
EAGLE-2's trees, Li et al. 2024; a static tree as Sequoia chooses one, Chen et al. 2024). Sampling,
:func:`accept_sampled` tries a node's children in turn by rejection sampling and keeps the target's distribution.

A tree is given by **rank paths**: ``(r_1, .., r_d)`` is the node reached by taking the draft's ``r_1``-th most
likely token after the pending one, then its ``r_2``-th most likely after that, ... (``0`` = the argmax; a chain of
``γ`` is ``(0,), (0, 0), ..``). The set must be prefix-closed. :data:`DEFAULT_PATHS` is the 16-node tree of the
rank-path prefixes most often on the target's greedy path, counted for the shipped EAGLE head on *training* text
(six ``pydoc`` documents and six standard-library modules, none held out;
``python benchmarks/tree_tau_cpu.py``, ``benchmarks/results/cpu_tree_tau_2026-12-04.md``).

Rows are numbered ``0`` (the pending token, the root) and ``1 .. N`` (the nodes in breadth-first order, a
node after its parent).

A tree may also carry a **lookup branch** (``lookup=k``): a chain of ``k`` more nodes off the root, after the
rank-path nodes, whose tokens a prompt-lookup drafter fills with what followed the latest earlier occurrence of the
context's last tokens (:meth:`specdec.lookup.LookupDrafter.draft_tree`). The head's tree and the copied continuation
are then verified in the same pass; where the context has no match, the branch repeats the head's argmax chain (the
rank paths ``(0,)``, ``(0, 0)``, ..).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from specdec.errors import SpecdecError

#: 16 nodes, depth 4 (see the module docstring for where they come from)
DEFAULT_PATHS: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,),
    (0, 0), (0, 1), (0, 2), (1, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0),
)

#: the rank paths by how often they were on the target's greedy path (the count :data:`DEFAULT_PATHS` comes from):
#: the first ``n`` form a prefix-closed tree of ``n`` nodes for any ``n`` (:meth:`DraftTree.top`). The counted trees of
#: 4, 8, 12, 16, 24 and 32 nodes are exact prefixes (``cpu_tree_tau_2026-12-04.json``, ``both-N``); between two of
#: them the paths follow breadth-first (their own counts are not recorded). The first 16 are :data:`DEFAULT_PATHS`.
RANKED_PATHS: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (0, 0, 0), (0, 0, 0, 0),
    (1,), (0, 1), (1, 0), (0, 0, 1),
    (2,), (0, 1, 0), (1, 0, 0), (0, 0, 0, 1),
    (0, 2), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0),
    (3,), (0, 4), (1, 1), (2, 0), (0, 0, 2), (0, 0, 3), (0, 2, 0), (2, 0, 0),
    (4,), (6,), (0, 3), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 2, 0), (0, 2, 0, 0), (2, 0, 0, 0),
)

#: the most rows a tree may verify at once (the root included)
MAX_ROWS = 128


class DraftTree:
    """A static draft tree: its rank paths and the index tensors a draft and a verification read.

    Args:
        paths: prefix-closed rank paths (tuples of ranks ``>= 0``), in any order.
        lookup: the length of a lookup branch (a chain off the root that a prompt-lookup drafter fills; 0: none).

    Attributes:
        paths: the paths, breadth-first (by depth, then lexicographically): node ``i + 1`` is ``paths[i]``.
        parent: ``(N + 1,)`` row of each row's parent (the root's is 0).
        depth: ``(N + 1,)`` depth of each row (the root 0).
        mask: ``(N + 1, N + 1)`` bool, ``mask[u, j]``: row ``j`` is ``u`` or an ancestor of ``u``.
        levels: per depth ``1 .. D``, the rows at that depth.
        inner: per depth ``1 .. D``, the rows at that depth that have children (the draft runs a head row for each).
        widths: per row, how many of the draft's top tokens its children need (0: a leaf).
        parent_of: per row, its parent's row (host ints; the root's 0).
        children: per row, its children's rows among the rank-path nodes.
        lookup_rows: the lookup branch's rows, by depth (empty without one).
        fallback: per lookup row, the rank-path row whose token it repeats where the context has no match (the
            argmax chain's row at its depth; ``0`` past the argmax chain's depth: the pending token, a guess like
            any other).
    """

    def __init__(self, paths: Iterable[Sequence[int]], lookup: int = 0) -> None:
        if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
            raise SpecdecError(f"a draft tree's lookup branch needs a length that is an int >= 0, got {lookup!r}; "
                               "e.g. lookup=4 (0: no lookup branch).")
        seen = set()
        for p in paths:
            if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or not p:
                raise SpecdecError(f"a draft-tree path must be a non-empty sequence of ranks, got {p!r}; "
                                   "e.g. [(0,), (1,), (0, 0)].")
            if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in p):
                raise SpecdecError(f"draft-tree path {tuple(p)!r} has a rank that is not an int >= 0; "
                                   "0 is the draft's most likely token, 1 the next.")
            seen.add(tuple(int(r) for r in p))
        if not seen:
            raise SpecdecError("a draft tree needs at least one path, e.g. [(0,)] (a chain of one token).")
        for p in seen:
            if len(p) > 1 and p[:-1] not in seen:
                raise SpecdecError(f"draft-tree path {p} has no parent {p[:-1]} in the tree; the paths must be "
                                   "prefix-closed (add every prefix of every path).")
        if len(seen) + lookup + 1 > MAX_ROWS:
            raise SpecdecError(f"a draft tree of {len(seen) + lookup} nodes is too large; use at most {MAX_ROWS - 1}.")
        self.paths = tuple(sorted(seen, key=lambda p: (len(p), p)))
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        first = len(self.paths) + 1  # the lookup branch's first row
        self.lookup = lookup
        self.lookup_rows = list(range(first, first + lookup))
        self.fallback = [index.get((0,) * (d + 1), 0) for d in range(lookup)]
        if 0 in self.fallback:  # past the argmax chain: the branch repeats nothing the head drafted
            cut = self.fallback.index(0)
            self.fallback = self.fallback[:cut] + [0] * (lookup - cut)
        n = first + lookup
        #: per row, its parent's row (host ints; the root's 0)
        self.parent_of = ([0] + [index.get(p[:-1], 0) for p in self.paths]
                          + ([0] + self.lookup_rows[:-1] if lookup else []))
        self.parent = torch.tensor(self.parent_of, dtype=torch.long)
        depths = [0] + [len(p) for p in self.paths] + list(range(1, lookup + 1))
        self.depth = torch.tensor(depths, dtype=torch.long)
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):  # every ancestor, up to the root
            j = self.parent_of[i]
            while True:
                mask[i, j] = True
                if j == 0:
                    break
                j = self.parent_of[j]
        self.mask = mask
        self.max_depth = max(depths)
        self.levels = [[i for i in range(1, n) if depths[i] == d] for d in range(1, self.max_depth + 1)]
        widths = [0] * n
        for p in self.paths:
            par = index.get(p[:-1], 0)
            widths[par] = max(widths[par], p[-1] + 1)
        self.widths = widths
        self.inner = [[u for u in level if widths[u]] for level in self.levels]
        #: per row, its children's rows
        self.children = [[] for _ in range(n)]
        for i, par in enumerate(self.parent_of[1:first], start=1):
            self.children[par].append(i)
        self._dev: dict[str, tuple[torch.Tensor, ...]] = {}

    @classmethod
    def chain(cls, gamma: int) -> "DraftTree":
        """The chain of ``gamma`` argmax tokens as a tree."""
        return cls([(0,) * (k + 1) for k in range(gamma)])

    @classmethod
    def default(cls, lookup: int = 0) -> "DraftTree":
        """:data:`DEFAULT_PATHS` (16 nodes, depth 4), with a lookup branch of ``lookup`` nodes."""
        return cls(DEFAULT_PATHS, lookup=lookup)

    @classmethod
    def top(cls, nodes: int, lookup: int = 0) -> "DraftTree":
        """The ``nodes`` most frequent rank paths (:data:`RANKED_PATHS`, 1 to 32; 4 is the chain of 4, 16 the default
        tree), with a lookup branch of ``lookup`` nodes: a smaller tree verifies fewer rows, a larger one accepts
        more."""
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= len(RANKED_PATHS):
            raise SpecdecError(f"a ranked draft tree has 1 to {len(RANKED_PATHS)} nodes, got {nodes!r}; e.g. tree=8 "
                               "(16 is the default tree), or give the rank paths themselves.")
        return cls(RANKED_PATHS[:nodes], lookup=lookup)

    @property
    def nodes(self) -> int:
        """Draft tokens per sequence (rows verified: ``nodes + 1``), the lookup branch's included."""
        return len(self.paths) + self.lookup

    def __repr__(self) -> str:
        extra = f", lookup={self.lookup}" if self.lookup else ""
        return f"DraftTree(nodes={self.nodes}, depth={self.max_depth}{extra})"

    def on(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """``(parent, depth, mask, level rows)`` on ``device``, made once per device (a decode round makes none)."""
        key = str(device)
        if key not in self._dev:
            rows = [torch.tensor(level, device=device) for level in self.levels]
            self._dev[key] = (self.parent.to(device), self.depth.to(device), self.mask.to(device), rows)
        return self._dev[key]

    def child_table(self, device) -> torch.Tensor:
        """``(N + 1, K)`` each row's children in the order a sampled verification tries them — its rank children by
        rank, then the lookup branch's next node — padded with ``-1`` (made once per device)."""
        key = "children:" + str(device)
        if key not in self._dev:
            kids = [list(c) for c in self.children]
            for i, r in enumerate(self.lookup_rows):  # the branch: a child of the root, then of each other
                kids[0 if i == 0 else self.lookup_rows[i - 1]].append(r)
            K = max(1, max(len(k) for k in kids))
            self._dev[key] = torch.tensor([k + [-1] * (K - len(k)) for k in kids], dtype=torch.long, device=device)
        return self._dev[key]

    def draft_index(self, device) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """What a tree draft indexes with, on ``device`` (made once per device; a CUDA graph reads them in place):
        per depth ``d = 1 .. D``, the rows of its inner nodes (:attr:`inner`) and the ancestor-or-self mask of those
        rows over every inner row of depths ``1 .. d`` (``(m_d, M_d)`` bool: the head's scratch rows so far); then the
        lookup branch's rows and :attr:`fallback` rows."""
        key = "draft:" + str(device)
        if key not in self._dev:
            rows, anc, owners = [], [], []
            for level in self.inner:
                if not level:
                    break
                owners += level
                rows.append(torch.tensor(level, device=device))
                anc.append(self.mask[level][:, owners].to(device))
            self._dev[key] = (rows, anc, torch.tensor(self.lookup_rows, dtype=torch.long, device=device),
                              torch.tensor(self.fallback, dtype=torch.long, device=device))
        return self._dev[key]

    def draft_picks(self, device) -> list[tuple[list[int], int, torch.Tensor, torch.Tensor]]:
        """What a tree draft picks its tokens with, per depth ``d = 1 .. D``: ``(parents, k, rows, flat)`` -- the rows
        whose predictions give depth ``d``'s tokens (the root, then depth ``d - 1``'s inner rows), the top-``k`` each
        takes (the widest need), the rows of depth ``d``'s nodes and, for each, ``parent index · k + rank`` into the
        ``(P, k)`` top-k indices of those predictions flattened. Made once per device."""
        key = "draft_picks:" + str(device)
        if key not in self._dev:
            out = []
            for d in range(self.max_depth):
                parents = [0] if d == 0 else self.inner[d - 1]
                if not parents:
                    break
                k = max(self.widths[u] for u in parents)
                rows = [c for u in parents for c in self.children[u]]
                flat = [i * k + self.paths[c - 1][-1] for i, u in enumerate(parents) for c in self.children[u]]
                out.append((list(parents), k, torch.tensor(rows, dtype=torch.long, device=device),
                            torch.tensor(flat, dtype=torch.long, device=device)))
            self._dev[key] = out
        return self._dev[key]

    def draft_masks(self, device) -> list[torch.Tensor]:
        """Per depth ``d = 1 .. D``, the ancestor-or-self mask among every inner row of depths ``1 .. d``
        (``(M_d, M_d)`` bool, rows in :meth:`draft_index`'s order: the head's scratch rows so far), as a backend's
        :attr:`~specdec.interfaces.AttentionMetadata.tree` takes it; its last ``m_d`` rows are ``draft_index``'s
        ``anc[d]``. Made once per device."""
        key = "draft_masks:" + str(device)
        if key not in self._dev:
            masks, owners = [], []
            for level in self.inner:
                if not level:
                    break
                owners += level
                masks.append(self.mask[owners][:, owners].to(device))
            self._dev[key] = masks
        return self._dev[key]


def accept_greedy(tree: DraftTree, tokens: torch.Tensor, logits: torch.Tensor):
    """Greedy acceptance over a verified tree.

    Args:
        tokens: ``(B, N + 1)`` the verified rows' tokens (row 0: the pending token).
        logits: ``(B, N + 1, V)`` the target's logits of those rows.

    Returns:
        ``(n_accepted (B,), next_token (B,), path (B, D))``: the accepted depth, the target's token after the last
        accepted row, and the rows of the accepted path at depths ``1 .. D`` (rows past ``n_accepted`` repeat the
        last accepted row; only ``path[:, :n_accepted]`` counts).
    """
    return accept_greedy_targets(tree, tokens, logits.argmax(dim=-1))


def accept_greedy_targets(tree: DraftTree, tokens: torch.Tensor, y: torch.Tensor):
    """:func:`accept_greedy` from the target's greedy tokens ``y (B, N + 1)`` (``logits.argmax(-1)``) instead of its
    logits: a fixed-shape function of tensors with no host read, which the engine replays as one CUDA graph."""
    parent, depth, _, level_rows = tree.on(tokens.device)
    B = tokens.shape[0]
    ok = torch.zeros_like(tokens, dtype=torch.bool)
    ok[:, 0] = True
    for rows in level_rows:  # a node is accepted when its parent is and its token is the parent's greedy token
        par = parent[rows]
        ok[:, rows] = ok[:, par] & (tokens[:, rows] == y[:, par])
    # rank siblings carry distinct tokens; a lookup node may repeat a rank node's token (then both are accepted with
    # the same tokens above them): the deepest accepted node is the path's end, either of equals
    score = torch.where(ok, depth.view(1, -1), torch.full_like(depth.view(1, -1), -1))
    n_acc, last = score.max(dim=1)  # (B,)
    next_token = y.gather(1, last.view(B, 1))[:, 0]
    D = tree.max_depth
    path = torch.zeros(B, D, dtype=torch.long, device=tokens.device)
    cur = last
    for d in range(D, 0, -1):  # walk up from the end: the row at depth d is cur while d <= n_acc
        at = n_acc >= d
        path[:, d - 1] = torch.where(at, cur, torch.zeros_like(cur))
        cur = torch.where(at, parent[cur], cur)
    # rows past the accepted depth: the last accepted row (harmless for a gather, never emitted)
    fill = last.view(B, 1).expand(B, D)
    keep = torch.arange(1, D + 1, device=tokens.device).view(1, D) <= n_acc.view(B, 1)
    return n_acc, next_token, torch.where(keep, path, fill)


def accept_sampled(tree: DraftTree, tokens: torch.Tensor, logits: torch.Tensor, cfg, gen: torch.Generator | None = None):
    """Rejection sampling over a verified tree whose nodes are deterministic proposals (the draft's top-ranked tokens,
    prompt lookup's copies): the target distribution is kept exactly (SpecInfer's multi-draft verification with
    one-hot drafts, Miao et al. 2024).

    From the root, at each accepted node with target distribution ``p`` (:func:`specdec.sampling.warp` of its row's
    logits): its children are tried in order (:meth:`DraftTree.child_table`); child token ``x`` is accepted with
    probability ``p(x) / Σp``, else ``p(x)`` is set to 0 and the next child is tried. An accepted child becomes the
    node; when none is, the next token is drawn from what is left of ``p`` (a leaf: from ``p`` itself). Each token so
    emitted has the target's distribution: ``P(child i) = p(x_i)`` for the children tried in turn, and the rest of
    ``p`` for any other token. A child repeating a rejected sibling's token is rejected (its ``p`` is 0).

    Args:
        tokens: ``(B, N + 1)`` the verified rows' tokens; ``logits``: ``(B, N + 1, V)`` the target's logits of them.
        cfg: the :class:`~specdec.sampling.SamplingConfig` (temperature, top-k, top-p); ``gen``: the generator.

    Returns:
        what :func:`accept_greedy` returns.
    """
    from specdec.sampling import warp

    B, D = tokens.shape[0], tree.max_depth
    dev = tokens.device
    parent = tree.on(dev)[0]
    kids = tree.child_table(dev)  # (N + 1, K)
    probs = warp(logits, cfg)  # (B, N + 1, V)
    at = torch.arange(B, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    n_acc = torch.zeros(B, dtype=torch.long, device=dev)
    nxt = torch.zeros(B, dtype=torch.long, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    for _ in range(D + 1):  # depth D's node has no children: the last pass only draws the next token
        p = probs[at, cur]  # (B, V) the current node's distribution (a copy: rejections zero it)
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        for c in range(kids.shape[1]):
            row = kids[cur, c]  # (B,)
            x = tokens.gather(1, row.clamp(min=0).view(B, 1))[:, 0]
            px = p.gather(1, x.view(B, 1))[:, 0]
            u = torch.rand(B, generator=gen, device=dev)
            tried = alive & ~moved & (row >= 0)
            ok = tried & (u * p.sum(dim=-1) < px)
            cur = torch.where(ok, row, cur)
            moved = moved | ok
            p = torch.where((tried & ~ok).view(B, 1), p.scatter(1, x.view(B, 1), 0.0), p)
        stop = alive & ~moved
        mass = p.sum(dim=-1, keepdim=True)
        rest = torch.where(mass > 0, p / mass.clamp(min=1e-30), probs[at, cur])  # (no mass left: p itself)
        draw = torch.multinomial(rest, 1, generator=gen)[:, 0]
        nxt = torch.where(stop, draw, nxt)
        n_acc = n_acc + (alive & moved).long()
        alive = alive & moved
    # the accepted path, as accept_greedy gives it (rows past n_acc repeat the last accepted row)
    path = torch.zeros(B, D, dtype=torch.long, device=dev)
    walk = cur
    for d in range(D, 0, -1):
        here = n_acc >= d
        path[:, d - 1] = torch.where(here, walk, torch.zeros_like(walk))
        walk = torch.where(here, parent[walk], walk)
    keep = torch.arange(1, D + 1, device=dev).view(1, D) <= n_acc.view(B, 1)
    return n_acc, nxt, torch.where(keep, path, cur.view(B, 1).expand(B, D))
