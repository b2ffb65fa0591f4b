"""Running a model that lives on the ``meta`` device as if it were on the CPU.

A model on ``meta`` is counted by calling it with ``meta`` tensors: PyTorch's meta kernels compute
every output's shape in C++ and nothing else, which is the cheapest way to run a 70B-parameter model
shape-only. Two kinds of code decide *which* operators run from the device, and on ``meta`` they
would choose differently from a real CPU run:

- ``scaled_dot_product_attention`` picks its backend from the device in C++: on the CPU the fused
  flash kernel (``_scaled_dot_product_flash_attention_for_cpu``), on ``meta`` always the unfused
  math form (two matmuls and a softmax). :func:`sdpa_as_cpu` settles that: for the duration of a
  count it registers a kernel for the operator on the ``AutogradMeta`` dispatch key which asks the
  CPU what it would run (by running the operator once on fake CPU tensors with the same metadata
  and recording the operators that reach the dispatcher), then replays those operators on the meta
  tensors, through the whole dispatcher, so autograd and the counter see exactly the CPU's calls.
  The recording is cached per argument metadata (80 identical decoder layers probe once).
- ``_grouped_mm`` (mixture-of-experts layers, transformers' default experts implementation) runs
  in float32 on the CPU, but its meta kernel accepts only bfloat16/float16 (the CUDA kernel's
  limits), so a float32 MoE model could not be counted shape-only. :func:`grouped_mm_as_cpu`
  lets the meta kernel take float32 as the CPU does (for a count's duration), inside the kernel,
  where no dispatch mode sees it: the counter sees the float32 call the CPU would run.
- ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` choose their fused "fast path" in
  Python, only for tensors on the CPU or an accelerator. :func:`needs_fake_cpu` says when a model
  holds such a module; such models are run as fake CPU tensors instead (slower, same counts).

Fake CPU tensors themselves come from :class:`ShapeOnlyFakeMode`: PyTorch's fake mode, in which
an assertion on values (``torch._check_tensor_all``) holds, since a shape-only count has no values
to check (a real run raises where it fails), and in which a sparse tensor keeps its number of
stored entries, which a sparse product's cost depends on: PyTorch's meta and fake conversions
make every sparse COO tensor empty (:func:`meta_sparse`, :func:`to_fake`; operators that keep
their input's entries, such as the transpose in a sparse product's backward, keep them too).
An input that holds sizes (a ``PackedSequence``'s batch sizes) stays as it is (:func:`fake_input`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["ShapeOnlyFakeMode", "constant_input", "fake_sparse", "grouped_mm_as_cpu", "holds_sizes", "is_sparse",
           "meta_sparse", "needs_fake_cpu", "sdpa_as_cpu", "sparse_fake"]

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_CPU = torch.device("cpu")
_META = torch.device("meta")
_DEVICE = object()  # in a recorded program: "the device the program runs on"
# modules whose forward takes a fused path only for tensors on a real device (checked in Python)
_DEVICE_CHOSEN_PATHS = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder)


# the tensor form of torch._check: whether every (any) element is true, read with .item()
_VALUE_CHECKS = frozenset({torch.ops.aten._is_all_true.default, torch.ops.aten._is_any_true.default})
_aten = torch.ops.aten
# operators whose sparse COO output stores the entries of their (first) sparse COO input
_SAME_ENTRIES = frozenset({
    _aten.t.default, _aten.transpose.int, _aten.permute.default, _aten.clone.default,
    _aten.detach.default, _aten.alias.default, _aten._to_copy.default, _aten.neg.default,
    _aten.mul.Scalar, _aten.div.Scalar, _aten.relu.default, _aten.abs.default,
})


class ShapeOnlyFakeMode(FakeTensorMode):
    """PyTorch's fake tensor mode for a shape-only count, in which assertions on values hold.

    ``torch._check_tensor_all(cond)`` (transformers' ``torch_compilable_check``) reads
    ``cond._is_all_true().item()``: a value, which fake tensors do not have, so every shape-only
    count of such a model failed. Here a check on a tensor whose value is unknown answers a
    constant ``True`` (the check passes; a check on constants is computed as PyTorch does).
    Assertions cost nothing (rule ``assertion``), so the count equals the real run's wherever
    the real run does not raise.
    """

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _VALUE_CHECKS and isinstance(args[0], FakeTensor) and args[0].constant is None:
            return self.fake_tensor_converter.from_real_tensor(
                self, torch.ones((), dtype=torch.bool), make_constant=True)
        out = super().dispatch(func, types, args, kwargs)
        if (type(out) is FakeTensor and out.layout is torch.sparse_coo and func in _SAME_ENTRIES
                and isinstance(args[0], torch.Tensor) and args[0].layout is torch.sparse_coo):
            # (the input: a fake tensor, or a real one that this mode converts, such as a
            # model's sparse buffer saved for backward)
            return self._with_entries(out, args[0]._nnz())
        return out

    def _with_entries(self, out: FakeTensor, nnz: int) -> FakeTensor:
        """``out`` (a sparse COO fake tensor, which fake kernels make empty) with ``nnz`` stored
        entries: the output of an operator that keeps its input's entries where they are or
        moves them (``t``, ``clone``, ``neg``, ...), such as the transpose in the backward of a
        sparse product."""
        if nnz == out._nnz():
            return out
        sparse_dim = out.sparse_dim()
        indices = torch.empty((sparse_dim, nnz), dtype=torch.int64, device=_META)
        values = torch.empty((nnz, *out.shape[sparse_dim:]), dtype=out.dtype, device=_META)
        made = torch.sparse_coo_tensor(indices, values, out.shape, is_coalesced=out.is_coalesced(),
                                       check_invariants=False)
        return FakeTensor(self, made, out.device)


def needs_fake_cpu(modules: list[nn.Module]) -> bool:
    """Whether a ``meta`` model must run as fake CPU tensors to take the CPU's code paths."""
    return any(isinstance(m, _DEVICE_CHOSEN_PATHS) for m in modules)


def meta_sparse(t: torch.Tensor) -> torch.Tensor:
    """A sparse tensor on ``meta`` with ``t``'s layout, sizes and number of stored entries: a
    sparse product costs one MAC per stored entry and column, and PyTorch's conversions of a
    sparse COO tensor (``.to("meta")``, ``empty_like``, fake tensors) make it empty (its indices
    and values are made meta here instead; compressed layouts keep theirs in ``empty_like``)."""
    if t.layout is torch.sparse_coo:
        made = torch.sparse_coo_tensor(t._indices().to("meta"), t._values().to("meta"), t.shape,
                                       is_coalesced=t.is_coalesced(), check_invariants=False)
    else:
        made = torch.empty_like(t, device="meta")
    return made.requires_grad_(t.requires_grad)


_SPARSE_LAYOUTS = frozenset({torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                             torch.sparse_bsc})


def is_sparse(t: torch.Tensor) -> bool:
    """Whether ``t`` has a sparse layout (COO or compressed)."""
    return t.layout in _SPARSE_LAYOUTS


# fake mode -> real tensor -> its fake (a sparse tensor's, an input's that holds sizes): each
# made once per mode, and kept while both live (the converter's own memo, which a real tensor met
# inside the run is looked up in, holds its fakes weakly)
_KEPT_FAKES: weakref.WeakKeyDictionary[Any, WeakIdKeyDictionary] = weakref.WeakKeyDictionary()


def holds_sizes(t: torch.Tensor) -> bool:
    """Whether an input tensor holds sizes rather than data: a 1-D integer tensor on the CPU (a
    ``PackedSequence``'s batch sizes and its sorting indices, sequence lengths), which kernels
    read on the host and models read with ``.item()``. A shape-only count keeps it as it is."""
    return (t.dim() == 1 and t.device.type == "cpu" and t.layout is torch.strided
            and not t.dtype.is_floating_point and not t.dtype.is_complex
            and t.dtype is not torch.bool and not isinstance(t, FakeTensor))


def constant_input(fake_mode: Any, t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, made a constant of ``fake_mode`` (once per mode, kept while both live):
    where the run reads it in Python the mode knows its values.

    Args:
        fake_mode: the fake mode of the run.
        t: a real tensor.

    Returns:
        ``t``.
    """
    known = _KEPT_FAKES.setdefault(fake_mode, WeakIdKeyDictionary())
    if t not in known:
        known[t] = fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, t,
                                                                    make_constant=True)
    return t


def sparse_fake(fake_mode: Any, t: torch.Tensor) -> torch.Tensor:
    """A sparse tensor as a fake tensor with its stored entries (see :func:`meta_sparse`)."""
    known = _KEPT_FAKES.setdefault(fake_mode, WeakIdKeyDictionary())
    fake = known.get(t)
    if fake is None:
        fake = FakeTensor(fake_mode, t if t.is_meta else meta_sparse(t),
                          _CPU if t.is_meta else t.device)
        if not t.is_meta:  # the same fake where the run meets t itself (a model's buffer)
            fake_mode.fake_tensor_converter.set_tensor_memo(t, fake)
        known[t] = fake
    return fake  # type: ignore[no-any-return]


def fake_sparse(fake_mode: Any, modules: list[nn.Module]) -> None:
    """Make the sparse parameters and buffers of a real model's ``modules`` fake tensors of
    ``fake_mode`` now, with their stored entries, so that a shape-only run that meets them (as
    the model's own tensors, which the mode converts itself) uses those."""
    for m in modules:
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None and is_sparse(t):
                sparse_fake(fake_mode, t)


@dataclass(frozen=True)
class _Slot:
    """A tensor in a recorded program: an input of the call, or an output of an earlier step."""

    index: int


@dataclass(frozen=True)
class _Program:
    """The operators one call ran on the CPU, with tensors replaced by slots."""

    steps: tuple[tuple[Any, Any, Any], ...]  # (operator, args template, kwargs template)
    result: Any

    def run(self, inputs: list[torch.Tensor]) -> Any:
        values: list[Any] = list(inputs)

        def get(x: Any) -> Any:
            if isinstance(x, _Slot):
                return values[x.index]
            return _META if x is _DEVICE else x

        for func, args, kwargs in self.steps:
            out = func(*tree_map(get, args), **tree_map(get, kwargs))
            values.extend(t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return tree_map(get, self.result)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[tuple[Any, Any, Any, Any]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


def _signature(leaves: list[Any]) -> tuple[Any, ...]:
    sig: list[Any] = [torch.is_grad_enabled()]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            sig.append((tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.requires_grad))
        else:
            sig.append((type(x), x))
    return tuple(sig)


def _record_on_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Program | None:
    """Run the operator once on fake CPU tensors like the meta ones; its calls as a program."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with _disable_current_modes():  # an active counter must not see the probe
        fake_mode = FakeTensorMode()
        convert = fake_mode.fake_tensor_converter
        leaves, spec = tree_flatten((args, kwargs))
        fakes = [convert.from_meta_and_device(fake_mode, x, _CPU)
                 if isinstance(x, torch.Tensor) else x for x in leaves]
        fake_args, fake_kwargs = spec.unflatten(fakes)
        recorder = _Recorder()
        # without grad: the recorder sits below autograd and would also record what autograd does
        # around each call (detaching saved outputs), which the replay's own autograd does again
        with fake_mode, recorder, torch.no_grad():
            out = _SDPA(*fake_args, **fake_kwargs)
    slots: dict[int, int] = {}
    count = 0
    for t in fakes:
        if isinstance(t, torch.Tensor):
            slots.setdefault(id(t), count)  # the same tensor passed twice keeps its first slot
            count += 1

    def template(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return _Slot(slots[id(x)])  # KeyError: a tensor from outside the dispatcher
        if isinstance(x, torch.device) and x.type == "cpu":
            return _DEVICE  # tensors the CPU made (a mask's fill value) are made on meta
        return x

    steps = []
    try:
        for func, a, k, o in recorder.calls:
            if func.namespace == "prim":
                continue  # fake tensors' metadata queries (prim::device), not the CPU's work
            steps.append((func, tree_map(template, a), tree_map(template, k)))
            for t in tree_flatten(o)[0]:
                if isinstance(t, torch.Tensor):
                    slots[id(t)] = count
                    count += 1
        return _Program(tuple(steps), tree_map(template, out))
    except KeyError:
        return None


# the override's activations (nested and in several threads: one registration) and its library
_SDPA_LOCK = threading.Lock()
_SDPA_ACTIVE: list[Any] = [0, None]  # depth, the torch.library.Library holding the kernel


@contextmanager
def sdpa_as_cpu() -> Iterator[None]:
    """Within the block, ``scaled_dot_product_attention`` on meta tensors runs what the CPU runs.

    The kernel is registered on ``AutogradMeta`` for the block only (removed when the outermost
    block, of any thread, exits); under ``torch.inference_mode`` autograd keys are skipped and
    the meta math form runs instead. Every :class:`~flopscope.Counter` is such a block.
    """
    with _SDPA_LOCK:
        if not _SDPA_ACTIVE[0]:
            _SDPA_ACTIVE[1] = _sdpa_override()
        _SDPA_ACTIVE[0] += 1
    try:
        with grouped_mm_as_cpu():
            yield
    finally:
        with _SDPA_LOCK:
            _SDPA_ACTIVE[0] -= 1
            if not _SDPA_ACTIVE[0]:
                _SDPA_ACTIVE[1]._destroy()
                _SDPA_ACTIVE[1] = None


def _sdpa_override() -> Any:
    """A temporary library registering the replaying kernel (see :func:`sdpa_as_cpu`)."""
    programs: dict[tuple[Any, ...], _Program | None] = {}

    def kernel(*args: Any, **kwargs: Any) -> Any:
        leaves = tree_flatten((args, kwargs))[0]
        key = _signature(leaves)
        if key not in programs:
            try:
                programs[key] = _record_on_cpu(args, kwargs)
            except Exception:  # the probe is an optimisation of fidelity; never fail a count on it
                programs[key] = None
        program = programs[key]
        if program is None:
            return _SDPA.decompose(*args, **kwargs)
        return program.run([x for x in leaves if isinstance(x, torch.Tensor)])

    lib = torch.library.Library("aten", "IMPL")  # a temporary override, destroyed on exit
    try:
        lib.impl("scaled_dot_product_attention", kernel, "AutogradMeta")
    except BaseException:
        lib._destroy()
        raise
    return lib


@contextmanager
def grouped_mm_as_cpu() -> Iterator[None]:
    """Within the block, the meta kernel of ``_grouped_mm`` accepts float32 operands as the CPU
    kernel does (the output float32 unless ``out_dtype`` says otherwise): the check is made on
    bfloat16 stand-ins of the same shapes and strides, inside the kernel. Nothing changes where
    torch has no such meta function (older versions: their check, if any, stays)."""
    registrations = torch._meta_registrations
    original = getattr(registrations, "_meta_grouped_mm_common", None)
    if original is None or getattr(original, "_flopscope_cpu", False):
        yield
        return

    def common(mat_a: Any, mat_b: Any, *args: Any, **kwargs: Any) -> Any:
        plain = not args and kwargs.get("scale_a") is None and kwargs.get("scale_b") is None
        if not (plain and mat_a.dtype == torch.float32 and mat_b.dtype == torch.float32):
            return original(mat_a, mat_b, *args, **kwargs)
        wanted = kwargs.get("out_dtype") or torch.float32
        kwargs["out_dtype"] = None
        bias = kwargs.get("bias")
        if bias is not None and bias.dtype == torch.float32:
            kwargs["bias"] = bias.to(torch.bfloat16)
        out = original(mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16), *args, **kwargs)
        return out.to(wanted)

    common._flopscope_cpu = True  # type: ignore[attr-defined]
    registrations._meta_grouped_mm_common = common
    try:
        yield
    finally:
        registrations._meta_grouped_mm_common = original
