"""A screened plan's speed-ups, each exact: small runs kept for the confirmations
(flopscope.plan.reuse), a small run's model built with its layers only (build_model), the
screen's fake worlds shared by a reference's runs and left when it returns."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

from flopscope.distributed.repeat import NotRepeating, layer_list
from flopscope.estimate import PROFILES
from flopscope.plan.build import build_model, model_identity
from flopscope.plan.layout_roles import roles_of
from flopscope.plan.reuse import KeptRoles
from flopscope.plan.roles import Roles, clear_cache
from flopscope.plan.screen import Screen
from flopscope.plan.space import Choice

# 13 layers: a role without stages is put together from 3, 4 and 5 (more than 12), and
# screened from its runs of 3 and 4
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=13, num_attention_heads=8, num_key_value_heads=4)


def test_a_model_built_with_its_first_layers_only() -> None:
    build = build_model("hf:llama", 64, "bfloat16", CONFIG)
    whole = build(1, "none")[0]
    model = build(1, "none", 3)[0]
    found = layer_list(model)
    assert found is not None and len(found[1]) == 3 and model.config.num_hidden_layers == 3
    # the same parameters as the whole model's first 3 layers and the rest
    kept = {n: p.shape for n, p in whole.named_parameters()
            if not n.startswith("model.layers.") or int(n.split(".")[2]) < 3}
    assert {n: p.shape for n, p in model.named_parameters()} == kept
    with pytest.raises(NotRepeating, match="no decoder layer list of that length"):
        build(1, "none", 14)  # more than the model has: never built bigger


def test_a_confirmation_reuses_the_screens_small_runs() -> None:
    clear_cache()
    build = build_model("hf:llama", 64, "bfloat16", CONFIG)
    hw = PROFILES["h100-sxm"]
    identity = model_identity("hf:llama", 64, "bfloat16", CONFIG)
    kept = KeptRoles(build, hw, identity)
    screen = Screen(kept, build, 4)
    (key,) = roles_of(Choice(2, 1, 2, 1, 2, "block", sequence_parallel=True), 13, None, True)
    screen.run(key)  # its runs of 3 and 4 layers, in one fake world, left on return
    assert not dist.is_initialized()
    assert kept.reused == 0 and screen.references == 1
    run = kept.get(key)  # 3, 4 (kept) and 5 layers (the check), put together
    assert kept.reused == 2 and kept.from_small == 1
    assert kept.small(key, 3) is kept.small(key, 3)
    # the same role as one from three fresh runs, to the byte
    clear_cache()
    fresh = Roles(build, hw, identity).get(key)
    assert run.memory == fresh.memory and run.report == fresh.report
    assert run.estimate.total == fresh.estimate.total and run.parameter_bytes == fresh.parameter_bytes
