"""A serving layout's memory per device, from its serving role: each pipeline stage at the fuller
of the prefill and the last decode step (weights, the KV cache, activations; one stage: the
simulated peak itself), or with continuous batching at its mixed step (every sequence's cache
at the generation's middle, one step's activations), and the largest batch that fits a budget
(memory is affine in the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flopscope.plan.serving import ServeRun, ServeStep, on_stages

__all__ = ["BATCHING", "StageMemory", "fits_budget", "largest_batch", "stage_memories"]

#: how a server batches its sequences: ``static`` (a batch from its prompts to its last
#: tokens, transformers' ``generate``) or ``continuous`` (a finished sequence's place taken at
#: once by a new request, its prompt prefilled in chunks beside the others' decode steps)
BATCHING = ("static", "continuous")


@dataclass(frozen=True)
class StageMemory:
    """A pipeline stage's memory at its fuller step, bytes.

    Attributes:
        total: the stage's peak.
        weights: its parameters.
        kv: its layers' KV cache at the end of the generation (with continuous batching at
            its middle: the mean of sequences at every point of theirs).
        where: ``module (prefill|decode)``, and the stage with stages.
        at: the peak by category (``parameters``, ``kv_cache``, ``activations``).
    """

    total: int
    weights: int
    kv: int
    where: str
    at: dict[str, int]


def _stage_memory(run: ServeRun, step: ServeStep, busy: ServeStep, layers: Sequence[range],
                  s: int, weights: int) -> StageMemory:
    """Stage ``s``'s memory at ``step``'s peak (one stage: the simulated peak itself), as
    parameters, the KV cache after the step (``run``: every sequence's) and the rest
    (activations, temporaries, the logits) of ``busy``, the same step of the role at one
    micro-batch (with stages, a stage runs one micro-batch at a time); ``weights`` the stage's
    parameters."""
    memory = busy.memory
    assert memory is not None and step.memory is not None  # kept steps have one
    where = f"{memory.peak_module or '(root)'} ({step.kind})"
    held = step if step.kind == "mixed" else run.last  # the cache a sequence keeps
    end = sum(held.kv_layer_bytes[i] for i in layers[s])
    rest = max(0, memory.peak_bytes - run.weight_bytes - busy.kv_bytes)
    if len(layers) == 1:
        return StageMemory(step.memory.peak_bytes, run.weight_bytes, end, where,
                           {"parameters": run.weight_bytes, "kv_cache": step.kv_bytes,
                            "activations": rest})
    kv = sum(step.kv_layer_bytes[i] for i in layers[s])
    return StageMemory(weights + kv + rest, weights, end, f"stage {s}: {where}",
                       {"parameters": weights, "kv_cache": kv, "activations": rest})


def _steps(run: ServeRun, batching: str) -> tuple[ServeStep, ...]:
    """The steps whose peaks a batching holds: static, the prefill and the last decode step;
    continuous, the mixed step."""
    if batching == "static":
        return run.prefill, run.last
    if run.mixed is None:
        raise ValueError("a serving role without its mixed step plans static batching only")
    return (run.mixed,)


def stage_memories(run: ServeRun, pp: int, micro: ServeRun | None = None,
                   batching: str = "static") -> list[StageMemory]:
    """Every stage's memory at the fuller of the prefill and the last decode step (with
    continuous batching: at the mixed step).

    Args:
        run: the serving role at the batch (every sequence's KV cache).
        pp: pipeline stages.
        micro: with stages, the role at one micro-batch
            (:func:`~flopscope.plan.serve_time.micro_batch`), whose activations a stage holds
            (``None``: ``run``'s; one stage: ``run``'s peak whatever it is).
        batching: one of :data:`BATCHING`.

    Returns:
        The stages' memory, first stage first.
    """
    from flopscope.distributed.pipeline import split_layers

    busy = run if micro is None or pp == 1 else micro
    layers = split_layers(len(run.layer_weight_bytes), pp)
    pairs = tuple(zip(_steps(run, batching), _steps(busy, batching), strict=True))
    weights = [sum(parts) for parts in on_stages(
        (run.first_stage_bytes, *run.layer_weight_bytes, run.last_stage_bytes), pp)]
    return [max((_stage_memory(run, step, held, layers, s, weights[s]) for step, held in pairs),
                key=lambda m: m.total) for s in range(pp)]


def largest_batch(one: ServeRun, two: ServeRun, pp: int, budget: int, cap: int,
                  batching: str = "static") -> int:
    """The batch at which the first stage to reach ``budget`` does, from memory affine in the
    batch (every tensor but the weights has a batch dimension): the KV cache of every
    sequence, the activations of one micro-batch (``ceil(batch / pp)`` sequences).

    Args:
        one: the role at batch 1.
        two: the role at batch 2.
        pp: pipeline stages.
        budget: bytes per device.
        cap: the largest batch tried.
        batching: one of :data:`BATCHING`.

    Returns:
        The batch (0: not even one), at most ``cap``.
    """
    best = cap
    # per stage: m(B) = m(1) + kv x (B - 1) + act x (ceil(B / pp) - 1), kv from the cache at 2
    # with the activations at 1, act from the activations at 2 (one stage: the activations
    # follow the batch, kv is 0 and act the whole slope)
    for a, k, b in zip(stage_memories(one, pp, batching=batching),
                       stage_memories(two, pp, one, batching),
                       stage_memories(two, pp, two, batching), strict=True):
        kv = k.total - a.total if pp > 1 else 0
        act = b.total - a.total - kv
        best = min(best, _most(budget - a.total, kv, max(0, act), pp, cap))
    return max(0, best)


def _most(room: int, kv: int, act: int, pp: int, cap: int) -> int:
    """The largest B with kv x (B - 1) + act x (ceil(B / pp) - 1) <= ``room``, at most
    ``cap``: per micro-batch size m, the sequences the cache leaves room for, up to m x pp."""
    if room < 0:
        return 0
    if act == 0:
        return cap if kv <= 0 else min(cap, room // kv + 1)
    near = (pp * (room + max(kv, 0) + act)) // (pp * max(kv, 0) + act)  # B / pp continuous
    best = 0
    for m in range(max(1, -(-near // pp) - 1), -(-near // pp) + 2):
        left = room - act * (m - 1)
        if left < 0:
            continue
        most = m * pp if kv <= 0 else min(m * pp, left // kv + 1)
        if most > (m - 1) * pp:  # a batch whose micro-batches have m sequences
            best = max(best, most)
    return min(cap, best)


def fits_budget(run: ServeRun, micro: ServeRun, pp: int, budget: int,
                batching: str = "static") -> bool:
    """Whether every stage of ``run``'s layout fits ``budget`` bytes.

    Args:
        run: the serving role at the batch.
        micro: the role at one micro-batch (``run`` without stages).
        pp: pipeline stages.
        budget: bytes per device.
        batching: one of :data:`BATCHING`.

    Returns:
        ``True`` when the fullest stage fits.
    """
    return max(m.total for m in stage_memories(run, pp, micro, batching)) <= budget
