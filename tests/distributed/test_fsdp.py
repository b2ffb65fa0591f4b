"""FSDP2 over 8 simulated ranks: the rank computes the whole model on its local batch, all-gathers
the parameters in forward (and again in backward) and reduce-scatters the gradients."""

from __future__ import annotations

from tests.distributed._models import tiny_llama

import flopscope
from flopscope.cost import Phase
from flopscope.distributed import Layout, simulate


def test_fsdp2_on_8_ranks() -> None:
    report = simulate(lambda: tiny_llama(), Layout(8, fsdp=8), backward=True, warn=False,
                      logical=False)
    model, args, kwargs = tiny_llama()
    whole = flopscope.count(model, *args, backward=True, warn=False, **kwargs)
    assert report.uncounted == {}
    # the unsharded model on the rank's batch (bytes differ: FSDP2 copies its flat buffers)
    # (FLOPs add FSDP2's gradient averaging: a division of the rank's reduced gradient shards)
    assert report.macs == whole.macs
    param_bytes = 4 * whole.params  # float32
    # forward: every parameter all-gathered once (root group: embedding, final norm, head; one
    # group per decoder layer): payload = the unsharded bytes, ring bus = 7/8 of them
    gathers = [r for r in report.communication
               if r.kind == "all_gather" and r.phase is Phase.FORWARD]
    assert sum(r.payload_bytes for r in gathers) == param_bytes
    assert sum(r.bus_bytes for r in gathers) == param_bytes * 7 // 8
    assert all(r.group_size == 8 for r in report.communication)
    # every gradient reduce-scattered once, in backward (the root group's at the end of
    # backward, from autograd's final callback, which runs outside any autograd node and
    # module: count_rank moves what that callback did to the backward phase)
    scatters = report.communication_by_kind()["reduce_scatter"]
    assert scatters.payload_bytes == param_bytes
    assert scatters.bus_bytes == param_bytes * 7 // 8
    assert {r.phase for r in report.communication if r.kind == "reduce_scatter"} == {
        Phase.BACKWARD}
    root = [r for r in report.communication if r.kind == "reduce_scatter" and r.module == ""]
    assert len(root) == 1 and root[0].calls == 1  # the root group: embedding, final norm, head
    # forward is the unsharded model's forward (FSDP2's copies have no arithmetic) plus the sum of
    # the logits that count_rank's backward starts from: 2 x 64 x 512 = 65,536 FLOPs
    assert report.total(Phase.FORWARD).flops == whole.total(Phase.FORWARD).flops + 65_536


def test_tp_times_fsdp_mesh() -> None:
    tp2 = simulate(lambda: tiny_llama(), Layout(2, tp=2), logical=False, warn=False)
    both = simulate(lambda: tiny_llama(), Layout(8, tp=2, fsdp=4), logical=False, warn=False)
    assert (both.macs, both.flops) == (tp2.macs, tp2.flops)  # FSDP adds communication
    kinds = both.communication_by_kind()
    assert set(kinds) == {"all_gather", "all_reduce"}
    model, _, _ = tiny_llama()
    # the tp-sharded parameters gathered over the 4 FSDP ranks: between params / 2 and params
    assert 4 * model.num_parameters() // 2 < kinds["all_gather"].payload_bytes
    assert kinds["all_gather"].payload_bytes < 4 * model.num_parameters()
