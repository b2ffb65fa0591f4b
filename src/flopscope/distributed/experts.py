"""Expert parallelism: a mixture of experts' experts sharded over ``ep`` ranks, tokens dispatched
to the ranks that hold their experts with an all-to-all and the results combined with a second
one, counted for one rank on the fake process group.

The layout is transformers' own (``transformers.distributed.expert_parallel``, the model config's
``base_model_ep_plan``: ``grouped_gemm`` shards each expert weight's expert dimension,
``ep_dispatch_experts`` runs ``AllToAllEP``): every rank holds E / ep whole experts and its own
batch; per MoE layer it sends the per-expert token counts (an all-to-all of ep x E/ep integers),
then each (token, expert) pair's hidden state to the expert's rank, runs its experts on what it
received, and sends the results back.

What a rank computes depends on where *every* rank's tokens are routed, which a single simulated
rank cannot see: the fake process group returns nothing. So the simulation first runs the whole
model (real weights) on each rank's batch and keeps every MoE layer's routing (the router's
top-k experts and weights for each token); while the rank is counted, its routers choose those
experts (the choice its own router makes when ``build`` makes the same weights every call; kept
so that the rest of the rank's forward does not depend on the fake group's empty buffers: a
later layer's router sees hidden states made from them), and the count all-to-all returns the
counts the other ranks would send. The routers' logits and top-k weights stay the router's own
outputs, so their gradients reach the router in backward (values change no count; the chosen
experts do). Everything else runs as in a real job, so the rank's expert work and
bytes follow from the real token assignment.

A shape-only count has no values to route by. It assumes balanced routing instead
(:class:`BalancedRouting`): every rank holds a batch of the input's shape and splits its
tokens x top-k (token, expert) pairs evenly over the expert-parallel ranks, every expert equally
loaded; the split sizes that transformers reads back from the count all-to-all are answered
with those figures (:func:`apply_expert_parallel` on a ``meta`` model), everything else runs
as in a real job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from flopscope.errors import UsageError

__all__ = ["BalancedRouting", "Routing", "apply_expert_parallel", "moe_blocks", "route",
           "routed_as"]


def moe_blocks(model: nn.Module) -> list[tuple[str, Any]]:
    """The mixture-of-experts blocks of a transformers decoder: modules with a ``gate`` router
    (``top_k``, ``num_experts``) and ``experts`` (3-D ``gate_up_proj`` / ``down_proj``).

    Args:
        model: a transformers MoE decoder LM (Mixtral, Qwen2-MoE style).

    Returns:
        ``(path, block)`` in model order.

    Raises:
        UsageError: the model has none.
    """
    found: list[tuple[str, Any]] = [(name, m) for name, m in model.named_modules()
             if hasattr(m, "gate") and hasattr(m, "experts")
             and hasattr(m.gate, "top_k") and hasattr(m.experts, "gate_up_proj")]
    if not found:
        raise UsageError(
            f"{type(model).__name__} has no mixture-of-experts blocks (an 'mlp' with a 'gate' "
            "router and 'experts' holding gate_up_proj/down_proj, as transformers' Mixtral): "
            "--ep shards experts")
    return found


@dataclass(frozen=True)
class Routing:
    """Every rank's routing, per MoE block: ``indices[rank][block]`` (tokens x top-k expert ids)
    and ``weights[rank][block]`` (their routing weights), from the whole model run on each rank's
    batch."""

    experts: int
    indices: tuple[tuple[torch.Tensor, ...], ...]
    weights: tuple[tuple[torch.Tensor, ...], ...]
    logits: tuple[tuple[torch.Tensor, ...], ...]

    @property
    def ranks(self) -> int:
        """Ranks of the expert-parallel group."""
        return len(self.indices)

    def pairs(self, sender: int, receiver: int, block: int) -> int:
        """(token, expert) pairs ``sender``'s batch routes to ``receiver``'s experts in
        ``block``."""
        local = self.experts // self.ranks
        ids = self.indices[sender][block]
        return int(((ids // local) == receiver).sum())

    def counts(self, rank: int, block: int) -> torch.Tensor:
        """What the count all-to-all hands ``rank`` in ``block``: for each sender, how many of
        its pairs go to each of ``rank``'s experts (ranks x local experts)."""
        local = self.experts // self.ranks
        out = torch.zeros(self.ranks, local, dtype=torch.long)
        for sender in range(self.ranks):
            ids = self.indices[sender][block].reshape(-1)
            mine = ids[(ids // local) == rank] - rank * local
            out[sender] = torch.bincount(mine, minlength=local)
        return out


def _chunks(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    if t.shape[0] % n:
        raise UsageError(f"the batch of {t.shape[0]} does not split over {n} expert-parallel "
                         "ranks: with --ep the input is the whole group's batch, a multiple of ep")
    return list(t.chunk(n, dim=0))


def route(
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]], ep: int,
) -> tuple[Routing, list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    """Run the whole model on each rank's batch and keep every MoE block's routing.

    Args:
        build: returns ``(model, args, kwargs)`` with real weights and the expert-parallel
            group's whole batch (split along dimension 0 into ``ep`` equal rank batches).
        ep: ranks of the expert-parallel group.

    Returns:
        The :class:`Routing` and each rank's ``(args, kwargs)`` (indexed by any rank of a
        world of several expert groups: position ``rank mod ep``, every group the same).

    Raises:
        UsageError: no MoE blocks, a batch that does not split, experts that do not split, or
            meta tensors (routing needs values).
    """
    model, args, kwargs = build()
    blocks = moe_blocks(model)
    experts = int(blocks[0][1].gate.num_experts)
    if experts % ep:
        raise UsageError(f"{experts} experts do not split over ep = {ep} ranks")
    if any(p.is_meta for p in model.parameters()):
        raise UsageError("expert parallelism routes tokens by their values: count it on real "
                         "weights (without --shape-only / a meta model)")
    split_args = [_chunks(a, ep) if isinstance(a, torch.Tensor) else [a] * ep for a in args]
    split_kwargs = {k: _chunks(v, ep) if isinstance(v, torch.Tensor) else [v] * ep
                    for k, v in kwargs.items()}
    per_rank = [(tuple(a[r] for a in split_args), {k: v[r] for k, v in split_kwargs.items()})
                for r in range(ep)]
    indices: list[tuple[torch.Tensor, ...]] = []
    weights: list[tuple[torch.Tensor, ...]] = []
    logits: list[tuple[torch.Tensor, ...]] = []
    seen: list[tuple[torch.Tensor, ...]] = []

    def keep(module: nn.Module, inputs: Any, out: Any) -> None:
        seen.append(tuple(t.detach().clone() for t in out))

    for a, k in per_rank:
        seen.clear()
        handles = [b.gate.register_forward_hook(keep) for _, b in blocks]
        try:
            with torch.no_grad():
                model(*a, **k)
        finally:
            for h in handles:
                h.remove()
        logits.append(tuple(s[0] for s in seen))
        weights.append(tuple(s[1] for s in seen))
        indices.append(tuple(s[2] for s in seen))
    return Routing(experts, tuple(indices), tuple(weights), tuple(logits)), _GroupBatches(per_rank)


class _GroupBatches(list[tuple[tuple[Any, ...], dict[str, Any]]]):
    """The ranks' batches of one expert group; with groups smaller than the world, rank ``r``
    plays position ``r mod ep`` of its group, and every group gets the same batches."""

    def __getitem__(self, i: Any) -> Any:
        return super().__getitem__(i % len(self) if isinstance(i, int) else i)


class _PeerCounts(TorchDispatchMode):
    """Below the counter: the count all-to-all of each MoE block returns what the other ranks
    would send (the fake process group sends nothing)."""

    def __init__(self, counts: list[torch.Tensor]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts = counts
        self.next = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if (getattr(func, "_schema", None) is not None
                and func._schema.name == "c10d::alltoall_base_"
                and not args[0].is_floating_point()):
            if self.next >= len(self.counts):
                raise RuntimeError("more expert-count all-to-alls than MoE blocks")
            with torch.no_grad():
                args[0].copy_(self.counts[self.next].reshape(args[0].shape))
            self.next += 1
        return out


@contextmanager
def routed_as(model: nn.Module, routing: Routing, rank: int) -> Iterator[None]:
    """While counting ``rank``: its routers choose the kept experts (their logits and weights
    are their own, connected to the router for backward), and the count all-to-alls return the
    other ranks' counts (install inside the fake world, outside the Counter)."""
    blocks = moe_blocks(model)
    block_of = {id(b.gate): n for n, (_, b) in enumerate(blocks)}

    def hook(module: nn.Module, inputs: Any, out: Any) -> Any:
        b = block_of[id(module)]
        return (out[0], out[1], routing.indices[rank % routing.ranks][b])

    # expert groups smaller than the world: every group routes the same batches
    counts = [routing.counts(rank % routing.ranks, b) for b in range(len(blocks))]
    handles = [b.gate.register_forward_hook(hook) for _, b in blocks]
    try:
        with _PeerCounts(counts):
            yield
    finally:
        for h in handles:
            h.remove()


@dataclass(frozen=True)
class BalancedRouting:
    """The routing a shape-only expert-parallel count assumes (routing needs values, and a
    shape-only count has none): balanced routing, what load-balancing losses aim at.

    Every rank holds a batch of the same shape; each MoE block's ``pairs`` = tokens x top-k
    (token, expert) pairs of a rank are split evenly over the ``ep`` ranks (``pairs / ep`` to
    each, its own included), and each rank's experts get an even share of what it receives.
    When ``pairs`` does not divide, sender ``s`` sends one pair more to the ``pairs mod ep``
    ranks ``s, s + 1, ...`` (mod ``ep``), so every rank still receives as many pairs as it sends.

    Attributes:
        ep: ranks of the expert-parallel group.
    """

    ep: int

    def sent(self, pairs: int, sender: int) -> list[int]:
        """Pairs ``sender`` sends to each rank (``pairs`` of its own)."""
        base, extra = divmod(pairs, self.ep)
        return [base + ((r - sender) % self.ep < extra) for r in range(self.ep)]

    def received(self, pairs: int | Sequence[int], rank: int) -> list[int]:
        """Pairs ``rank`` receives from each rank: every rank with ``pairs`` of its own, or
        ``pairs[s]`` for rank ``s`` (tensor-parallel ranks dispatch slices of a shared batch)."""
        each = [pairs] * self.ep if isinstance(pairs, int) else list(pairs)
        return [self.sent(each[s], s)[rank] for s in range(self.ep)]

    def to_dict(self) -> dict[str, Any]:
        """The assumption, for a JSON report."""
        return {"routing": "balanced", "ep": self.ep,
                "assumption": self.line().removeprefix("expert routing: ")}

    def line(self) -> str:
        """One line for a table's notes."""
        return (f"expert routing: assumed balanced (shape-only: no values to route by): each "
                f"rank's tokens x top-k pairs split evenly over the {self.ep} expert-parallel "
                "ranks, every expert equally loaded; real routing is counted without "
                "--shape-only")


class _BalancedSizes(TorchDispatchMode):
    """Above the counter, while one experts module runs shape-only: the split sizes
    ``AllToAllEP`` reads back (``tolist()`` of the per-rank sent and received pair counts, one
    ``_local_scalar_dense`` per element, sent first) are answered with the balanced figures;
    every other call passes through."""

    def __init__(self, values: list[int]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.values = values
        self.next = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if (func is torch.ops.aten._local_scalar_dense.default and self.next < len(self.values)
                and not _has_values(args[0])):
            self.next += 1
            return self.values[self.next - 1]
        return func(*args, **(kwargs or {}))


def _has_values(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not (t.is_meta or isinstance(t, FakeTensor))


def _rows(tokens: int, tp: int) -> list[int]:
    """Tokens of each tensor-parallel rank's slice of a shared batch (``Shard(0)``: chunks of
    ``ceil(tokens / tp)``, the last ones shorter or empty)."""
    size = -(-tokens // tp)
    return [max(0, min(size, tokens - i * size)) for i in range(tp)]


def _balanced(experts: nn.Module, forward: Callable[..., Any], ep: int, rank: int, tp: int
              ) -> Callable[..., Any]:
    """``forward`` of an expert-parallel experts module with balanced split sizes; ``tp``
    ranks (neighbours in rank order) share a batch and each dispatches its slice of it."""
    routing = BalancedRouting(ep)

    @functools.wraps(forward)
    def balanced(hidden_states: Any, top_k_index: torch.Tensor, top_k_weights: Any) -> Any:
        tokens, k = top_k_index.shape[0], top_k_index.shape[-1]
        rows = _rows(tokens, tp)
        pairs = [rows[s % tp] * k for s in range(ep)]
        mode = _BalancedSizes(routing.sent(pairs[rank], rank) + routing.received(pairs, rank))
        with mode:
            out = forward(hidden_states, top_k_index, top_k_weights)
        if mode.next != len(mode.values):
            raise RuntimeError(
                f"{type(experts).__name__}: the expert-parallel dispatch read {mode.next} split "
                f"sizes, not the {len(mode.values)} of transformers' AllToAllEP this balanced "
                "routing answers (a transformers version with another dispatch?)")
        return out

    return balanced


def apply_expert_parallel(model: nn.Module, mesh: Any) -> nn.Module:
    """Shard the experts of every MoE block over ``mesh["ep"]`` with transformers'
    expert-parallel styles (``grouped_gemm`` weights, ``ep_dispatch_experts`` with the all-to-all
    implementation); ``mesh["tp"]`` is the group that shares a batch (size 1: every rank has
    its own; larger: each of its ranks dispatches a slice of the batch and the results are
    all-gathered, shape-only only).

    Args:
        model: a transformers MoE decoder LM.
        mesh: a device mesh with dimensions ``ep`` and ``tp`` (or a mapping of those names to
            one-dimensional meshes).

    On a ``meta`` model (a shape-only count) the experts' dispatch assumes
    :class:`BalancedRouting`: the split sizes it reads back are the balanced ones.

    Returns:
        ``model``.

    Raises:
        UsageError: no MoE blocks, experts that do not split over the ranks, transformers
            without expert parallelism, or a tensor-parallel group on real weights.
    """
    try:
        from transformers.distributed.expert_parallel import apply_expert_parallelism
    except ImportError as e:
        raise UsageError("expert parallelism needs transformers >= 5 "
                         "(transformers.distributed.expert_parallel)") from e
    plan: dict[str, str] = {}
    blocks = moe_blocks(model)
    experts, ep = int(blocks[0][1].gate.num_experts), mesh["ep"].size()
    if experts % ep:
        raise UsageError(f"{experts} experts do not split over ep = {ep} ranks: expert "
                         "parallelism gives every rank whole experts (use an --ep, and "
                         "--world-size, that divides the number of experts)")
    shape_only = any(p.is_meta for _, b in blocks for p in b.experts.parameters())
    for path, _ in blocks:
        plan[f"{path}.experts.gate_up_proj"] = "grouped_gemm"
        plan[f"{path}.experts.down_proj"] = "grouped_gemm"
        plan[f"{path}.experts"] = "ep_dispatch_experts"
    apply_expert_parallelism(model, mesh["ep"], mesh["tp"], plan, ep_implementation="all_to_all")
    tp = mesh["tp"].size()
    if tp > 1 and not shape_only:
        raise UsageError(
            "expert parallelism with tensor parallelism is counted shape-only (balanced "
            "routing): the real-routing pass gives every rank its own batch, while a "
            "tensor-parallel group shares one (add --shape-only / shape_only=True)")
    if shape_only:
        ep, rank = mesh["ep"].size(), mesh["ep"].get_local_rank()
        for _, block in blocks:
            block.experts.forward = _balanced(block.experts, block.experts.forward, ep, rank, tp)
    return model
