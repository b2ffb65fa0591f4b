"""Element-wise arithmetic, comparisons and activations: FLOPs per *output* element.

Conventions: one add, subtract, multiply, divide, compare, min/max or rounding = 1 FLOP; an
elementary function (exp, log, sqrt, rsqrt, erf, tanh, sin, pow ...) = 1 FLOP; composite
activations are costed by their formula in those terms (the derivation is in each row).
In-place (``add_``) and ``out=`` forms cost the same as the functional form.
"""

from __future__ import annotations

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import register_table, rule


def _with_inplace(*names: str) -> list[str]:
    return [f"aten::{n}" for n in names] + [f"aten::{n}_" for n in names]


register_table([
    (_with_inplace(
        "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "float_power",
        "atan2", "hypot", "copysign", "xlogy", "nextafter", "ldexp",
    ) + ["aten::maximum", "aten::minimum", "aten::fmax", "aten::fmin", "aten::rsub"],
     1, "Binary arithmetic (mul, div, pow, remainder, maximum ...): 1 FLOP per output element."),
    (_with_inplace(
        "neg", "abs", "sign", "sgn", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log",
        "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "floor", "ceil", "round",
        "trunc", "frac", "lgamma", "digamma", "square", "relu", "positive", "signbit",
        "sinc", "i0", "special_i0e", "logical_not", "bitwise_not",
    ) + ["aten::threshold", "aten::threshold_", "aten::clamp_min", "aten::clamp_min_",
         "aten::clamp_max", "aten::clamp_max_", "aten::isnan", "aten::isinf", "aten::isfinite",
         "aten::isneginf", "aten::isposinf", "aten::nan_to_num", "aten::nan_to_num_",
         "aten::prelu", "aten::_prelu_kernel", "aten::_conj_physical", "aten::conj_physical"],
     1, "Unary arithmetic, elementary functions, relu/threshold (one compare), clamp_min/max: 1 FLOP "
        "per output element."),
    (_with_inplace(
        "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
        "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
        "__and__", "__or__", "__xor__", "__lshift__", "__rshift__",
    ), 1, "Comparisons and logical/bitwise operators: 1 operation per output element."),
    (_with_inplace("gcd"), 1, "Greatest common divisor (integers only): Euclid's loop, whose length "
                              "depends on the values, counted as 1 operation per output element "
                              "(integer work: 0 FLOPs, see the number-kind convention)."),
    (_with_inplace("lcm"), 3, "Least common multiple (integers only): |a| / gcd(a, b) * |b|, gcd + "
                              "divide + multiply: 3 operations per output element (integer work: "
                              "0 FLOPs)."),
    (_with_inplace("leaky_relu", "hardtanh", "relu6", "hardshrink", "softshrink", "tanhshrink",
                   "softsign", "rrelu_with_noise"),
     2, "Two-step activations: leaky_relu = compare + multiply; hardtanh/relu6 = min + max; "
        "shrinks = compare + subtract; softsign = abs/(1+|x|) counted as add + divide: 2 FLOPs."),
    (_with_inplace("softplus", "logit"),
     3, "softplus = log(1 + exp(x)) (exp, add, log; beta scaling folded); logit = log(p/(1-p)) "
        "(sub, div, log): 3 FLOPs."),
    (_with_inplace("sigmoid", "elu", "log_sigmoid_forward", "hardsigmoid"),
     4, "sigmoid = 1/(1+exp(-x)) (neg, exp, add, divide); elu = x>0 ? x : a*(exp(x)-1) (compare, "
        "exp, sub, mul); log_sigmoid = -softplus(-x) computed stably (abs, exp, add, log); "
        "hardsigmoid = clamp(x/6 + 1/2, 0, 1) (multiply, add, max, min): 4 FLOPs."),
    (_with_inplace("silu", "mish", "selu", "celu", "hardswish"),
     5, "silu = x * sigmoid(x) (4 + 1); mish = x * tanh(softplus(x)) (3 + 1 + 1); selu/celu = "
        "scaled elu (4 + 1); hardswish = x * hardsigmoid(x) (4 + 1): 5 FLOPs."),
    (_with_inplace("lerp", "addcmul", "addcdiv"),
     3, "lerp = a + w*(b - a) (sub, mul, add); addcmul/addcdiv = self + value * t1 (*|/) t2 "
        "(mul|div, mul, add): 3 FLOPs."),
    (["aten::threshold_backward", "aten::hardtanh_backward", "aten::leaky_relu_backward",
      "aten::hardshrink_backward", "aten::softshrink_backward", "aten::prelu_backward"],
     1, "Backward of piecewise-linear activations: grad * (x in range) is one select-or-multiply: "
        "1 FLOP per element."),
    (["aten::sigmoid_backward", "aten::tanh_backward"],
     3, "sigmoid'/tanh' from the saved output y: g*y*(1-y) and g*(1-y*y): 3 FLOPs per element."),
    (["aten::hardsigmoid_backward"],
     2, "hardsigmoid': g/6 inside (-3, 3), else 0: range compare + multiply: 2 FLOPs per element."),
    (["aten::elu_backward", "aten::softplus_backward", "aten::hardswish_backward",
      "aten::log_sigmoid_backward"],
     4, "Backward of exp-based activations (elu, softplus, log_sigmoid) and hardswish: derivative "
        "(2-3) + multiply by grad: 4 FLOPs per element."),
    (["aten::silu_backward"],
     9, "silu' as the kernel computes it, g * s * (1 + x*(1-s)) with s = sigmoid(x): sigmoid (4) + "
        "1-s, x*(1-s), 1+..., s*(...), g*(...) (5) = 9 FLOPs per element."),
    (["aten::mish_backward"],
     14, "mish' as the kernel computes it, g * (t + x*s*(1 - t*t)) with s = sigmoid(x) and "
         "t = tanh(softplus(x)): sigmoid (4) + softplus (3) + tanh (1) + t*t, 1-..., x*s, *(...), "
         "t+..., g*(...) (6) = 14 FLOPs per element."),
])


@rule(*_with_inplace("add", "sub", "subtract"))
def add(call: OpCall) -> Cost:
    """a + alpha*b: 1 FLOP per output element (2 when alpha is not 1). (The CPU kernel computes
    a + alpha*b even for alpha = 1; flopscope counts the arithmetic the expression asks for.)"""
    alpha = named_arg(call, "alpha", 1)
    return call.cost(flops=(1 if alpha == 1 else 2) * call.out_numel())


@rule("aten::clamp", "aten::clamp_", "aten::clip", "aten::clip_")
def clamp(call: OpCall) -> Cost:
    """clamp(x, min, max): one compare per bound given, per output element."""
    bounds = sum(named_arg(call, n) is not None for n in ("min", "max"))
    return call.cost(flops=bounds * call.out_numel())


@rule("aten::gelu", "aten::gelu_")
def gelu(call: OpCall) -> Cost:
    """erf form: x/2 * (1 + erf(x/sqrt 2)): multiply, erf, add, multiply, multiply = 5 FLOPs per
    element. tanh form: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))): x^3 (2), multiply,
    add, multiply, tanh, add, multiply, multiply = 9 FLOPs per element."""
    per = 9 if named_arg(call, "approximate", "none") == "tanh" else 5
    return call.cost(flops=per * call.out_numel())


@rule("aten::gelu_backward")
def gelu_backward(call: OpCall) -> Cost:
    """erf form: g * (Phi(x) + x*phi(x)) = erf branch (3) + exp(-x^2/2)/sqrt(2 pi) (3) + x*phi (1)
    + add (1) + multiply by g (1) = 9 FLOPs per element; tanh form: 15 (the derivative of the
    polynomial inside tanh and of tanh itself, plus the product rule)."""
    per = 15 if named_arg(call, "approximate", "none") == "tanh" else 9
    return call.cost(flops=per * call.out_numel())


@rule("aten::where", "aten::masked_fill", "aten::masked_fill_")
def select(call: OpCall) -> Cost:
    """Element-wise selection (where, masked_fill): no arithmetic, 0 FLOPs; bytes are counted."""
    return call.cost()


@rule("aten::native_dropout")
def native_dropout(call: OpCall) -> Cost:
    """Dropout in training: x * mask * 1/(1-p): 2 FLOPs per element (random numbers are not
    counted). In eval mode dropout runs no operator at all."""
    train = named_arg(call, "train", True)
    return call.cost(flops=(2 * call.args[0].numel()) if train is not False else 0)


@rule("aten::native_dropout_backward")
def native_dropout_backward(call: OpCall) -> Cost:
    """grad * mask * scale: 2 FLOPs per element."""
    return call.cost(flops=2 * call.out_numel())


def _foreach_elements(call: OpCall) -> int:
    return sum(t.numel() for t in call.args[0])


@rule(*[f"aten::_foreach_{n}{s}" for n in (
    "add", "sub", "mul", "div", "neg", "sqrt", "exp", "abs", "reciprocal", "maximum", "minimum",
    "pow", "sign", "clamp_min", "clamp_max", "log", "zero") for s in ("", "_")])
def foreach_unary_binary(call: OpCall) -> Cost:
    """Multi-tensor (``_foreach_*``, used by optimizers) add/sub/mul/div/sqrt ...: 1 FLOP per element
    of every tensor in the list; add/sub with an ``alpha`` other than 1: 2 (scale, add), as the
    single-tensor forms (``_foreach_zero_``: 0). Bytes cover all tensors."""
    name = call.op._schema.name
    per = 0 if name.startswith("aten::_foreach_zero") else 1
    if per and name.startswith(("aten::_foreach_add", "aten::_foreach_sub")):
        per = 1 if named_arg(call, "alpha", 1) == 1 else 2
    return call.cost(flops=per * _foreach_elements(call))


@rule(*[f"aten::_foreach_{n}{s}" for n in ("addcmul", "addcdiv", "lerp") for s in ("", "_")])
def foreach_ternary(call: OpCall) -> Cost:
    """Multi-tensor addcmul/addcdiv/lerp: 3 FLOPs per element (as the single-tensor forms)."""
    return call.cost(flops=3 * _foreach_elements(call))


@rule("aten::_foreach_norm")
def foreach_norm(call: OpCall) -> Cost:
    """Multi-tensor 2-norm: square and add per element (2), a square root per tensor."""
    return call.cost(flops=2 * _foreach_elements(call) + len(call.args[0]))
