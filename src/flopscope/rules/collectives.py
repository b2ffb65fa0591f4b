"""Collectives and point-to-point communication (``torch.distributed``): functional collectives
(``_c10d_functional``, ``_c10d_functional_autograd``, ``_dtensor``) and the process-group operators
(``c10d``), synchronous and asynchronous.

**0 FLOPs**: the additions of a reducing collective (all-reduce, reduce-scatter, reduce) run in the
communication library, not in the model's kernels, and are left out of FLOPs as torch's
FlopCounterMode and MFU conventions do. Bytes are the local memory traffic of the call (inputs read,
outputs written). What a collective *sends* is reported apart, in ``Report.communication``
(:func:`communication`): per call its kind, the group size n, the **payload** S (bytes per rank,
as NCCL's tests define it: the reduced tensor for all-reduce and reduce, the gathered (output)
tensor for all-gather and gather, the input for reduce-scatter, all-to-all and scatter's input
list, the tensor for broadcast, send and recv) and the **bus bytes** per rank under the ring
algorithm: all-reduce 2(n-1)/n x S; all-gather, reduce-scatter, all-to-all, gather, scatter
(n-1)/n x S; broadcast, reduce, send, recv 1 x S; barrier 0 (integer floor). ``wait_tensor`` and
``_wrap_tensor_autograd`` move nothing and are free.

**Time** (:func:`copy_bytes`): a collective's own kernel (NCCL's, gloo's) reads and writes
its local buffers while it sends: that is the collective's time on its link
(:mod:`flopscope.estimate.comm_time`, measured end to end), not a memory-bound call's. Only
the out-of-place functional all-reduce and broadcast (``_c10d_functional.all_reduce``,
``all_reduce_coalesced``, ``broadcast``) run a kernel of their own besides: they copy their
input (``clone``) and then run in place, so their local bytes are that copy's. The roofline log
(:class:`flopscope.estimate.CallLog`) charges a collective call those bytes and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any, NamedTuple

import torch

from flopscope.cost import Cost, OpCall, tensor_bytes
from flopscope.rules.registry import rule

__all__ = ["BUS_FACTORS", "CommCall", "communication", "copy_bytes", "group_name",
           "is_collective"]

#: Ring-algorithm bus bytes per payload byte, as a function of the group size n.
BUS_FACTORS: dict[str, Callable[[int], Fraction]] = {
    "all_reduce": lambda n: Fraction(2 * (n - 1), n),
    "all_gather": lambda n: Fraction(n - 1, n),
    "reduce_scatter": lambda n: Fraction(n - 1, n),
    "all_to_all": lambda n: Fraction(n - 1, n),
    "gather": lambda n: Fraction(n - 1, n),
    "scatter": lambda n: Fraction(n - 1, n),
    "broadcast": lambda n: Fraction(1),
    "reduce": lambda n: Fraction(1),
    "send": lambda n: Fraction(1),
    "recv": lambda n: Fraction(1),
    "barrier": lambda n: Fraction(0),
}

NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "_dtensor", "c10d"})


class CommCall(NamedTuple):
    """What one collective call sends, per rank.

    Attributes:
        kind: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``,
            ``reduce``, ``gather``, ``scatter``, ``send``, ``recv`` or ``barrier``.
        group_size: ranks in the process group (n).
        payload_bytes: S, as defined in this module's docstring.
        bus_bytes: S times the ring algorithm's factor for ``kind`` and n (floored).
        group: which group (:func:`group_name`: a device mesh's dimension, ``world``).
    """

    kind: str
    group_size: int
    payload_bytes: int
    bus_bytes: int
    group: str = ""

    @property
    def group_key(self) -> tuple[int, str]:
        """``(group_size, group)``."""
        return self.group_size, self.group


def _bytes(tree: Any) -> int:
    """Bytes of every tensor in a (nested) list or a tensor."""
    if isinstance(tree, torch.Tensor):
        return int(tensor_bytes(tree))
    if isinstance(tree, (list, tuple)):
        return sum(_bytes(t) for t in tree)
    return 0


def _process_group(group: Any) -> Any:
    """A process group given as a group name (functional collectives) or an object."""
    from torch.distributed import ProcessGroup, distributed_c10d

    if isinstance(group, torch.ScriptObject):  # a process group as the dispatcher passes it
        group = ProcessGroup.unbox(group)
    if hasattr(group, "size") and not isinstance(group, str):
        return group
    resolve = getattr(distributed_c10d, "_resolve_process_group")  # noqa: B009  (not exported)
    return resolve(group)


def _group_size(group: Any) -> int:
    """The size of a process group given as a group name or an object."""
    return int(_process_group(group).size())


def group_name(group: Any) -> str:
    """Which process group a collective ran over, by its description: a device mesh names its
    dimensions' groups ``mesh_<dimension>`` (``init_device_mesh``), given here as the
    dimension (``tp``, ``dp``, ``pp`` ...); the default group is ``world`` (a mesh dimension
    that spans the world gets it unless the mesh is made with a backend per dimension, as
    :func:`flopscope.distributed.layout.named_mesh` does).

    Args:
        group: a process group, or its name.

    Returns:
        The name (``""`` when the group has no description).
    """
    desc = str(getattr(_process_group(group), "group_desc", "") or "")
    if desc == "default_pg":
        return "world"
    return desc.removeprefix("mesh_")


# op name -> (kind, index of the group argument, payload from the call)
_Payload = Callable[[OpCall, int], int]
_TABLE: dict[str, tuple[str, int, _Payload]] = {}


def _arg(i: int) -> _Payload:
    return lambda call, n: _bytes(call.args[i])


def _times_n(i: int) -> _Payload:
    return lambda call, n: n * _bytes(call.args[i])


def _out(call: OpCall, n: int) -> int:
    return _bytes(call.out)


for _ns in ("_c10d_functional", "_c10d_functional_autograd"):
    _TABLE.update({
        f"{_ns}::all_reduce": ("all_reduce", 2, _arg(0)),
        f"{_ns}::all_reduce_": ("all_reduce", 2, _arg(0)),
        f"{_ns}::all_reduce_coalesced": ("all_reduce", 2, _arg(0)),
        f"{_ns}::all_reduce_coalesced_": ("all_reduce", 2, _arg(0)),
        f"{_ns}::all_gather_into_tensor": ("all_gather", 2, _times_n(0)),
        f"{_ns}::all_gather_into_tensor_out": ("all_gather", 2, _times_n(0)),
        f"{_ns}::all_gather_into_tensor_coalesced": ("all_gather", 2, _times_n(0)),
        f"{_ns}::reduce_scatter_tensor": ("reduce_scatter", 3, _arg(0)),
        f"{_ns}::reduce_scatter_tensor_out": ("reduce_scatter", 3, _arg(0)),
        f"{_ns}::reduce_scatter_tensor_coalesced": ("reduce_scatter", 3, _arg(0)),
        f"{_ns}::all_to_all_single": ("all_to_all", 3, _arg(0)),
        f"{_ns}::broadcast": ("broadcast", 2, _arg(0)),
        f"{_ns}::broadcast_": ("broadcast", 2, _arg(0)),
        f"{_ns}::isend": ("send", 3, _arg(0)),
        f"{_ns}::irecv": ("recv", 3, _arg(0)),
    })
_TABLE.update({
    "_dtensor::shard_dim_alltoall": ("all_to_all", 3, _arg(0)),
    "c10d::allreduce_": ("all_reduce", 1, _arg(0)),
    "c10d::allreduce_coalesced_": ("all_reduce", 1, _arg(0)),
    "c10d::allgather_": ("all_gather", 2, _arg(0)),
    "c10d::_allgather_base_": ("all_gather", 2, _arg(0)),
    "c10d::allgather_coalesced_": ("all_gather", 2, _arg(0)),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", 2, _arg(0)),
    "c10d::reduce_scatter_": ("reduce_scatter", 2, _arg(1)),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 2, _arg(1)),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", 2, _arg(1)),
    "c10d::alltoall_": ("all_to_all", 2, _arg(1)),
    "c10d::alltoall_base_": ("all_to_all", 2, _arg(1)),
    "c10d::broadcast_": ("broadcast", 1, _arg(0)),
    "c10d::reduce_": ("reduce", 1, _arg(0)),
    "c10d::gather_": ("gather", 2, _times_n(1)),
    "c10d::gather_into_tensor_": ("gather", 2, _times_n(1)),
    "c10d::scatter_": ("scatter", 2, _times_n(0)),
    "c10d::send": ("send", 1, _arg(0)),
    "c10d::recv_": ("recv", 1, _arg(0)),
    "c10d::recv_any_source_": ("recv", 1, _arg(0)),
    "c10d::barrier": ("barrier", 1, lambda call, n: 0),
    "c10d::monitored_barrier_": ("barrier", 1, lambda call, n: 0),
})


def _packet(op: Any) -> str:
    schema = getattr(op, "_schema", None)
    return schema.name if schema is not None else str(op)


def is_collective(op: Any) -> bool:
    """Whether an operator overload is in one of the distributed namespaces.

    Args:
        op: an operator overload (``torch.ops._c10d_functional.all_reduce.default``).

    Returns:
        True for ``_c10d_functional``, ``_c10d_functional_autograd``, ``_dtensor`` and ``c10d``
        operators.
    """
    return getattr(op, "namespace", None) in NAMESPACES


#: out-of-place functional collectives that copy their input, then run in place (torch's
#: ``torch/csrc/distributed/c10d/Functional.cpp``: ``input.clone()``, then the ``_`` variant)
_COPY_FIRST = frozenset({"_c10d_functional::all_reduce", "_c10d_functional::all_reduce_coalesced",
                         "_c10d_functional::broadcast"})


def copy_bytes(op: Any, cost: Cost) -> tuple[int, int]:
    """Of a collective call's local bytes (its cost's), those a kernel other than the
    collective's own moves: the copy an out-of-place functional all-reduce or broadcast makes
    of its input (its input read, its output written: the whole cost); nothing for every other
    collective, whose local reads and writes are its own kernel's, part of its time on the
    link (this module's docstring, "Time").

    Args:
        op: the operator overload (a collective: :func:`is_collective`).
        cost: the call's cost (:func:`reducing_collective`, :func:`moving_collective`).

    Returns:
        ``(bytes read, bytes written)``.
    """
    if _packet(op) in _COPY_FIRST:
        return cost.bytes_read, cost.bytes_written
    return 0, 0


def _ring(kind: str, n: int, payload: int) -> int:
    factor = BUS_FACTORS[kind](n)
    return payload * factor.numerator // factor.denominator


def _batch_p2p(call: OpCall) -> Iterator[CommCall]:
    ops, tensors = call.args[0], call.args[3]
    n, name = _group_size(call.args[4]), group_name(call.args[4])
    for op, t in zip(ops, tensors, strict=False):
        kind = "send" if "send" in op else "recv"
        size = _bytes(t)
        yield CommCall(kind, n, size, size, name)


def communication(call: OpCall) -> list[CommCall]:
    """What a call sends (see this module's docstring for the conventions).

    Args:
        call: one call of an operator in a distributed namespace.

    Returns:
        One :class:`CommCall` per collective the call makes (a batch of point-to-point operations
        gives one per send and receive); empty for an operator that sends nothing
        (``wait_tensor``, ``_wrap_tensor_autograd``, ``check_for_nan``).

    Raises:
        RuntimeError: the call's process group cannot be resolved.
    """
    name = _packet(call.op)
    if name == "_c10d_functional::batch_p2p_ops":
        return list(_batch_p2p(call))
    entry = _TABLE.get(name)
    if entry is None:
        return []
    kind, group_at, payload_of = entry
    group = call.arg(group_at, "group_name")
    n = _group_size(group)
    payload = payload_of(call, n)
    return [CommCall(kind, n, payload, _ring(kind, n, payload), group_name(group))]


@rule(*sorted({k for k, v in _TABLE.items() if v[0] in {"all_reduce", "reduce_scatter", "reduce"}}))
def reducing_collective(call: OpCall) -> Cost:
    """A reducing collective (all-reduce, reduce-scatter, reduce): 0 FLOPs (the reduction's adds
    run in the communication library; communication is reported apart, see above); bytes: tensor
    inputs read, outputs written, locally."""
    return call.cost()


@rule(*sorted({k for k, v in _TABLE.items()
               if v[0] not in {"all_reduce", "reduce_scatter", "reduce"}}),
      "_c10d_functional::batch_p2p_ops")
def moving_collective(call: OpCall) -> Cost:
    """A collective that moves data without arithmetic (all-gather, all-to-all, broadcast, gather,
    scatter, send, recv, barrier): 0 FLOPs; bytes: tensor inputs read, outputs written, locally."""
    return call.cost()


@rule("_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd")
def wait(call: OpCall) -> Cost:
    """Waiting for an asynchronous collective, or wrapping its result for autograd: nothing moves,
    0 bytes (the collective's own call carries its bytes)."""
    return Cost()


@rule("c10d::check_for_nan")
def check_for_nan(call: OpCall) -> Cost:
    """A NaN check before a collective: 1 comparison per element (integer-free, counted as 1 FLOP
    each, like ``isnan``); reads the tensor."""
    return call.cost(flops=call.inputs[0].numel())


@rule("fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat",
      "fsdp::chunk_cat_mixed_dtype")
def fsdp_copy(call: OpCall) -> Cost:
    """FSDP2's packing and unpacking of the flat buffers it all-gathers and reduce-scatters
    (copy-in of the local shards, copy-out of the gathered parameters, gradient concatenation;
    ``chunk_cat_mixed_dtype``, torch >= 2.15, concatenates gradients of several dtypes into one
    reduce dtype): copies, 0 FLOPs; bytes: tensor inputs read, outputs written."""
    return call.cost()
