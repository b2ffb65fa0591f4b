"""What a training step does after its microbatches' backwards, counted by running it: the
optimizer's update of a rank's parameter shards, and the gradients' accumulation between the
microbatches of a layout without stages.

A rank's roles are simulated forward and backward (:mod:`flopscope.plan.roles`); what follows
is counted here on fake tensors of the rank's shard, one flat tensor of its elements in the
parameters' dtype (:func:`update_estimate`):

- **the update**: torch's ``AdamW`` (the plan's optimizer), its second ``step()`` (the first
  makes the moments): per element a weight decay, the two moments' updates, a square root, a
  division, an ``eps`` and the parameter's update, 84 bytes per float32 element
  (``tests/plan/test_update.py``). One flat tensor is what ``AdamW``'s default implementation
  on a GPU does (``foreach``: each operator once over the list of shards); a for-loop
  ``AdamW`` (a CPU's default) issues those calls once per parameter, so its host time is
  that many times more, which the count of one tensor leaves out;
- **the accumulation** (:func:`accumulation_estimate`): autograd stores the first
  microbatch's gradient of each parameter and adds each later one in place (FSDP2 adds the
  reduced shard), ``m - 1`` in-place adds of the rank's gradient shards a step. A pipeline
  stage's are in its simulated microbatches already (:func:`flopscope.plan.reference.
  accumulated`).
"""

from __future__ import annotations

import torch

from flopscope.estimate import Estimate, Hardware
from flopscope.plan.degrees import hardware_key

__all__ = ["accumulation_estimate", "update_estimate"]

#: estimates by (what, elements, dtype, profile): they depend on nothing else
_CACHE: dict[tuple[str, int, torch.dtype, str], Estimate] = {}


def update_estimate(elements: int, dtype: torch.dtype, hardware: Hardware) -> Estimate:
    """AdamW's update of ``elements`` parameters in ``dtype``, counted.

    Args:
        elements: the rank's parameter shards' elements.
        dtype: the parameters' dtype (and their gradients' and moments').
        hardware: the profile the calls are timed on.

    Returns:
        The :class:`~flopscope.estimate.Estimate` of the second ``step()`` (phase
        ``optimizer``).
    """
    return _counted("update", elements, dtype, hardware)


def accumulation_estimate(elements: int, dtype: torch.dtype, hardware: Hardware) -> Estimate:
    """One microbatch's gradients added in place into the accumulated ones, counted.

    Args:
        elements: the rank's gradient shards' elements.
        dtype: the gradients' dtype.
        hardware: the profile the calls are timed on.

    Returns:
        The :class:`~flopscope.estimate.Estimate` of the ``add_``.
    """
    return _counted("accumulation", elements, dtype, hardware)


def _counted(what: str, elements: int, dtype: torch.dtype, hardware: Hardware) -> Estimate:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flopscope.core.counter import Counter
    from flopscope.estimate.roofline import CallLog

    key = (what, elements, dtype, hardware_key(hardware))
    found = _CACHE.get(key)
    if found is not None:
        return found
    log = CallLog()
    with FakeTensorMode():
        param = torch.nn.Parameter(torch.empty(elements, dtype=dtype))
        param.grad = torch.empty(elements, dtype=dtype)
        if what == "update":
            opt = torch.optim.AdamW([param])
            opt.step()  # makes the moments: not a step's work
            with Counter(warn=False, observers=[log]):
                opt.step()
        else:
            more = torch.empty(elements, dtype=dtype)
            with Counter(warn=False, observers=[log]):
                param.grad.add_(more)
    found = _CACHE[key] = log.estimate(hardware)
    return found
