"""A serving role: one tensor-parallel rank of a decoder generating text, simulated once.

A serving layout's rank runs the decode loop of ``transformers``: a prefill of the prompt, then
one forward per new token with a growing ``DynamicCache``. :func:`simulate_serving` runs that loop
on one rank of a tensor-parallel group (torch's fake process group, shape-only, the standard
Llama plan of :func:`flopscope.distributed.apply_layout`; a mixture of experts' experts sharded
over the tensor-parallel ranks, :func:`flopscope.plan.space.expert_degree`; the simulated ranks'
shape-only mode,
:func:`flopscope.distributed.shape_only.shape_only_rank`, repeated calls answered from memory)
under a counter, four forwards:

1. the **prefill**: ``batch`` prompts of ``prompt`` tokens, the cache starts empty;
2. the **first decode step**: one token per sequence, attending ``prompt + 1`` keys;
3. a catch-up chunk of ``new_tokens - 3`` tokens that brings the cache to where the last decode
   step starts (its time and memory are not used: it stands for the decode steps between);
4. the **last decode step**, attending ``prompt + new_tokens - 1`` keys, with the cache of the
   whole generation;

and last one **mixed step** of continuous batching with chunked prefill (:func:`mixed_chunk`):
every sequence adds ``ceil((prompt + new_tokens - 1) / new_tokens)`` tokens to the cache's first
positions up to the generation's middle (:func:`middle`), as a serving engine runs a step
(:func:`flopscope.llm.engine.engine_step`: its cache's new positions written into room kept
for them, where a ``DynamicCache`` appends by ``cat``, and its attention a kernel's, no mask
and no copies). In a steady state of ``batch`` running sequences, each step gives
every sequence a token and prefills ``batch x prompt / new_tokens`` tokens of the requests that
take the finished ones' places: its products see exactly those tokens and read the weights
once; its attention sees the chunk's queries against each sequence's cache (a real step has one
query per decoding sequence, and a prompt's chunk against its own prefix: the same keys and
values read, more FLOPs here).

Each forward gets its own roofline log (:class:`~flopscope.estimate.CallLog`), its collectives
(the counter's communication before and after it) and, except the chunk, its own
:class:`~flopscope.estimate.MemoryTracker`, registered with the rank's parameter shards and the
cache the forward starts with: the forward's peak is the live tensors at its fullest moment
(weights, the cache, the new keys and values, activations, the logits of the last position).
The KV cache is read from the cache object the forward returns (every layer's keys and values),
as :class:`~flopscope.llm.StepCounter` reads it; the bytes a pipeline stage would hand the next
from the output of the first decoder layer.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from flopscope.core.counter import Counter
from flopscope.cost import Cost, OpCall, Phase
from flopscope.distributed import Layout, apply_layout
from flopscope.distributed.repeat import layer_list, layers_in
from flopscope.distributed.shape_only import shape_only_rank
from flopscope.distributed.simulate import fake_world
from flopscope.errors import UsageError
from flopscope.estimate import CallLog, Estimate, Hardware, MemoryProfile, MemoryTracker
from flopscope.estimate.bound import Row
from flopscope.llm.engine import engine_step
from flopscope.llm.kv_cache import cache_keyword, cache_layers, find_cache
from flopscope.plan.degrees import hardware_key
from flopscope.plan.roles import local_tensor
from flopscope.plan.space import expert_count, expert_degree
from flopscope.report.records import CommRecord

__all__ = ["ServeBuild", "ServeRoles", "ServeRun", "ServeStep", "clear_cache", "middle",
           "mixed_chunk", "on_stages", "remember", "simulate_serving"]

T = TypeVar("T")

#: ``build()`` -> the model on ``meta``, in eval mode (a transformers causal LM)
ServeBuild = Callable[[], nn.Module]


@dataclass(frozen=True)
class ServeStep:
    """One simulated forward of the decode loop on a tensor-parallel rank.

    Attributes:
        kind: ``"prefill"`` or ``"decode"``.
        tokens: query tokens (batch x new positions).
        context: keys each sequence attends at the end of the forward (the cache's length).
        estimate: the roofline estimate of its calls (a lower bound on time).
        communication: its collectives (the tensor-parallel all-reduces).
        memory: its peak (``None`` for the catch-up chunk, not used).
        kv_layer_bytes: the cache after it, bytes per decoder layer (keys and values).
        boundary_bytes: a decoder layer's output (what a pipeline stage hands the next).
        parts: its calls' sums as (before the decoder layers, each layer, after them): what
            each pipeline stage runs (:func:`_stage_parts`; empty: not split).
    """

    kind: str
    tokens: int
    context: int
    estimate: Estimate
    communication: tuple[CommRecord, ...]
    memory: MemoryProfile | None
    kv_layer_bytes: tuple[int, ...]
    boundary_bytes: int
    parts: tuple[Row, ...] = ()

    @property
    def kv_bytes(self) -> int:
        """The cache after the forward, all layers."""
        return sum(self.kv_layer_bytes)


@dataclass(frozen=True)
class ServeRun:
    """A serving role: one tensor-parallel rank generating ``new_tokens`` after a ``prompt``.

    Attributes:
        tp: tensor-parallel degree.
        batch: sequences.
        prompt: prompt tokens per sequence.
        new_tokens: tokens generated per sequence (the prefill gives the first).
        prefill: the prefill.
        first: the first decode step (the prefill itself when ``new_tokens`` is 1).
        last: the last decode step.
        weight_bytes: the rank's parameter shards (a tied weight once).
        layer_weight_bytes: per decoder layer, its parameter shards.
        first_stage_bytes: parameters outside the layers a first pipeline stage holds (the
            embedding).
        last_stage_bytes: those a last stage holds (the final norm, the head; a head tied to
            the embedding counted again: each stage holds a copy).
        seconds: how long the simulation took here.
        mixed: continuous batching's mean step (:func:`mixed_chunk` tokens per sequence; the
            prefill itself when ``new_tokens`` is 1; ``None``: not simulated).
    """

    tp: int
    batch: int
    prompt: int
    new_tokens: int
    prefill: ServeStep
    first: ServeStep
    last: ServeStep
    weight_bytes: int
    layer_weight_bytes: tuple[int, ...]
    first_stage_bytes: int
    last_stage_bytes: int
    seconds: float
    mixed: ServeStep | None = None


class _Switch:
    """Forwards every call to the current targets (each forward has its own log and
    tracker)."""

    def __init__(self) -> None:
        self.targets: list[Any] = []

    def on_call(self, path: str, phase: Phase, op: str, call: OpCall | None, cost: Cost) -> None:
        for target in self.targets:
            target.on_call(path, phase, op, call, cost)


def _part(module: str, path: str, layers: int, order: dict[str, int]) -> int:
    """Which part of the model ``module`` (a module's path) is in: 0 before the decoder
    layers, ``i + 1`` under layer ``i`` (``path.i``), ``layers + 1`` after them. The root and
    the layers' ancestors (their own calls: the positions, the mask) are before; any other
    module before or after by where the model registers it against the layers' container at
    ``path`` (``order``: named_modules' order; the embedding before, the norm and the head
    after)."""
    prefix = f"{path}."
    index = module[len(prefix):].split(".", 1)[0] if module.startswith(prefix) else ""
    if index.isdigit() and int(index) < layers:
        return int(index) + 1
    if module == "" or path.startswith(f"{module}.") or order.get(module, -1) < order[path]:
        return 0
    return layers + 1


def on_stages(parts: Sequence[T], pp: int) -> list[list[T]]:
    """A model's parts (before the decoder layers, each layer, after them:
    :attr:`ServeStep.parts`, a role's weights) grouped by the pipeline stage that holds them:
    each stage its layers (:func:`~flopscope.distributed.pipeline.split_layers`), the first
    the part before them too, the last the part after.

    Args:
        parts: ``(before, *layers, after)``.
        pp: pipeline stages.

    Returns:
        Per stage, its parts in order.
    """
    from flopscope.distributed.pipeline import split_layers

    before, *layers, after = parts
    return [([before] if s == 0 else []) + [layers[i] for i in run]
            + ([after] if s == pp - 1 else [])
            for s, run in enumerate(split_layers(len(layers), pp))]


def _stage_weights(model: nn.Module, layers: int, path: str, order: dict[str, int]
                   ) -> tuple[tuple[int, ...], int, int]:
    """Per decoder layer its parameter bytes, and those before and after the layers (a first
    and a last pipeline stage's: the embeddings; the norm, the head), each parameter in its
    module's part (:func:`_part`; a tied weight under each name)."""
    sums = [0] * (layers + 2)
    for name, p in model.named_parameters(remove_duplicate=False):
        sums[_part(name.rpartition(".")[0], path, layers, order)] += (
            local_tensor(p).untyped_storage().nbytes())
    return tuple(sums[1:-1]), sums[0], sums[-1]


def _stage_parts(estimate: Estimate, layers: int, path: str, order: dict[str, int]
                 ) -> tuple[Row, ...]:
    """A forward's calls as (before the decoder layers, each layer, after them), from its
    modules' own calls (:func:`_part`)."""
    parts = [Row() for _ in range(layers + 2)]
    for name, row in estimate.by_module_self.items():
        parts[_part(name, path, layers, order)].add(row)
    return tuple(parts)


def _minus(after: tuple[CommRecord, ...], before: tuple[CommRecord, ...]
           ) -> tuple[CommRecord, ...]:
    """The collectives a forward issued: the counter's records after it less those before."""
    was = {(c.module, c.phase, c.kind, *c.group_key): c for c in before}
    out = []
    for c in after:
        old = was.get((c.module, c.phase, c.kind, *c.group_key))
        if old is None:
            out.append(c)
        elif c.calls != old.calls:
            out.append(CommRecord(c.module, c.phase, c.kind, c.group_size, c.calls - old.calls,
                                  c.payload_bytes - old.payload_bytes,
                                  c.bus_bytes - old.bus_bytes, c.group))
    return tuple(out)


def simulate_serving(build: ServeBuild, tp: int, batch: int, prompt: int, new_tokens: int,
                     hardware: Hardware) -> ServeRun:
    """Simulate one tensor-parallel rank generating ``new_tokens`` tokens after ``prompt``
    tokens for ``batch`` sequences (see the module's docstring).

    Args:
        build: makes the model (on ``meta``, eval mode).
        tp: tensor-parallel degree.
        batch: sequences.
        prompt: prompt tokens per sequence.
        new_tokens: tokens to generate per sequence (at least 1).
        hardware: the profile the roofline estimates are for.

    Returns:
        The :class:`ServeRun`.

    Raises:
        UsageError: a model that returns no key/value cache.
    """
    from transformers import DynamicCache

    start = time.perf_counter()
    switch = _Switch()
    boundary: list[int] = []
    steps: list[ServeStep] = []
    plan = _forwards(prompt, new_tokens)
    with fake_world(tp, 0), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build()
        ep = expert_degree(expert_count(getattr(model, "config", None)), tp)
        if ep is None:
            raise UsageError(f"{type(model).__name__}: tensor parallelism {tp} does not divide "
                             "its experts (a serving layout shards them over its "
                             "tensor-parallel ranks)")
        layout = Layout(tp, tp=tp, fsdp=1, ep=ep)
        apply_layout(model, layout, layout.mesh())
        layers = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0))
        with shape_only_rank(model), torch.no_grad():
            weights = [local_tensor(p) for p in model.parameters()]
            found = layer_list(model)
            if found is None:
                raise UsageError(f"{type(model).__name__} has no list of decoder layers: "
                                 "serving plans transformers decoders")
            order = {name: k for k, (name, _) in enumerate(model.named_modules())}
            per_layer, first_bytes, last_bytes = _stage_weights(model, layers, found[0], order)
            decoder = layers_in(found[1])[0]
            handle = decoder.register_forward_hook(
                lambda m, a, out: boundary.append(int((out[0] if isinstance(out, tuple)
                                                       else out).nbytes)))
            keyword = cache_keyword(model)
            cache: Any = DynamicCache(config=getattr(model, "config", None))

            def forward(kind: str, positions: int, kept: bool, model: nn.Module = model,
                        weights: list[torch.Tensor] = weights) -> ServeStep:
                """One forward of the loop on ``cache`` under the counter, as a step."""
                nonlocal cache
                log, tracker = CallLog(), MemoryTracker()
                tracker.register(weights, "parameters")
                tracker.register((t for kv in cache_layers(cache) for t in kv), "inputs")
                switch.targets = [log, tracker] if kept else [log]
                before = counter.report.communication
                ids = torch.zeros(batch, positions, dtype=torch.long)
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1,
                            **{keyword: cache})
                switch.targets = []  # what runs between forwards is no step's
                cache = find_cache(out) or cache
                kv = tuple(int(local_tensor(k).untyped_storage().nbytes()
                               + local_tensor(v).untyped_storage().nbytes())
                           for k, v in cache_layers(cache))
                if not kv:
                    raise UsageError(f"{type(model).__name__} returned no key/value "
                                     "cache: serving plans decoders that keep one")
                del out
                memory = tracker.profile() if kept else None
                if not kept:
                    tracker.close()
                estimate = log.estimate(hardware)
                return ServeStep(kind if kind in ("prefill", "mixed") else "decode",
                                 batch * positions, cache.get_seq_length(), estimate,
                                 _minus(counter.report.communication, before), memory, kv,
                                 boundary[-1], _stage_parts(estimate, layers, found[0], order))

            try:
                with Counter(model, observers=[switch], warn=False) as counter:
                    for kind, positions, kept in plan:
                        if kind != "mixed":
                            steps.append(forward(kind, positions, kept))
                            continue
                        with engine_step(model, cache, positions,
                                         middle(prompt, new_tokens)):
                            steps.append(forward(kind, positions, kept))
            finally:
                handle.remove()
        del model, weights, forward
    by_kind = {kind: [s for s, (k, _, _) in zip(steps, plan, strict=True) if k == kind]
               for kind in ("prefill", "decode", "mixed")}
    prefill, decodes = by_kind["prefill"][0], by_kind["decode"] or by_kind["prefill"]
    weight_bytes = prefill.memory.at_peak.get("parameters", 0) if prefill.memory else 0
    return ServeRun(tp, batch, prompt, new_tokens, prefill, decodes[0], decodes[-1],
                    weight_bytes, per_layer, first_bytes, last_bytes,
                    time.perf_counter() - start, (by_kind["mixed"] or [prefill])[0])


def mixed_chunk(prompt: int, new_tokens: int) -> int:
    """The tokens per sequence of continuous batching's mean step: in a steady state each
    sequence's request passes ``prompt`` tokens of prefill and ``new_tokens - 1`` decode steps
    through the server in ``new_tokens`` steps (each step gives every running sequence a
    token), ``ceil((prompt + new_tokens - 1) / new_tokens)``.

    Args:
        prompt: prompt tokens per sequence.
        new_tokens: tokens generated per sequence.

    Returns:
        Tokens per sequence per step (``prompt`` when ``new_tokens`` is 1: the prefill).
    """
    return -(-(prompt + new_tokens - 1) // new_tokens)


def _forwards(prompt: int, new_tokens: int) -> list[tuple[str, int, bool]]:
    """The decode loop's forwards as (kind, new positions per sequence, whether its memory is
    kept): the prefill, the first decode step, a catch-up chunk, the last decode step (see the
    module's docstring), then the mixed step (:func:`mixed_chunk`; on the generation's middle:
    :func:`middle`)."""
    plan = [("prefill", prompt, True)]
    if new_tokens == 1:
        return plan
    plan.append(("decode", 1, True))
    plan += [("chunk", new_tokens - 3, False)] if new_tokens >= 4 else []
    plan += [("decode", 1, True)] if new_tokens >= 3 else []
    return [*plan, ("mixed", mixed_chunk(prompt, new_tokens), True)]


def middle(prompt: int, new_tokens: int) -> int:
    """The cache the mixed step starts from: its keys centred on the loop's mean context,
    ``prompt + (new_tokens - 1) / 2`` (at least the prompt and the first token).

    Args:
        prompt: prompt tokens per sequence.
        new_tokens: tokens generated per sequence.

    Returns:
        Positions per sequence.
    """
    chunk = mixed_chunk(prompt, new_tokens)
    return prompt + 1 + max(0, (new_tokens - 3 - chunk) // 2)


#: every serving role simulated in this process, by (model identity, hardware, tp, batch,
#: prompt, new tokens)
_CACHE: dict[tuple[Hashable, str, int, int, int, int], ServeRun] = {}


class ServeRoles:
    """Serving roles, each simulated once per process (a later plan of the same model reuses
    them: another device count, budget or batch list).

    Args:
        build: makes the model (:data:`ServeBuild`).
        hardware: the profile the roofline estimates are for.
        identity: what ``build`` builds, the cache's key with the role.
        prompt: prompt tokens per sequence.
        new_tokens: tokens generated per sequence.

    Attributes:
        simulations: simulations run (cache misses).
        used: distinct roles asked for.
    """

    def __init__(self, build: ServeBuild, hardware: Hardware, identity: Hashable, prompt: int,
                 new_tokens: int) -> None:
        self._build = build
        self._hardware = hardware
        self._identity = identity
        self._prompt = prompt
        self._new_tokens = new_tokens
        self._used: set[tuple[int, int]] = set()
        self.simulations = 0

    @property
    def used(self) -> int:
        """Distinct roles asked for."""
        return len(self._used)

    def get(self, tp: int, batch: int) -> ServeRun:
        """The role of a tensor-parallel rank serving ``batch`` sequences (simulated now when
        no earlier plan did).

        Args:
            tp: tensor-parallel degree.
            batch: sequences.

        Returns:
            Its :class:`ServeRun`.
        """
        self._used.add((tp, batch))
        key = (self._identity, hardware_key(self._hardware), tp, batch, self._prompt, self._new_tokens)
        found = _CACHE.get(key)
        if found is None:
            found = _CACHE[key] = simulate_serving(self._build, tp, batch, self._prompt,
                                                   self._new_tokens, self._hardware)
            self.simulations += 1
        return found


def clear_cache() -> None:
    """Forget every simulated serving role."""
    _CACHE.clear()


def remember(identity: Hashable, hardware: Hardware, run: ServeRun) -> None:
    """Keep a serving role simulated elsewhere (a worker process, a Ray task): a later
    :meth:`ServeRoles.get` of the same model, hardware and role finds it.

    Args:
        identity: what the role's model is (as :class:`ServeRoles` is given it).
        hardware: the profile its estimates are for.
        run: the simulated role.
    """
    _CACHE[(identity, hardware_key(hardware), run.tp, run.batch, run.prompt, run.new_tokens)] = run
