"""A serving layout's memory per device, from its serving role: each pipeline stage at the fuller
of the prefill and the last decode step (weights, the KV cache, activations; one stage: the
simulated peak itself), and the largest batch that fits a budget (memory is affine in the
batch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flopscope.plan.serving import ServeRun, ServeStep

__all__ = ["StageMemory", "fits_budget", "largest_batch", "stage_memories"]


@dataclass(frozen=True)
class StageMemory:
    """A pipeline stage's memory at its fuller step, bytes.

    Attributes:
        total: the stage's peak.
        weights: its parameters.
        kv: its layers' KV cache at the end of the generation.
        where: ``module (prefill|decode)``, and the stage with stages.
        at: the peak by category (``parameters``, ``kv_cache``, ``activations``).
    """

    total: int
    weights: int
    kv: int
    where: str
    at: dict[str, int]


def _stage_memory(run: ServeRun, step: ServeStep, layers: Sequence[range], s: int) -> StageMemory:
    """Stage ``s``'s memory at ``step``'s peak (one stage: the simulated peak itself), as
    parameters, the KV cache after the step and the rest (activations, temporaries, the
    logits)."""
    memory = step.memory
    assert memory is not None  # kept steps have one
    where = f"{memory.peak_module or '(root)'} ({step.kind})"
    end = sum(run.last.kv_layer_bytes[i] for i in layers[s])  # the stage's cache at the end
    rest = max(0, memory.peak_bytes - run.weight_bytes - step.kv_bytes)
    if len(layers) == 1:
        return StageMemory(memory.peak_bytes, run.weight_bytes, end, where,
                       {"parameters": run.weight_bytes, "kv_cache": step.kv_bytes,
                        "activations": rest})
    weights = sum(run.layer_weight_bytes[i] for i in layers[s])
    weights += (run.first_stage_bytes if s == 0 else 0)
    weights += (run.last_stage_bytes if s == len(layers) - 1 else 0)
    kv = sum(step.kv_layer_bytes[i] for i in layers[s])
    return StageMemory(weights + kv + rest, weights, end, f"stage {s}: {where}",
                   {"parameters": weights, "kv_cache": kv, "activations": rest})


def stage_memories(run: ServeRun, pp: int) -> list[StageMemory]:
    """Every stage's memory at the fuller of the prefill and the last decode step.

    Args:
        run: the serving role.
        pp: pipeline stages.

    Returns:
        The stages' memory, first stage first.
    """
    from flopscope.distributed.pipeline import split_layers

    layers = split_layers(len(run.layer_weight_bytes), pp)
    return [max((_stage_memory(run, step, layers, s) for step in (run.prefill, run.last)),
                key=lambda m: m.total) for s in range(pp)]


def largest_batch(one: ServeRun, two: ServeRun, pp: int, budget: int, cap: int) -> int:
    """The batch at which the first stage to reach ``budget`` does, from memory affine in the
    batch (every tensor but the weights has a batch dimension).

    Args:
        one: the role at batch 1.
        two: the role at batch 2.
        pp: pipeline stages.
        budget: bytes per device.
        cap: the largest batch tried.

    Returns:
        The batch (0: not even one), at most ``cap``.
    """
    best = cap
    for a, b in zip(stage_memories(one, pp), stage_memories(two, pp), strict=True):
        slope = b.total - a.total
        if slope > 0:
            best = min(best, (budget - (a.total - slope)) // slope)
    return max(0, best)


def fits_budget(run: ServeRun, pp: int, budget: int) -> bool:
    """Whether every stage of ``run``'s layout fits ``budget`` bytes.

    Args:
        run: the serving role.
        pp: pipeline stages.
        budget: bytes per device.

    Returns:
        ``True`` when the fullest stage fits.
    """
    return max(m.total for m in stage_memories(run, pp)) <= budget
