"""The two value types every rule deals in: :class:`OpCall` (what ran) and :class:`Cost` (what it cost).

Costs are plain integers. ``flops`` is the *total* number of floating-point operations and already
includes ``2 * macs``; human units (K/M/G) appear only in renderers.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_iter

from flopscope.core.facts import facts

__all__ = ["SYMBOLIC_COUNTS", "VALUE_READS", "Cost", "OpCall", "Phase", "nested_parts", "note_value_read",
           "tensor_bytes"]


class Phase(str, enum.Enum):
    """When an operator ran.

    - ``FORWARD``: a forward computation (and any work outside ``backward()`` and
      ``optimizer.step()``, such as a functional loss);
    - ``BACKWARD``: inside ``backward()`` / ``torch.autograd.grad``, charged to the module whose
      forward built the autograd node;
    - ``RECOMPUTE``: a forward run again inside backward by activation checkpointing
      (``torch.utils.checkpoint``), charged to the recomputed module. Model FLOPs leave it out;
      hardware FLOPs include it;
    - ``OPTIMIZER``: inside ``step()`` of a ``torch.optim.Optimizer``.
    """

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True, slots=True)
class Cost:
    """What one or more operator calls cost. All fields are non-negative integers; costs add.

    Under symbolic shapes (:mod:`flopscope.symbolic`) a field may be a ``torch.SymInt``: a formula
    in the symbolic sizes, which adds and multiplies like an integer.

    Raises:
        TypeError: a field is not an ``int`` (a ``bool``, ``float`` or string is refused).
        ValueError: a field is negative.

    Attributes:
        macs: multiply-accumulates (sums of products only: matmul, convolution, attention products).
        flops: every floating-point operation, including ``2 * macs``.
        bytes_read: bytes of tensor inputs read.
        bytes_written: bytes of tensor outputs written.
    """

    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __post_init__(self) -> None:
        # one chained identity test on the common path (about 0.1 us; see benchmarks/hotpath.py)
        if not (type(self.macs) is type(self.flops) is type(self.bytes_read)
                is type(self.bytes_written) is int):
            symbolic = False
            for name in ("macs", "flops", "bytes_read", "bytes_written"):
                value = getattr(self, name)
                if type(value) is _SymInt:  # symbolic shapes (flopscope.symbolic.count): a formula
                    symbolic = True
                elif type(value) is not int:
                    raise TypeError(
                        f"Cost.{name} must be an int, not {value!r} ({type(value).__name__})"
                    )
            if symbolic:  # the sign of a formula is not tested (that would add a guard)
                for name in ("macs", "flops", "bytes_read", "bytes_written"):
                    value = getattr(self, name)
                    if type(value) is int and value < 0:
                        raise ValueError(f"Cost.{name} must not be negative, got {value}")
                return
        if (self.macs | self.flops | self.bytes_read | self.bytes_written) < 0:  # any negative
            for name in ("macs", "flops", "bytes_read", "bytes_written"):
                if getattr(self, name) < 0:
                    raise ValueError(f"Cost.{name} must not be negative, got {getattr(self, name)}")

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            self.macs + other.macs,
            self.flops + other.flops,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
        )

    def __mul__(self, times: int) -> Cost:
        if not isinstance(times, int):
            return NotImplemented
        return Cost(
            self.macs * times,
            self.flops * times,
            self.bytes_read * times,
            self.bytes_written * times,
        )

    __rmul__ = __mul__

    @property
    def bytes(self) -> int:
        """Bytes moved: read plus written."""
        return self.bytes_read + self.bytes_written

    @classmethod
    def from_macs(cls, macs: int, extra_flops: int = 0) -> Cost:
        """A cost of ``macs`` multiply-accumulates plus ``extra_flops`` other operations."""
        return cls(macs=macs, flops=2 * macs + extra_flops)

    def to_dict(self) -> dict[str, int]:
        """The four integers by name."""
        return {
            "macs": self.macs,
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor's elements (``numel * itemsize``); works for fake and meta tensors. A
    sparse tensor's bytes are those of its stored values and indices (what a kernel reads), a
    nested tensor's those of its components; a tensor with symbolic sizes gives a symbolic
    number (``SymInt``)."""
    layout = t.layout
    if layout is torch.sparse_coo:
        return tensor_bytes(t._values()) + tensor_bytes(t._indices())
    if layout in _COMPRESSED:
        compressed, plain = ((t.crow_indices(), t.col_indices())
                             if layout in (torch.sparse_csr, torch.sparse_bsr)
                             else (t.ccol_indices(), t.row_indices()))
        return tensor_bytes(t.values()) + tensor_bytes(compressed) + tensor_bytes(plain)
    if t.is_nested:
        try:
            return sum(tensor_bytes(c) for c in t.unbind())
        except RuntimeError:
            return 0
    return t.numel() * t.element_size()


_SymInt = torch.SymInt
# how many symbolic counts (flopscope.symbolic.count) are running: while any is, bytes are measured with
# tensor_bytes (numel * itemsize, SymInt-safe) instead of trying .nbytes first; correct for every
# tensor, only slower, so a concrete count in another thread meanwhile gives the same numbers
SYMBOLIC_COUNTS = [0]
# how many times a rule has read a tensor's values (note_value_read): a call whose rule read values
# is never remembered by its metadata (flopscope.core.cost_memo)
VALUE_READS = [0]
_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def note_value_read() -> None:
    """Say that a rule is reading a tensor's values (offsets, lengths, targets, boxes), not only
    its metadata: the cost of this call then depends on more than its arguments' shapes and is
    not remembered for later calls of the same shapes. Every default rule that reads values calls
    it (through :func:`flopscope.rules._shapes.tensor_values` or directly)."""
    VALUE_READS[0] += 1


_Tensor = torch.Tensor
_SCALARS = frozenset({int, float, bool, str, complex, type(None), torch.dtype, torch.device,
                      torch.layout, torch.memory_format})


def _collect(tree: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    """Append every tensor in ``tree`` to ``found``, in pytree order.

    The same leaves as ``tree_iter`` would give, without its per-leaf node-type lookups: operator
    arguments are almost always flat tuples of tensors and scalars, and this runs on every call.
    """
    if isinstance(tree, _Tensor):
        found.append(tree)
        return found
    kind = type(tree)
    if kind is tuple or kind is list:
        for leaf in tree:
            if isinstance(leaf, _Tensor):
                found.append(leaf)
            elif type(leaf) not in _SCALARS:
                _collect(leaf, found)
    elif kind is dict:
        for leaf in tree.values():
            _collect(leaf, found)
    elif kind not in _SCALARS:  # any other pytree node (named tuples, torch.Size, ...)
        found.extend(leaf for leaf in tree_iter(tree) if isinstance(leaf, _Tensor))
    return found


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    return iter(_collect(tree, []))


class OpCall:
    """One operator invocation, as a rule sees it.

    Attributes:
        op: the ATen (or custom) operator overload that ran, e.g. ``torch.ops.aten.mm.default``.
        args: positional arguments as the dispatcher passed them (tensors are real, fake or meta;
            only their metadata should be read).
        kwargs: keyword arguments as the dispatcher passed them.
        out: the operator's return value.
        phase: :class:`Phase` of the call.
    """

    __slots__ = ("op", "args", "kwargs", "out", "phase", "is_view")

    def __init__(
        self,
        op: torch._ops.OpOverload,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        phase: Phase = Phase.FORWARD,
        is_view: bool = False,
    ) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.out = out
        self.phase = phase
        self.is_view = is_view

    @property
    def name(self) -> str:
        """The operator's qualified name, e.g. ``"aten.mm.default"``."""
        return str(self.op)

    def arg(self, index: int, name: str, default: Any = None) -> Any:
        """An argument by position, falling back to its keyword name, then to ``default``."""
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)

    @property
    def inputs(self) -> list[torch.Tensor]:
        """Every tensor among the arguments, flattened (lists of tensors included)."""
        found = _collect(self.args, [])
        return _collect(self.kwargs, found) if self.kwargs else found

    @property
    def outputs(self) -> list[torch.Tensor]:
        """Every tensor in the return value, flattened."""
        return _collect(self.out, [])

    @property
    def output(self) -> torch.Tensor:
        """The first output tensor (most operators return exactly one)."""
        out = self.out
        if isinstance(out, _Tensor):
            return out
        for t in _collect(out, []):
            return t
        raise ValueError(f"{self.name} returned no tensor")

    def out_numel(self) -> int:
        """Elements of the first output tensor."""
        return self.output.numel()

    def input_shapes(self) -> list[Any]:
        """The inputs' shapes, for messages (a strided nested tensor has none: its component
        count instead)."""
        return [f"nested({t.size(0)})" if t.is_nested else tuple(t.shape) for t in self.inputs]

    def io_bytes(self) -> tuple[int, int]:
        """``(bytes_read, bytes_written)``: all tensor inputs read once, all outputs written once
        (an operator that returns nothing, its written arguments: ``_foreach_mul_``).

        A view (an output that aliases an input without writing it) moves no bytes. Sparse,
        nested and symbolically sized tensors are measured by :func:`tensor_bytes`.
        """
        if self.is_view:
            return 0, 0
        if SYMBOLIC_COUNTS[0]:  # symbolic sizes: .nbytes would raise (slowly, with a C++ trace)
            read = sum(tensor_bytes(t) for t in self.inputs)
            return read, sum(tensor_bytes(t) for t in self._written())
        try:
            return self._io_bytes()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse / nested / symbolic
            read = sum(tensor_bytes(t) for t in self.inputs)
            return read, sum(tensor_bytes(t) for t in self._written())

    def _written(self) -> list[torch.Tensor]:
        """The tensors the call writes: its outputs; where its schema returns nothing, the
        arguments it marks written (:attr:`~flopscope.core.facts.OpFacts.void_written`)."""
        found = _collect(self.out, [])
        if found or (self.out is not None and not isinstance(self.out, (tuple, list))):
            return found
        for i, name in facts(self.op).void_written:
            value = self.args[i] if i < len(self.args) else self.kwargs.get(name)
            _collect(value, found)
        return found

    def _io_bytes(self) -> tuple[int, int]:
        read = 0
        args = self.args
        layout = facts(self.op).layout
        if layout is None:
            for t in _collect(args, []):
                read += t.nbytes
        else:
            n = len(args)
            single, lists = layout
            for i in single:
                if i < n:
                    t = args[i]
                    if isinstance(t, _Tensor):  # a Tensor argument can arrive as a Python number
                        read += t.nbytes
            for i in lists:
                if i < n:
                    for t in args[i] or ():
                        if isinstance(t, _Tensor):
                            read += t.nbytes
        if self.kwargs:
            for t in _collect(self.kwargs, []):
                read += t.nbytes
        out = self.out
        if isinstance(out, _Tensor):
            return read, out.nbytes
        written = 0
        for t in self._written():
            written += t.nbytes
        return read, written

    def cost(self, macs: int = 0, flops: int | None = None) -> Cost:
        """A :class:`Cost` for this call with the default byte traffic (see :meth:`io_bytes`).

        Args:
            macs: multiply-accumulates.
            flops: total floating-point operations; defaults to ``2 * macs``.

        Returns:
            The cost, with ``bytes_read``/``bytes_written`` from :meth:`io_bytes`.
        """
        read, written = self.io_bytes()
        return Cost(macs, 2 * macs if flops is None else flops, read, written)

    def __repr__(self) -> str:
        shapes = [tuple(t.shape) for t in self.inputs]
        return f"OpCall({self.name}, inputs={shapes}, phase={self.phase.value})"


def _part(value: Any, i: int) -> Any:
    if isinstance(value, _Tensor) and value.is_nested:
        return value.unbind()[i]
    if type(value) is tuple or type(value) is list:
        return type(value)(_part(v, i) for v in value)
    return value


def nested_parts(call: OpCall) -> list[OpCall] | None:
    """A call on strided nested tensors as one call per component (the i-th component of every
    nested argument and output, other arguments as they are), or ``None`` when no argument is
    nested. Rules written for dense tensors cost a nested call as the sum of its parts."""
    count = next((t.size(0) for t in call.inputs if t.is_nested), None)
    if count is None:
        return None
    return [OpCall(call.op, _part(call.args, i), {k: _part(v, i) for k, v in call.kwargs.items()},
                   _part(call.out, i), call.phase, call.is_view) for i in range(count)]

