"""Integer and complex arithmetic in a count of floating-point operations.

Default rules state a call's work as if its numbers were real floating-point values. The counter
then adjusts by what the numbers are (a family that counts complex numbers itself, FFT and dense
linear algebra, is left alone, and so is every rule a user gives: it means what it says):

- **Integer and boolean work is not FLOPs.** A call whose tensors are all integer or boolean
  (index arithmetic, counters such as batch norm's ``num_batches_tracked += 1``, quantized
  kernels) costs 0 FLOPs; it keeps its bytes, and its MACs where it has any (an integer matmul
  does multiply-accumulate: MACs count sums of products whatever the data type, which is how
  torchvision's published figures count quantized models). A call mixing integer inputs with a
  floating-point output (``int_tensor * 0.5``) is floating-point work.
- **Complex arithmetic is counted in real operations.** One complex multiply-accumulate is 4 real
  multiplies and 4 real adds = 4 real MACs; a complex add is 2 real adds, a complex multiply 4
  multiplies + 2 adds = 6, a complex divide 11 (6 for the numerator, 3 for |d|^2, 2 divides), an
  absolute value 4 (2 multiplies, 1 add, 1 square root), an angle 1 (atan2 of the two parts);
  other element-wise work counts 2 per
  complex element (the two components), a stated estimate.
"""

from __future__ import annotations

import torch

from flopscope.cost import Cost, OpCall

__all__ = ["COMPLEX_FACTORS", "in_real_numbers"]

COMPLEX_MAC_FACTOR = 4  # real MACs per complex MAC
COMPLEX_DEFAULT_FACTOR = 2  # real operations per complex element-wise operation (two components)
# operator packet (its report name without the overload) -> real FLOPs per complex FLOP
COMPLEX_FACTORS = {
    "aten.mul": 6, "aten.mul_": 6, "aten.div": 11, "aten.div_": 11, "aten.abs": 4,
    "aten.reciprocal": 11, "aten.square": 6,
    "aten.angle": 1,  # atan2(imag, real): one elementary function, already in real terms
}

_Tensor = torch.Tensor
_FLOAT = 0
_INTEGER = 1
_COMPLEX = 2


def _kind_of(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return _COMPLEX
    if dtype.is_floating_point:
        return _FLOAT
    return _INTEGER


def _kind(call: OpCall) -> int:
    """The kind of numbers a call computes with: complex if its output or first input is complex,
    floating-point if its output or any input is floating-point, else integer."""
    out = call.out
    first = out if isinstance(out, _Tensor) else next(iter(call.outputs), None)
    kind = _kind_of(first.dtype) if first is not None else _FLOAT
    if kind == _FLOAT:  # the common case: only a complex first input changes it (abs, angle)
        lead = call.args[0] if call.args else None
        return _COMPLEX if isinstance(lead, _Tensor) and lead.dtype.is_complex else _FLOAT
    if kind == _COMPLEX:
        return kind
    for t in call.inputs:
        k = _kind_of(t.dtype)
        if k == _COMPLEX:
            return k
        if k == _FLOAT:
            kind = _FLOAT
    return kind


def in_real_numbers(call: OpCall, cost: Cost, name: str) -> Cost:
    """``cost`` of ``call`` adjusted to what its numbers are (see the module docstring).

    Args:
        call: the operator call.
        cost: what its rule said, for real floating-point numbers.
        name: the operator's report name (``"aten.mul.Tensor"``), for the complex factors.

    Returns:
        The adjusted cost (``cost`` itself for ordinary floating-point calls).
    """
    kind = _kind(call)
    if kind == _FLOAT:
        return cost
    if kind == _INTEGER:
        return Cost(cost.macs, 0, cost.bytes_read, cost.bytes_written)
    macs = cost.macs * COMPLEX_MAC_FACTOR
    packet = name.rpartition(".")[0]
    other = (cost.flops - 2 * cost.macs) * COMPLEX_FACTORS.get(packet, COMPLEX_DEFAULT_FACTOR)
    return Cost(macs, 2 * macs + other, cost.bytes_read, cost.bytes_written)
