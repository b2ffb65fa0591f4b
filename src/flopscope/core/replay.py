"""Replaying whole repeated modules in a symbolic count: the layers of a decoder stack.

A symbolic count (:mod:`flopscope.symbolic`) runs the model on fake tensors whose sizes are
``SymInt`` expressions; every size computed in the model's Python code (``x.view(b, t, h, d)``)
and in PyTorch's composites goes through ``SymInt`` arithmetic, which costs tens of microseconds
per operation. :mod:`flopscope.core.memo` answers repeated *operator* calls from memory, but the Python
around them still runs once per layer, so an 80-layer decoder cost about 15x a concrete count.

Here a *module* call is answered from memory instead: the 80 layers of a decoder are modules of the
same structure called on arguments of the same metadata, so the third and later of them do exactly
what the first two did, up to their path in the model. Their forward is not run; what the first
call added to the Counter (each record, relative to the module's path; module call counts; the
module frame's arithmetic tally) is added again under the new path, and the output is made again as
fake tensors from templates of the first call's output (:func:`flopscope.core.fake_memo.template`).

When it applies (everything else runs as usual):

- only while a symbolic count replays outputs (no backward: the autograd graph is not built), with
  no call observer (roofline, memory and communication logs see every call) and no DTensor;
- only on *maximal* members of ``nn.ModuleList``/``nn.Sequential`` containers that share their
  *structure* with two or more other members: the same class and training flag, the same parameter
  and buffer shapes, dtypes and ``requires_grad``, the same plain attributes (an ``int`` that
  holds every member's own index in its container, such as transformers' ``layer_idx``, counts
  as equal: it names the layer, it does not shape its work), the same submodules recursively;
  any module hook in the subtree, TorchScript, or a module registered under several paths
  excludes a module;
- a call is keyed by its group and its arguments' metadata (tensors as in
  :func:`flopscope.core.memo.signature`; other objects by identity: a key/value cache passed to every
  layer is the same object);
- a key is replayed only after two calls on two different modules of the group ran and were *the
  same* (the key's first call and an earlier first call of the group, perhaps of another key: layer
  0 runs on the embeddings, layer 1 on an output that requires grad): the same records (relative
  path, operator, phase, cost expression) in the same order, the same output metadata, nothing
  outside the module's subtree, no module rule, no opaque or lazy module, no metadata changed in
  place. A group whose two calls of one key differ (layers that alternate sliding and full
  attention through something the structure does not show) is never replayed.

What is not seen: Python state that a replayed forward would have changed without an operator (a
key/value cache's entry for that layer is not written), and behaviour that depends on the layer's
index at forward time with a period longer than two calls (``if self.layer_idx % 4 == 3`` in a
forward): such a model counts wrong layers as the first ones; a structure difference (an attribute
set in ``__init__``, as transformers does for sliding windows and no-RoPE layers) is seen.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident as _get_ident
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from flopscope.core.fake_memo import FAKE_MODES, same_size, template
from flopscope.core.ledger import Decomposed, Key, Ledger
from flopscope.core.memo import key_part as _key_part
from flopscope.core.tracker import ModuleTracker
from flopscope.core.unseen import unseen

_PLAIN = (int, float, bool, str, type(None))
_OWN_INDEX = object()  # an int attribute holding each member's index in its container
_FRESH = frozenset(nn.Module().__dict__)  # nn.Module's own attributes: not the model's
_CONTAINERS = (nn.ModuleList, nn.Sequential)
_MIN_GROUP = 3  # two calls to validate a key, the third and later replayed


def _index_names(module: nn.Module, index: int, prefix: str = "") -> set[str]:
    """Dotted names of the ``int`` attributes in ``module``'s subtree equal to ``index``."""
    found = {prefix + name for name, v in module.__dict__.items()
             if name not in _FRESH and type(v) is int and v == index}
    for name, child in module._modules.items():
        if child is not None:
            found |= _index_names(child, index, f"{prefix}{name}.")
    return found


def _structure(module: nn.Module, own: frozenset[str], prefix: str = "") -> tuple[Any, ...] | None:
    """A hashable description of what decides ``module``'s work besides its arguments, or
    ``None`` when it cannot be replayed (a hook, TorchScript). ``own``: dotted names of the
    attributes that hold the member's own index in its container (not compared)."""
    if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
            or module._backward_pre_hooks or isinstance(module, torch.jit.ScriptModule)):
        return None
    parts: list[Any] = [type(module), module.training]
    for group in (module._parameters, module._buffers):
        for name, t in group.items():
            parts.append((name, None if t is None else (
                type(t), tuple(t.shape), t.dtype, t.requires_grad, t.device.type)))
    for name, v in module.__dict__.items():
        if name in _FRESH:
            continue
        tv = type(v)
        if prefix + name in own:
            parts.append((name, _OWN_INDEX))
        elif tv in _PLAIN:
            parts.append((name, tv, v))
        elif (tv is tuple or tv is list) and all(type(x) in _PLAIN for x in v):
            parts.append((name, tv, tuple(v)))
        elif isinstance(v, torch.Tensor) and v.is_meta:
            parts.append((name, tuple(v.shape), v.stride(), v.dtype))
        else:  # a config, a function, a real tensor: the same object or not
            parts.append((name, id(v)))
    for name, child in module._modules.items():
        if child is None:
            parts.append((name, None))
            continue
        sub = _structure(child, own, f"{prefix}{name}.")
        if sub is None:
            return None
        parts.append((name, sub))
    return tuple(parts)


def candidates(model: nn.Module, shared: set[nn.Module]) -> dict[nn.Module, int]:
    """The modules that may be replayed -> their group: maximal members of module containers
    that share their structure with at least two others. An attribute that holds every member's
    own index (transformers' ``layer_idx``, here and in the attention below it) is not compared;
    one that equals a member's index by coincidence (``num_key_value_groups`` = 8 in layer 8) is."""
    groups: dict[tuple[Any, ...], list[nn.Module]] = {}

    def visit(module: nn.Module) -> None:
        members = [(int(name), child) for name, child in module._modules.items()
                   if isinstance(module, _CONTAINERS) and name.isdigit() and child is not None
                   and child not in shared]
        if members:
            own = frozenset.intersection(*(frozenset(_index_names(c, i)) for i, c in members))
            for _, child in members:
                key = _structure(child, own)
                if key is not None:
                    groups.setdefault(key, []).append(child)
        for sub in module._modules.values():
            if sub is not None:
                visit(sub)

    visit(model)
    found: dict[nn.Module, int] = {}
    for n, group in enumerate(groups.values()):
        if len(group) >= _MIN_GROUP:
            for m in group:
                found[m] = n
    # maximal only: drop candidates inside other candidates
    inner: set[nn.Module] = set()
    for m in found:
        for sub in m.modules():
            if sub is not m and sub in found:
                inner.add(sub)
    return {m: g for m, g in found.items() if m not in inner}


class _Take:
    """What one call of a module did, relative to its path."""

    __slots__ = ("_summed", "adds", "allocations", "arithmetic", "calls", "no_grad", "out")

    def __init__(self) -> None:
        self.adds: list[tuple[str, Any, Any, Any]] = []  # relative path, op key, phase, cost
        self.calls: dict[str, int] = {}  # relative module path -> calls
        self.no_grad: dict[str, int] = {}  # relative module path -> calls under no_grad
        self.arithmetic = 0
        self.allocations = 0
        self.out: Any = None  # (treespec, leaves: (fake mode, template, device, requires_grad)
        # or a plain value)
        self._summed: list[tuple[str, Any, Any, int, Any]] | None = None

    def summed(self) -> list[tuple[str, Any, Any, int, Any]]:
        """The adds per (relative path, op key, phase): (..., calls, summed cost), summed once (a
        layer calls ``view`` several times in one module: adding their symbolic costs on every
        replay would be SymInt arithmetic each time)."""
        if self._summed is None:
            sums: dict[tuple[str, Any, Any], list[Any]] = {}
            for rel, op, phase, cost in self.adds:
                entry = sums.get((rel, op, phase))
                if entry is None:
                    sums[(rel, op, phase)] = [1, cost]
                else:
                    entry[0] += 1
                    entry[1] = entry[1] + cost
            self._summed = [(*k, n, c) for k, (n, c) in sums.items()]
        return self._summed


def _same_take(a: _Take, b: _Take) -> bool:
    if (a.calls != b.calls or a.no_grad != b.no_grad or a.arithmetic != b.arithmetic
            or a.allocations != b.allocations or len(a.adds) != len(b.adds)):
        return False
    for (pa, ka, fa, ca), (pb, kb, fb, cb) in zip(a.adds, b.adds, strict=True):
        if pa != pb or ka != kb or fa is not fb:
            return False
        if ca is not cb and not all(same_size(getattr(ca, f), getattr(cb, f))
                                    for f in ("macs", "flops", "bytes_read", "bytes_written")):
            return False
    spec_a, leaves_a = a.out
    spec_b, leaves_b = b.out
    if spec_a != spec_b or len(leaves_a) != len(leaves_b):
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if type(x) is tuple and type(y) is tuple:
            ta, tb = x[1], y[1]
            if (x[0] is not y[0] or x[2] != y[2] or x[3] != y[3] or ta.dtype != tb.dtype
                    or ta.dim() != tb.dim()
                    or not all(same_size(p, q) for p, q in zip(
                        (*ta.shape, *ta.stride(), ta.storage_offset()),
                        (*tb.shape, *tb.stride(), tb.storage_offset()), strict=True))):
                return False
        elif type(x) is tuple or type(y) is tuple or not (x is y or x == y):
            return False
    return True


class _Made(torch.autograd.Function):
    """Makes a replayed output that requires grad the output of an autograd node, as the
    module's real output is: a leaf (or a view of one) that requires grad refuses the in-place
    operators a model may apply to it (``ReLU(inplace=True)`` after a block). No operator runs:
    the output is made from its template inside ``forward``."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, leaf: Any) -> torch.Tensor:
        return FakeTensor(leaf[0], leaf[1], leaf[2])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None  # pragma: no cover - replay runs only in counts without backward


with unseen():  # (made on import, which may happen inside a user's dispatch mode)
    _ANCHOR = torch.zeros((), requires_grad=True)  # what _Made's outputs depend on, for autograd


def _made(leaf: tuple[Any, Any, Any, bool]) -> torch.Tensor:
    """A fake tensor made again from an output leaf (see :func:`_output`)."""
    if leaf[3]:
        return _Made.apply(_ANCHOR, leaf)  # type: ignore[no-any-return]
    return FakeTensor(leaf[0], leaf[1], leaf[2])


def _output(out: Any) -> Any:
    """``out`` as (treespec, leaves) with fake tensors as templates, or ``None`` when it cannot be
    made again (a tensor that is not a symbolic count's plain fake tensor, an object)."""
    leaves, spec = tree_flatten(out)
    made: list[Any] = []
    for leaf in leaves:
        if type(leaf) is FakeTensor:
            entry = FAKE_MODES.get(id(leaf.fake_mode))
            tpl = template(leaf, entry[1]) if entry is not None else None
            if tpl is None:
                return None
            made.append((leaf.fake_mode, tpl, leaf.fake_device, leaf.requires_grad))
        elif type(leaf) in _PLAIN:
            made.append(leaf)
        else:
            return None
    return spec, made


class ModuleReplay:
    """Replays repeated module calls for one :class:`~flopscope.core.counter.Counter` (see the module
    docstring). ``install`` wraps the candidates' ``forward`` (an instance attribute, removed by
    ``remove``)."""

    def __init__(self, ledger: Ledger, tracker: ModuleTracker, model: nn.Module,
                 engine_state: Callable[[], tuple[Any, ...]], blocked: Callable[[], bool]) -> None:
        self.ledger = ledger
        self.tracker = tracker
        # what besides the ledger a call can change (Counter.engine_state): a layer whose calls
        # change it is not replayed; nor is any layer while `blocked()` (observers see calls, or
        # a DTensor operator runs)
        self.engine_state = engine_state
        self.blocked = blocked
        self.groups = candidates(model, tracker.shared)
        self.names: dict[nn.Module, dict[str, nn.Module]] = {}
        # (group, argument key) -> the first take and its module, or the validated take; a key
        # whose two takes differed maps to None, and a group that differed is in `bad`
        self.seen: dict[tuple[Any, ...], tuple[_Take, nn.Module] | _Take | None] = {}
        self.bad: set[int] = set()
        self.firsts: dict[int, list[tuple[_Take, nn.Module]]] = {}  # group -> first takes
        self.recording: _Take | None = None
        self.replayed = 0  # module calls answered from memory (for tests and benchmarks)
        self._saved: list[tuple[nn.Module, Any]] = []

    def install(self) -> None:
        for module in self.groups:
            self._saved.append((module, module.__dict__.get("forward", _MISSING)))
            module.forward = self._wrap(module, module.forward)

    def remove(self) -> None:
        for module, old in self._saved:
            if old is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = old
        self._saved = []

    def _wrap(self, module: nn.Module, forward: Any) -> Any:
        def forward_or_replay(*args: Any, **kwargs: Any) -> Any:
            return self._call(module, forward, args, kwargs)
        return forward_or_replay

    def _key(self, group: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        key: list[Any] = [group]
        if not _key_part(key, args) or not _key_part(key, kwargs):
            return None
        return tuple(key)

    def _call(self, module: nn.Module, forward: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        group = self.groups[module]
        st = self.tracker.main
        if (self.recording is not None or group in self.bad or self.blocked()
                or st.shadowing is not None
                or not st.stack or st.stack[-1].module is not module
                or self.tracker.owner != _get_ident()):
            return forward(*args, **kwargs)
        key = self._key(group, args, kwargs)
        if key is None:
            return forward(*args, **kwargs)
        frame = st.stack[-1]
        seen = self.seen.get(key, _MISSING)
        if isinstance(seen, _Take):
            return self._replay(module, frame, seen)
        if seen is None:
            return forward(*args, **kwargs)
        if seen is not _MISSING and seen[1] is module:  # the same module again: not a second one
            return forward(*args, **kwargs)
        take, out = self._record(module, frame, forward, args, kwargs)
        if take is None:
            self.bad.add(group)
        elif seen is _MISSING:
            # a first call of this key: validated already when another layer of the group did the
            # same on other arguments (layer 0 on the embeddings, which do not require grad, and
            # layer 1 on layer 0's output, which does)
            firsts = self.firsts.setdefault(group, [])
            if any(m is not module and _same_take(t, take) for t, m in firsts):
                self.seen[key] = take
            else:
                self.seen[key] = (take, module)
                firsts.append((take, module))
        elif _same_take(seen[0], take):
            self.seen[key] = take
        else:
            self.seen[key] = None
            self.bad.add(group)
        return out

    def _record(self, module: nn.Module, frame: Any, forward: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[_Take | None, Any]:
        """Run the forward, noting what it adds; the take is ``None`` when it cannot be replayed."""
        tracker = self.tracker
        prefix = frame.path
        names = self._names(module, prefix)
        take = _Take()
        ok = True

        def add(key: Key, cost: Any) -> None:
            nonlocal ok
            path, op, phase = key
            if path == prefix:
                rel = ""
            elif path.startswith(prefix) and path[len(prefix)] == ".":
                rel = path[len(prefix):]
            else:
                ok = False
                return
            if type(op) is str:  # a module rule's entry
                ok = False
            elif (op.facts if type(op) is Decomposed else op).reshaping:  # type: ignore[union-attr]
                ok = False  # metadata changed in place (an argument's, perhaps): not replayable
            take.adds.append((rel, op, phase, cost))

        calls = {rel: tracker.calls.get(p, 0) for rel, (p, _) in names.items()}
        no_grad = {rel: tracker.no_grad_modules.get(m, 0) for rel, (_, m) in names.items()}
        before = self.engine_state()
        arithmetic, allocations = frame.arithmetic, frame.allocations
        self.recording = take
        try:
            with self.ledger.listen(add):
                out = forward(*args, **kwargs)
        finally:
            self.recording = None
        take.arithmetic = frame.arithmetic - arithmetic
        take.allocations = frame.allocations - allocations
        for rel, (p, m) in names.items():
            n = tracker.calls.get(p, 0) - calls[rel]
            if n:
                take.calls[rel] = n
            n = tracker.no_grad_modules.get(m, 0) - no_grad[rel]
            if n:
                take.no_grad[rel] = n
        if self.engine_state() != before or self.blocked():
            ok = False
        take.out = _output(out) if ok else None
        return (take if ok and take.out is not None else None), out

    def _replay(self, module: nn.Module, frame: Any, take: _Take) -> Any:
        tracker = self.tracker
        prefix = frame.path
        names = self._names(module, prefix)
        add = self.ledger.add_calls
        for rel, op, phase, calls, cost in take.summed():
            add((prefix + rel, op, phase), calls, cost)
        for rel, n in take.calls.items():
            p = names[rel][0]
            tracker.calls[p] = tracker.calls.get(p, 0) + n
        for rel, n in take.no_grad.items():
            m = names[rel][1]
            tracker.no_grad_modules[m] = tracker.no_grad_modules.get(m, 0) + n
        frame.arithmetic += take.arithmetic
        frame.allocations += take.allocations
        self.replayed += 1
        spec, leaves = take.out
        return tree_unflatten([_made(x) if type(x) is tuple else x for x in leaves], spec)

    def _names(self, module: nn.Module, prefix: str) -> dict[str, tuple[str, nn.Module]]:
        """The modules below ``module``: path relative to it (``".mlp"``) -> (full path, module);
        their calls are what the tracker's hooks count inside a call of ``module``."""
        names = self.names.get(module)
        if names is None:
            names = self.names[module] = {"." + n: m for n, m in module.named_modules() if n}
        return {rel: (prefix + rel, m) for rel, m in names.items()}


_MISSING: Any = object()
