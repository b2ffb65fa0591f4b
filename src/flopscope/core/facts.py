"""What flopscope knows about an operator overload that does not depend on any rule or call:
one :class:`OpFacts` per overload, worked out from its schema the first time it is seen and kept
for the life of the process (:func:`facts`).

Every part of flopscope that asks a question of an operator (the counter's hot path, the bytes of
a call, the rules' argument lookup, the shape-only memo, copy on write of the model's tensors, the
roofline's fusion view, the memory tracker) reads it here, so each question is answered once per
overload, in one place. Keyed by ``id(overload)``: an ``OpOverload``'s ``__hash__`` is Python
code, too slow for the hot path; the overload is kept alive by its entry, so its id is never
reused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._ops import HigherOrderOperator, OpOverload

from flopscope.core.decompose import decomposition, runs_decomposed

__all__ = ["RESHAPING", "MemoKind", "OpFacts", "facts"]

# allocation operators: a module whose outputs came only from these ran no arithmetic we saw
_ALLOCATIONS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::zeros", "aten::zeros_like", "aten::new_zeros",
})
# in-place operators that change their argument's metadata (or more than its values)
RESHAPING = frozenset({
    "aten::resize_", "aten::resize_as_", "aten::as_strided_", "aten::set_", "aten::squeeze_",
    "aten::unsqueeze_", "aten::transpose_", "aten::t_", "aten::swapdims_", "aten::swapaxes_",
    "aten::detach_", "aten::requires_grad_", "aten::_coalesced_", "aten::sparse_resize_",
    "aten::sparse_resize_and_clear_", "aten::_resize_output_",
})
# operators that write arguments their schema does not mark written: batch norm's kernels update
# the running statistics in place when ``training`` is true (no alias annotation, and no bump of
# the statistics' version counters either)
_WRITES_RUNNING_STATS = frozenset({"aten::native_batch_norm", "aten::cudnn_batch_norm",
                                   "aten::miopen_batch_norm"})
_SINGLE = frozenset({"Tensor", "Optional[Tensor]"})
_LISTS = frozenset({"List[Tensor]", "List[Optional[Tensor]]"})
_UNSET: Any = object()


class MemoKind:
    """How an operator's outputs can be made again from metadata (the shape-only memo)."""

    OTHER = 0  # not at all
    NEW = 1  # it returns only new tensors: no output aliases an argument, no argument is written
    SELF = 2  # an in-place operator that writes only its first argument's values and returns it


def _layout(schema: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Where the positional tensor arguments are: the indices of ``Tensor``/``Tensor?`` arguments
    and of ``Tensor[]``/``Tensor?[]`` ones; ``None`` when some argument type may hide tensors
    elsewhere (then arguments are searched in full)."""
    single: list[int] = []
    lists: list[int] = []
    for i, a in enumerate(schema.arguments):
        if a.kwarg_only:
            continue  # keyword-only arguments arrive in kwargs, which are searched in full
        kind = str(a.type)
        if kind in _SINGLE:
            single.append(i)
        elif kind in _LISTS:
            lists.append(i)
        elif "Tensor" in kind or kind in ("Any", "t", "Optional[t]"):
            return None
    return tuple(single), tuple(lists)


def _memo_kind(op: Any, schema: Any) -> int:
    if schema is None or op.namespace == "prim":
        return MemoKind.OTHER
    returns = [r.alias_info for r in schema.returns]
    written = [a.alias_info for a in schema.arguments]
    if not any(r is not None for r in returns) and not any(w is not None for w in written):
        return MemoKind.NEW
    if (schema.name not in RESHAPING and len(returns) == 1 and written
            and returns[0] is not None and returns[0].is_write
            and written[0] is not None and written[0].is_write
            and returns[0].before_set == written[0].before_set
            and not any(w is not None for w in written[1:])):
        return MemoKind.SELF
    return MemoKind.OTHER


class OpFacts:
    """Facts about one operator overload (see the module docstring).

    Attributes:
        op: the overload (or higher-order operator).
        name: its name in reports (``aten.mm.default``, ``higher_order.flex_attention``).
        schema_name: its schema name (``aten::mm``; ``""`` for a higher-order operator).
        view: some output is a view of an argument (an alias that is not written).
        aliasing: some output aliases an argument (views, in-place and ``out=`` forms).
        allocation: it only allocates (``empty``, ``zeros``, ...).
        ignored: a ``prim::`` metadata query (``prim::device``), not an operator that runs.
        written: (position, name) of the arguments its schema marks written.
        void_written: ``written`` where the schema returns nothing (``_foreach_mul_``, a
            ``foreach`` ``out=`` form, ``_fused_adam_``): the values it writes are its written
            arguments', not outputs'; ``()`` for every other operator.
        stats_written: for batch norm's kernels, (position of ``training``, the (position,
            name) of ``running_mean`` and ``running_var``): arguments written, unmarked, when
            ``training`` is true; ``None`` for other operators.
        guarded: it may write an argument (``written`` or ``stats_written``): what copy on
            write of the model's tensors looks at (:mod:`flopscope.core.integrity`).
        pointwise: it carries torch's ``pointwise`` tag (what Inductor fuses).
        reshaping: it changes an argument's metadata in place (``resize_``, ``t_``, ...).
        layout: where its positional tensor arguments are (see :func:`_layout`), or ``None``.
        arg_index: schema argument name -> position, for arguments that may be positional.
        memo_kind: a :class:`MemoKind`.
        pure_view: an ``aten`` view operator that writes nothing (``view``, ``t``, ``slice``):
            a symbolic count makes its outputs from templates.
        kernel: the overload's C++ callable, which ``op(...)`` calls through a Python frame
            (``OpOverload.__call__``) when no Python dispatcher is set on the overload
            (``op._pyobj_dispatcher is None``: then calling it is calling ``op``); ``None`` for
            other operator types, and on a torch whose overloads have no such attribute.
    """

    __slots__ = ("_decomposition", "_runs_decomposed", "aliasing", "allocation", "arg_index",
                 "guarded", "ignored", "kernel", "layout", "memo_kind", "name", "op", "pointwise",
                 "pure_view", "reshaping", "schema_name", "stats_written", "view", "void_written",
                 "written")

    def __init__(self, op: Any) -> None:
        self.op = op
        self._decomposition: Callable[..., Any] | None = _UNSET
        self._runs_decomposed: bool | None = None
        self.kernel: Callable[..., Any] | None = (
            op._op if type(op) is OpOverload and hasattr(op, "_pyobj_dispatcher") else None)
        schema = None if isinstance(op, HigherOrderOperator) else getattr(op, "_schema", None)
        if schema is None:
            name = op.name() if callable(getattr(op, "name", None)) else str(op)
            self.name = f"higher_order.{name}" if isinstance(op, HigherOrderOperator) else str(op)
            self.schema_name = ""
            self.view = self.aliasing = self.allocation = self.ignored = False
            self.pointwise = self.reshaping = self.pure_view = False
            self.written: tuple[tuple[int, str], ...] = ()
            self.void_written: tuple[tuple[int, str], ...] = ()
            self.stats_written: tuple[int, tuple[tuple[int, str], ...]] | None = None
            self.guarded = False
            self.layout: tuple[tuple[int, ...], tuple[int, ...]] | None = None
            self.arg_index: dict[str, int] = {}
            self.memo_kind = MemoKind.OTHER
            return
        self.name = str(op)
        self.schema_name = schema.name
        returns = schema.returns
        self.view = any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        self.aliasing = any(r.alias_info is not None for r in returns)
        self.allocation = schema.name in _ALLOCATIONS
        self.ignored = op.namespace == "prim"
        self.written = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.void_written = () if returns else self.written
        self.pointwise = torch.Tag.pointwise in getattr(op, "tags", ())
        self.reshaping = schema.name in RESHAPING
        self.layout = _layout(schema)
        self.arg_index = {a.name: i for i, a in enumerate(schema.arguments) if not a.kwarg_only}
        self.stats_written = None
        if schema.name in _WRITES_RUNNING_STATS:
            at = self.arg_index
            self.stats_written = (at["training"], tuple((at[n], n)
                                                        for n in ("running_mean", "running_var")))
        self.guarded = bool(self.written) or self.stats_written is not None
        self.memo_kind = _memo_kind(op, schema)
        self.pure_view = bool(op.namespace == "aten" and returns and not self.reshaping
                              and all(r.alias_info is not None and not r.alias_info.is_write
                                      for r in returns)
                              and not self.written)

    @property
    def decomposition(self) -> Callable[..., Any] | None:
        """The function that runs the operator as the operators of its decomposition, or
        ``None`` (see :func:`flopscope.core.decompose.decomposition`); looked up on first use."""
        found = self._decomposition
        if found is _UNSET:
            found = self._decomposition = decomposition(self.op)
        return found

    @property
    def runs_decomposed(self) -> bool:
        """Whether the decomposition is what runs (a composite operator with no kernel of its
        own; see :func:`flopscope.core.decompose.runs_decomposed`)."""
        found = self._runs_decomposed
        if found is None:
            found = self._runs_decomposed = (not isinstance(self.op, HigherOrderOperator)
                                             and runs_decomposed(self.op))
        return found

    def __repr__(self) -> str:
        return f"OpFacts({self.name})"


# id(operator overload) -> its facts (which keep the overload alive)
_TABLE: dict[int, OpFacts] = {}


def facts(op: Any) -> OpFacts:
    """The facts of an operator overload, worked out on first sight.

    Args:
        op: an ``OpOverload`` or a ``HigherOrderOperator``.

    Returns:
        Its :class:`OpFacts`.
    """
    found = _TABLE.get(id(op))
    if found is None or found.op is not op:
        found = _TABLE[id(op)] = OpFacts(op)
    return found

