"""Symbolic costs: MACs, FLOPs and bytes as formulas of named input sizes (batch, sequence length,
resolution).

The model runs once on fake tensors whose named dimensions are symbols of a PyTorch
``ShapeEnv`` (``torch.fx.experimental.symbolic_shapes``): every size an operator sees is a
``SymInt``, every rule's integer arithmetic on sizes builds a formula, and the costs added up per
(module, operator, phase) are sympy expressions. Nothing here propagates shapes: PyTorch's fake
tensors and meta kernels do.

The branches PyTorch takes on sizes while tracing (``if seq_len > window``) are recorded by the
``ShapeEnv`` as guards; they are the formula's *domain* (:attr:`SymbolicReport.domain`), and
:meth:`SymbolicReport.evaluate` refuses a point outside it unless told otherwise.

Example::

    rep = flopscope.count_symbolic(model, x, symbolic={"batch": (0, 0), "seq_len": (0, 1)})
    rep.total().macs            # 6*batch*seq_len**2 + 1024*batch*seq_len ... (sympy)
    rep.evaluate(batch=2, seq_len=128).macs   # == flopscope.count(model, x_2x128).macs
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map_only

from flopscope.core.fake_memo import same_size
from flopscope.core.memo import symbolic_replay
from flopscope.cost import SYMBOLIC_COUNTS, Cost, OpCall, Phase
from flopscope.errors import ForwardError, UsageError
from flopscope.execution.inputs import Inputs, model_arguments
from flopscope.report.report import Report
from flopscope.report.symbolic import SymbolicReport
from flopscope.report.symbolic_records import FIELDS, SymCost, SymRecord
from flopscope.rules import default_rules
from flopscope.rules.user import RulesArg
from flopscope.run import count
from flopscope.symbolic.explain import explain
from flopscope.symbolic.fake import PinningFakeMode

__all__ = ["count_symbolic", "plot_symbolic"]

DimRef = tuple[int | str, int]
"""Where a symbolic dimension is: (positional argument index or keyword name, dimension)."""
SymbolSpec = Mapping[str, DimRef | Sequence[DimRef]]

# -- counting --------------------------------------------------------------------------------
def _refs(spec: SymbolSpec) -> dict[str, list[DimRef]]:
    out: dict[str, list[DimRef]] = {}
    if not isinstance(spec, Mapping):
        raise UsageError(
            "symbolic= must be a dict of symbol name -> place (argument index or keyword name, "
            f"dimension), e.g. {{'batch': (0, 0)}}, not {type(spec).__name__} {spec!r}")
    for name, where in spec.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"symbol name {name!r} is not an identifier (use e.g. 'batch', 'seq_len')")
        one = isinstance(where, tuple) and len(where) == 2 and isinstance(where[1], int)
        if not one and not isinstance(where, (list, tuple)):
            raise UsageError(
                f"symbolic={{{name!r}: {where!r}}}: a place is (argument index or keyword name, "
                f"dimension), e.g. {{{name!r}: (0, 0)}} for dimension 0 of the first argument, or "
                "a list of such places")
        refs: list[Any] = [where] if one else list(where)
        for ref in refs:
            if not (isinstance(ref, tuple) and len(ref) == 2 and isinstance(ref[0], (int, str))
                    and isinstance(ref[1], int)):
                raise UsageError(
                    f"symbolic={{{name!r}: {where!r}}}: each place is (argument index or keyword "
                    "name, dimension), e.g. (0, 1) or ('input_ids', 1), or a list of them"
                )
        out[name] = refs
    return out


def count_symbolic(
    model: nn.Module,
    /,
    *args: Any,
    symbolic: SymbolSpec,
    hints: Mapping[str, int] | None = None,
    rules: RulesArg = None,
    strict: bool = False,
    backward: bool = False,
    train: bool | None = None,
    warn: bool = True,
    **kwargs: Any,
) -> SymbolicReport:
    """Count one forward (and optionally backward) of ``model`` with named input dimensions kept
    symbolic: the costs are formulas in those names.

    Args:
        model: the model (real or on ``meta``; it is run on fake tensors either way).
        *args: positional arguments of ``model`` (or one :class:`~flopscope.Inputs`).
        symbolic: name -> where the dimension is: ``(argument index or keyword name, dim)`` or a
            list of places that share the size, e.g. ``{"batch": [(0, 0)], "seq_len": [(0, 1)]}``
            or ``{"seq_len": [("input_ids", 1), ("attention_mask", 1)]}``.
        hints: name -> the size to trace at (default: the input's size, at least 2, distinct
            per symbol). Branches on sizes are taken as at the hints; see
            :attr:`SymbolicReport.domain`.
        rules: extra operator and module rules (see :func:`flopscope.count`).
        strict: raise at the first operator without a rule.
        backward: also run backward.
        train: run in training (True) or eval (False) mode; ``None`` keeps the model's mode.
        warn: warn once about uncounted operators.
        **kwargs: keyword arguments of ``model``.

    Returns:
        The :class:`SymbolicReport`.

    Raises:
        UsageError: a bad ``symbolic`` spec (unknown argument, dimension out of range).
        ForwardError: the model cannot run with symbolic sizes (data-dependent sizes are named).
    """
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    args, kwargs = model_arguments(args, kwargs)
    refs = _refs(symbolic)
    if not refs:
        raise UsageError("symbolic= names no dimension; e.g. symbolic={'batch': (0, 0)}")

    def tensor_at(where: int | str) -> torch.Tensor:
        t = args[where] if isinstance(where, int) and where < len(args) else kwargs.get(str(where))
        if isinstance(where, int) and where >= len(args):
            t = None
        if not isinstance(t, torch.Tensor):
            raise UsageError(f"symbolic: argument {where!r} is not a tensor among the model's inputs "
                             f"(positional: {len(args)}, keywords: {sorted(kwargs)})")
        return t

    sizes: dict[str, int] = {}
    for name, places in refs.items():
        for where, dim in places:
            t = tensor_at(where)
            if not -t.dim() <= dim < t.dim():
                raise UsageError(f"symbolic {name!r}: argument {where!r} has {t.dim()} dimensions, "
                                 f"no dimension {dim}")
            sizes.setdefault(name, int(t.shape[dim]))
    chosen: dict[str, int] = {}
    for name in refs:
        h = int((hints or {}).get(name, max(sizes[name], 2)))
        if h < 1:
            raise UsageError(f"hint {name}={h}: trace at a size of at least 1")
        while h in chosen.values() and name not in (hints or {}):
            h += 1  # distinct hints, so that no size is taken for another (duck shaping)
        chosen[name] = h

    env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
    fake_mode = PinningFakeMode(shape_env=env, allow_non_fake_inputs=True)
    # PyTorch's own dispatch cache makes an entry (a synthetic output, its symbolic metadata
    # checked) for every new call: the count's calls repeat only across layers, which flopscope
    # replays itself (_memo, _module_replay), so the entries cost more than they save (70B-shaped
    # Llama: 0.33 s -> 0.22 s per count)
    fake_mode.cache_enabled = False
    syms: dict[str, Any] = {}
    for name, h in chosen.items():
        source = ConstantSource(name)
        s = env.create_symbol(h, source=source, dynamic_dim=DimDynamic.DYNAMIC)
        syms[name] = env.create_symintnode(s, hint=h, source=source)
    dims: dict[int, dict[int, str]] = {}  # id(tensor) -> dim -> symbol name
    for name, places in refs.items():
        for where, dim in places:
            t = tensor_at(where)
            dims.setdefault(id(t), {})[dim % t.dim()] = name

    def symbolic_tensor(t: torch.Tensor) -> torch.Tensor:
        marks = dims.get(id(t))
        if marks is None:
            # an input with no named size keeps its sizes: made fake here with static shapes (the
            # count would make it fake with a fresh symbol per dimension, unnamed)
            if t.is_meta or isinstance(t, FakeTensor):
                return t
            return fake_mode.from_tensor(t, static_shapes=True)
        shape = [syms[marks[i]] if i in marks else int(n) for i, n in enumerate(t.shape)]
        with fake_mode:
            out = torch.zeros(shape, dtype=t.dtype, device="cpu")
        return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out

    args, kwargs = tree_map_only(torch.Tensor, symbolic_tensor, (args, kwargs))
    if rules is None or (isinstance(rules, Mapping) and not any(
            str(k).startswith("aten::slice_backward") for k in rules)):
        rules = {"aten::slice_backward": _slice_backward, **(rules or {})}
    SYMBOLIC_COUNTS[0] += 1
    origins: dict[str, str] = {}  # data-dependent symbol -> the operator that made it
    try:
        # without backward, repeated calls (the same operator on the same symbolic metadata: every
        # layer of a decoder stack) are answered from memory (flopscope.core.memo); with backward,
        # only their costs are
        with symbolic_replay(fake_mode, replay=not backward, origins=origins):
            raw = count(model, Inputs(*args, **kwargs), rules=rules, strict=strict,
                        shape_only=True, backward=backward, train=train, warn=warn)
    except ForwardError as e:
        raise ForwardError(explain(e, origins), module_path=e.module_path) from e
    finally:
        SYMBOLIC_COUNTS[0] -= 1
    return _symbolic_report(raw, env, syms, chosen, origins)


def _slice_backward(call: OpCall) -> Cost:
    """``slice_backward`` of a slice over a whole symbolic dimension (``x[:, :]``, start 0, end
    past the size, step 1) costs nothing: on concrete sizes PyTorch's indexing skips such a
    slice, so neither it nor its gradient runs; on symbolic sizes the slice is recorded (0 bytes,
    a view) and its gradient would be charged as a copy. Other slices: the default rule."""
    grad, sizes, dim, start, end, step = call.args[:6]
    if start == 0 and step == 1 and isinstance(end, int) and end >= 2**62 and \
            len(sizes) == grad.dim() and all(same_size(a, b) for a, b in zip(grad.shape, sizes, strict=True)):
        return Cost()
    fn = default_rules().find(call.op)
    assert fn is not None
    return fn(call)


def _symbolic_report(raw: Report, env: Any, syms: Mapping[str, Any],
                     hints: Mapping[str, int], origins: Mapping[str, str]) -> SymbolicReport:
    from torch.utils._sympy.functions import FloorDiv

    # a size PyTorch made static at once (a hint of 1) is no symbol: it is fixed, said below
    names = {s.node.expr: name for name, s in syms.items()
             if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol)}
    symbols = {name: sympy.Symbol(name, integer=True, positive=True) for name in syms}
    rename = {expr: symbols[name] for expr, name in names.items()}
    cache: dict[Any, sympy.Expr] = {}

    def expr(v: Any) -> sympy.Expr:
        if type(v) is int:
            return sympy.Integer(v)
        e = v.node.expr
        found = cache.get(e)
        if found is None:
            found = env.replace(e)
            found = found.replace(FloorDiv, lambda a, b: sympy.floor(a / b))
            found = sympy.expand(found.xreplace(rename))
            cache[e] = found
        return found

    def sym(c: Cost) -> SymCost:
        return SymCost(*(expr(getattr(c, f)) for f in FIELDS))

    records = [SymRecord(r.module, r.op, r.phase, r.calls, sym(r.cost), r.counted, r.decomposed)
               for r in raw.records]
    rules = [(r, sym(r.cost), sym(r.shadowed)) for r in raw.rules]
    known = set(symbols.values())
    unknowns: dict[str, str] = {}
    for r in records:  # each data-dependent size: the operator that made it and its module
        for f in FIELDS:
            for s in getattr(r.cost, f).free_symbols - known:
                name = str(s)
                if name in unknowns:
                    continue
                op = origins.get(name, r.op)
                module = next((x.module for x in records if x.op == op and any(
                    s in getattr(x.cost, g).free_symbols for g in FIELDS)), r.module)
                unknowns[name] = f"data-dependent size made by {op} in module '{module}'"
    domain: list[sympy.Basic] = []
    for name, s in syms.items():
        if not (isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol)):
            domain.append(sympy.Eq(symbols[name], int(s)))
            continue
        vr = env.var_to_range.get(s.node.expr)
        lo = int(vr.lower) if vr is not None and vr.lower.is_Integer else 0
        if lo > 1:
            domain.append(sympy.Ge(symbols[name], lo))
        if vr is not None and vr.upper.is_Integer:
            domain.append(sympy.Le(symbols[name], int(vr.upper)))
    for g in env.guards:
        e = env.simplify(env.replace(g.expr)).replace(FloorDiv, lambda a, b: sympy.floor(a / b))
        e = e.xreplace(rename)
        if e in (sympy.true, True) or not (e.free_symbols & known):
            continue
        if isinstance(e, (sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan,
                          sympy.GreaterThan)) and len(e.free_symbols) == 1 and \
                (e.lhs in known or e.rhs in known) and (e.lhs.is_Integer or e.rhs.is_Integer):
            continue  # a bound: part of the range above
        if e not in domain:
            domain.append(e)
    for name, s in syms.items():  # a symbol PyTorch fixed to one value
        if name not in names.values():
            continue  # static from the start: already in the domain
        fixed = env.replacements.get(s.node.expr)
        if fixed is not None and fixed.is_Integer:
            domain.append(sympy.Eq(symbols[name], int(fixed)))
    base = dataclasses.replace(raw, records=(), rules=())
    return SymbolicReport(symbols, hints, _tidy(domain, symbols), unknowns, records, rules, base)


def _tidy(domain: list[sympy.Basic], symbols: Mapping[str, sympy.Symbol]) -> list[sympy.Basic]:
    """The guards without duplicates and without those the ranges already imply."""
    out: list[sympy.Basic] = []
    lows: dict[sympy.Symbol, int] = {}
    bounds = []
    for g in domain:
        if isinstance(g, sympy.GreaterThan) and g.rhs.is_Integer and g.lhs.is_Symbol:
            lows[g.lhs] = int(g.rhs)
            bounds.append(g)
        elif isinstance(g, sympy.LessThan) and g.lhs.is_Integer and g.rhs.is_Symbol:
            lows[g.rhs] = int(g.lhs)
            bounds.append(g)
        elif isinstance(g, sympy.LessThan) and g.rhs.is_Integer and g.lhs.is_Symbol:
            bounds.append(g)
    for s in symbols.values():  # sizes are at least 1; Ne(k*s, k) excludes 1: then s >= 2
        lows.setdefault(s, 1)
        while any(isinstance(g, sympy.Ne) and g.free_symbols == {s}
                  and g.xreplace({s: sympy.Integer(lows[s])}) is sympy.false for g in domain):
            lows[s] += 1
        if lows[s] > 1 and not any(b.free_symbols == {s} and not (isinstance(b, sympy.LessThan)
                                   and b.rhs.is_Integer) for b in bounds):
            domain = [sympy.Ge(s, lows[s]), *domain]
            bounds.append(domain[0])
    for g in domain:
        if g in out or g is sympy.true:
            continue
        if g not in bounds and _implied(g, lows):
            continue
        out.append(g)
    return out


def _implied(g: sympy.Basic, lows: Mapping[sympy.Symbol, int]) -> bool:
    """Whether a guard follows from the lower bounds of its symbols (``Ne(s, 1)`` or
    ``Ne(b*t, t)`` when every symbol is at least 2): with each symbol written as its bound plus a
    non-negative ``t``, the difference of the two sides has one sign."""
    if not isinstance(g, (sympy.Ne, sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan,
                          sympy.GreaterThan)):
        return False
    try:
        shifted = {s: lows.get(s, 0) + sympy.Symbol(f"_t{i}", nonnegative=True, integer=True)
                   for i, s in enumerate(g.free_symbols)}
        diff = sympy.expand((g.lhs - g.rhs).xreplace(shifted))
    except (TypeError, AttributeError):
        return False
    if isinstance(g, sympy.Ne):
        return bool(diff.is_positive or diff.is_negative)
    if isinstance(g, (sympy.StrictLessThan,)):
        return bool(diff.is_negative)
    if isinstance(g, sympy.LessThan):
        return bool(diff.is_nonpositive)
    if isinstance(g, sympy.StrictGreaterThan):
        return bool(diff.is_positive)
    return bool(diff.is_nonnegative)


def plot_symbolic(report: SymbolicReport, path: str, *, symbol: str = "seq_len",
                  field: str = "flops", lo: int | None = None, hi: int | None = None,
                  phase: Phase | str | None = None, **values: int) -> None:
    """Draw a cost against one symbol: the total, its super-linear part (attention's terms in
    ``symbol²`` and above) and the rest, other symbols at ``values`` (default 1).

    Args:
        report: the symbolic report.
        path: the image file (.png, .svg, .pdf).
        symbol: the size on the x axis.
        field: ``macs``, ``flops``, ``bytes_read`` or ``bytes_written``.
        lo: the smallest value (default: the domain's lower bound or 1).
        hi: the largest value (default: 32 times the traced size).
        phase: one phase, or all.
        **values: values of the other symbols.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report.symbols[symbol]
    others = {report.symbols[k]: sympy.Integer(values.get(k, 1)) for k in report.symbols if k != symbol}
    high, rest = report.split(symbol, field, phase)
    lo = lo if lo is not None else 1
    hi = hi if hi is not None else 32 * report.hints[symbol]
    xs = sorted({int(round(lo + (hi - lo) * i / 200)) for i in range(201)})
    fh = sympy.lambdify(s, high.xreplace(others), modules=["math"])
    fr = sympy.lambdify(s, rest.xreplace(others), modules=["math"])
    hs = [float(fh(x)) for x in xs]
    rs = [float(fr(x)) for x in xs]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.stackplot(xs, rs, hs, labels=[f"terms up to {symbol}¹ (linear part)",
                                     f"terms in {symbol}² and above (attention)"], alpha=0.75)
    ax.plot(xs, [a + b for a, b in zip(hs, rs, strict=True)], color="black", lw=1, label="total")
    ax.set_xlabel(symbol)
    ax.set_ylabel(field)
    fixed = ", ".join(f"{k}={values.get(k, 1)}" for k in report.symbols if k != symbol)
    ax.set_title(f"{report.report.model}: {field} vs {symbol}" + (f" ({fixed})" if fixed else ""))
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
