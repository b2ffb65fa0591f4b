"""Fused optimizer kernels (``torch.optim`` with ``fused=True``): one operator call updates every
parameter, so its FLOPs are those of the for-loop implementation, per parameter element.

The for-loop and ``foreach`` implementations run ordinary element-wise operators (``lerp_``,
``addcmul_``, ``sqrt``, ``addcdiv_`` ...), counted by their own rules; these rules give the fused
kernel the same figure (docs/training.md derives it; tests/test_phases.py checks all three).
"""

from __future__ import annotations

from flopscope.cost import Cost, OpCall
from flopscope.rules._shapes import named_arg
from flopscope.rules.registry import rule


@rule("aten::_fused_adam_", "aten::_fused_adamw_")
def fused_adam(call: OpCall) -> Cost:
    """Adam/AdamW step, per parameter element: exp_avg.lerp_(grad, 1-beta1) 3; exp_avg_sq.mul_(beta2)
    1; .addcmul_(grad, grad, 1-beta2) 3; sqrt 1; divide by sqrt(bias_correction2) 1; add eps 1;
    param.addcdiv_(exp_avg, denom, -step_size) 3 = 13; weight decay adds 1 (AdamW:
    param.mul_(1 - lr*wd)) or 2 (Adam: grad + wd*param); amsgrad adds 1 (maximum); maximize adds 1
    (negate grad). AdamW with weight decay: 14. The step counters are incremented by a separate
    operator."""
    params = call.args[0]
    n = sum(p.numel() for p in params)
    per = 13
    if named_arg(call, "weight_decay", 0.0):
        per += 1 if call.op._schema.name == "aten::_fused_adamw_" else 2
    if named_arg(call, "amsgrad", False):
        per += 1
    if named_arg(call, "maximize", False):
        per += 1
    return call.cost(flops=per * n)
