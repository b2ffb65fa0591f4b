"""execution.copies.to_empty_tied: a meta model made empty on the CPU in place, its tied weights
kept one parameter (as every simulated rank's model is, distributed.shape_only.shape_only_rank)."""

from __future__ import annotations

import torch
from torch import nn

from flopscope.execution.copies import to_empty_tied


def test_tied_weights_stay_one_parameter() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False), nn.Linear(4, 4))
    model[1].weight = model[0].weight  # a tied head
    untied = nn.Sequential(*[nn.Linear(4, 4).to("meta") for _ in range(2)])
    plain = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)).to("meta")
    plain[1].weight = plain[0].weight
    plain.to_empty(device="cpu")  # torch's own: a new parameter per name
    assert plain[1].weight is not plain[0].weight
    to_empty_tied(model, "cpu")
    to_empty_tied(untied, "cpu")
    assert model[1].weight is model[0].weight and model[0].weight.device.type == "cpu"
    assert isinstance(model[1].weight, nn.Parameter)
    # 10 x 4 tied, 4 x 4 + 4: 60 parameters, counted once
    assert sum(p.numel() for p in model.parameters()) == 60
    assert untied[0].weight is not untied[1].weight
