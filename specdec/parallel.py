"""Tensor parallelism over ``torch.distributed``: one model, its heads and its KV cache split over ranks.

Megatron-style sharding of every decoder layer, following the model family's own declaration in
transformers (``config.base_model_tp_plan``: ``"colwise"`` / ``"rowwise"`` per projection):

* **attention**: rank ``r`` keeps a contiguous block of KV heads and the ``G`` query heads of each
  (``q/k/v_proj`` sliced by output rows, ``o_proj`` by input columns), so the routed attention
  function sees ``H / W`` query heads and ``H_kv / W`` KV heads and the KV cache of each rank holds
  only its heads. Blocks may be uneven (SmolLM2's 3 KV heads over 2 ranks: 2 + 1).
* **MLP**: ``gate/up_proj`` sliced by output rows, ``down_proj`` by input columns.
* every ``rowwise`` projection ends with **one all-reduce** (sum of the ranks' partial products,
  its bias added once after the sum): two all-reduces per layer per forward.
* embeddings, norms and the LM head stay whole on every rank, so every rank computes the same
  logits; the engine still decides acceptance once (rank 0) and broadcasts it
  (:meth:`TensorParallel.broadcast_`) so that ranks can never diverge.

Selectors see their shard's KV heads. A score request that sums over *every* query head
(``ScoreRequest.heads == "all"``) is all-reduced once per layer and forward
(:meth:`TensorParallel.all_reduce_`); per-KV-group scores (Vegas' default) need no collective.

Launch with ``torchrun`` (``torchrun --nproc-per-node 2 -m specdec generate ... --tp 2``) or from
Python::

    tp = init_tensor_parallel()                       # reads RANK / WORLD_SIZE (torchrun)
    model = SpecdecModel.from_pretrained("smollm2-135m")
    shard_model(model, tp)                            # in place; before fuse/compile/graphs

Collectives carry a timeout (``timeout_s``): a rank that dies mid-generation ends the others with an
error instead of a hang.
"""

from __future__ import annotations

import atexit
import fnmatch
import os
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from specdec.errors import SpecdecError

#: methods whose every component runs on sharded heads (Dustin's retrieval heads are indexed over all
#: heads and its draft model is not sharded: not yet)
TP_METHODS = ("dense", "magicdec", "vegas", "vegas-all", "vegas-last", "quest")

#: sharding styles of ``base_model_tp_plan`` that need no change here (whole module on every rank)
_REPLICATED = ("replicated_with_grad_allreduce", "replicate", "replicated")
#: vocab-parallel embedding styles (transformers 5.1x adds ``"embed_tokens": "embedding_rowwise"`` to the plan of
#: every model with tied embeddings, e.g. SmolLM2): specdec keeps the embedding (and the tied LM head) whole on every
#: rank, as before that entry existed; only the attention heads and the MLP are sharded
_EMBEDDING_STYLES = ("embedding_rowwise", "embedding_colwise")


@dataclass
class TensorParallel:
    """A tensor-parallel group: this process's ``rank`` among ``world`` ranks."""

    rank: int
    world: int
    group: object | None = None  # None: the default process group

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place (a no-op for one rank)."""
        if self.world > 1:
            dist.all_reduce(t, group=self.group)
        return t

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``t`` on every rank with rank ``src``'s value, in place."""
        if self.world > 1:
            dist.broadcast(t, src=src, group=self.group)
        return t

    def shard(self, n: int) -> tuple[int, int]:
        """``[start, end)`` of this rank's block when ``n`` items are split as evenly as possible."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)


def check_method(method: str) -> None:
    """Refuse a method that cannot run tensor-parallel, naming those that can."""
    if method not in TP_METHODS:
        raise SpecdecError(f"method {method!r} does not run with --tp yet; use one of {', '.join(TP_METHODS)} "
                           "(or drop --tp).")


def init_tensor_parallel(device: str = "cpu", timeout_s: float = 300.0) -> TensorParallel:
    """Join (or create) the default process group from torchrun's environment.

    ``gloo`` on the CPU, ``nccl`` on CUDA (where rank ``r`` uses ``cuda:LOCAL_RANK``). Without
    torchrun's variables this is a one-rank group and nothing is initialised.
    """
    if timeout_s <= 0 or timeout_s != timeout_s:
        raise SpecdecError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    if dist.is_available() and dist.is_initialized():
        return TensorParallel(rank=dist.get_rank(), world=dist.get_world_size())
    if "WORLD_SIZE" not in os.environ:
        return TensorParallel(rank=0, world=1)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    atexit.register(_destroy_process_group)  # we created it: torn down before the interpreter's own teardown
    return TensorParallel(rank=rank, world=world)


def _destroy_process_group() -> None:
    """Destroy the default process group at exit (a local call, no collective). Left to the interpreter's
    teardown, a gloo group's threads can outlive it: a rank then aborts after its work is done
    (``terminate called without an active exception``, exit code -6)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class RowParallelLinear(nn.Module):
    """A ``Linear`` over this rank's slice of the input features, summed over ranks (bias once)."""

    def __init__(self, linear: nn.Linear, start: int, end: int, tp: TensorParallel) -> None:
        super().__init__()
        self.in_features, self.out_features = end - start, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach()[:, start:end].contiguous(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce_(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def _slice_rows(linear: nn.Linear, start: int, end: int) -> nn.Linear:
    out = nn.Linear(linear.in_features, end - start, bias=linear.bias is not None, device="meta")
    out.weight = nn.Parameter(linear.weight.detach()[start:end].contiguous(), requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias.detach()[start:end].contiguous(), requires_grad=False)
    return out


def _tp_plan(hf) -> dict[str, str]:
    plan = getattr(hf.config, "base_model_tp_plan", None)
    if not plan:
        raise SpecdecError(
            f"model type {hf.config.model_type!r} declares no tensor-parallel plan (config.base_model_tp_plan); "
            "tensor parallelism supports families that do (Llama, Qwen2, Qwen3, Mistral, Gemma 3, ...)."
        )
    return dict(plan)


def shard_model(model, tp: TensorParallel) -> None:
    """Split ``model`` (a :class:`~specdec.models.SpecdecModel`) over ``tp``'s ranks, in place.

    Call it on every rank with the same weights, before ``fuse_projections`` / ``enable_compile`` /
    ``enable_cuda_graphs``. Afterwards ``model.dims`` counts this rank's heads, ``model.new_cache``
    holds only them and ``model.tp`` is ``tp``.
    """
    if model.tp is not None and model.tp.world > 1:
        raise SpecdecError("this model is already sharded; load a fresh model to shard it again.")
    if model._compiled is not None or model._graphs is not None:
        raise SpecdecError("shard_model() changes the model's modules; call it before enable_compile() and enable_cuda_graphs().")
    if tp.world == 1:
        model.tp = tp
        return
    d = model.dims
    if d.n_kv_heads < tp.world:
        raise SpecdecError(
            f"tensor parallelism over {tp.world} ranks needs at least {tp.world} KV heads; the model has {d.n_kv_heads}: "
            f"use --tp {d.n_kv_heads} or fewer."
        )
    hf = model.hf
    plan = _tp_plan(hf)
    G = d.n_heads // d.n_kv_heads
    kv0, kv1 = tp.shard(d.n_kv_heads)
    base = hf.base_model if hasattr(hf, "base_model") else hf
    named = dict(base.named_modules())
    done = 0
    for name, mod in list(named.items()):
        style = next((s for pat, s in plan.items() if fnmatch.fnmatchcase(name, pat)), None)
        if style is None or style in _REPLICATED or (style in _EMBEDDING_STYLES and isinstance(mod, nn.Embedding)):
            continue
        if not isinstance(mod, nn.Linear):
            raise SpecdecError(f"tensor-parallel plan names {name} ({type(mod).__name__}), which is not a Linear; "
                               "only Linear projections can be sharded.")
        parent_name, _, attr = name.rpartition(".")
        parent = named[parent_name]
        if style == "colwise":
            if attr == "q_proj":
                a, b = kv0 * G * d.head_dim, kv1 * G * d.head_dim
            elif attr in ("k_proj", "v_proj"):
                a, b = kv0 * d.head_dim, kv1 * d.head_dim
            else:
                a, b = tp.shard(mod.out_features)
            setattr(parent, attr, _slice_rows(mod, a, b))
        elif style == "rowwise":
            if attr == "o_proj":
                a, b = kv0 * G * d.head_dim, kv1 * G * d.head_dim
            else:
                a, b = tp.shard(mod.in_features)
            setattr(parent, attr, RowParallelLinear(mod, a, b, tp))
        else:
            raise SpecdecError(f"tensor-parallel style {style!r} (for {name}) is not supported; supported: colwise, rowwise.")
        done += 1
    if done == 0:
        raise SpecdecError(f"the tensor-parallel plan of {hf.config.model_type!r} matched no module; nothing was sharded.")
    model.dims = replace(d, n_heads=(kv1 - kv0) * G, n_kv_heads=kv1 - kv0)
    model.tp = tp
    model._reusable_cache = None
