"""A collective's time is charged once: on its link (flopscope.estimate.comm_time), not again
as a memory-bound call of its local bytes in the roofline bound, the prediction and the plan's
step time (flopscope.rules.collectives, "Time"). The out-of-place functional all-reduce copies
its input before running in place (torch's Functional.cpp): that copy stays a call's."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from flopscope.distributed import Layout, simulate
from flopscope.estimate import PROFILES, CallLog, get_hardware
from flopscope.estimate.comm_time import Links, rank_step
from flopscope.plan.build import build_model
from flopscope.plan.roles import RoleKey, Roles, clear_cache
from flopscope.plan.timing import step_time

# 2 layers, hidden 64 (4 heads of 16, 2 KV heads), MLP 128, vocabulary 1,000, 32 tokens
CONFIG: dict[str, Any] = dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
SEQ = 32
H200 = Path(__file__).parent.parent.parent / "docs" / "gpu" / "h200_calibrated.json"
GATHER, SCATTER = "c10d._allgather_base_.default", "c10d._reduce_scatter_base_.default"
ALL_REDUCE = "_c10d_functional.all_reduce.default"


def _rank(layout: Layout, hardware: str = "h100-sxm") -> tuple[Any, Any]:
    build = functools.partial(build_model("hf:llama", SEQ, "bfloat16", CONFIG), 1, "none")
    log = CallLog()
    report = simulate(build, layout, backward=True, logical=False, observers=[log], warn=False)
    # a shipped name: its datasheet profile (the bound), as the plan takes it; else a file
    return report, log.estimate(PROFILES.get(hardware) or get_hardware(hardware))


def _op_bytes(report: Any, op: str) -> int:
    return sum(r.cost.bytes_read + r.cost.bytes_written for r in report.records if r.op == op)


def _payload(report: Any, kind: str) -> int:
    return sum(c.payload_bytes for c in report.communication if c.kind == kind)


def test_fsdp2_gathers_and_reduce_scatters_are_link_time_only() -> None:
    """FSDP 2. Each decoder layer holds q, o 64x64, k, v 32x64, gate, up, down 128x64 and two
    norms of 64: 36,992 parameters, 73,984 bytes in bfloat16 (every dimension 0 even: no
    padding); the root (embedding and head 1,000 x 64, the final norm) 128,064: 256,128 bytes.
    All-gathers (the gathered tensor, payload S): forward root + 2 layers, backward the 2
    layers again: 256,128 + 4 x 73,984 = 552,064 bytes. Reduce-scatters (the whole gradient):
    256,128 + 2 x 73,984 = 404,096 bytes. The report's local bytes of _allgather_base_(out,
    in): out and in read, out written: S + S/2 + S = 2.5 S = 1,380,160; of
    _reduce_scatter_base_(out, in): S/2 + S read, S/2 written = 2 S = 808,192. The roofline
    charged all 2,188,352 of them as memory-bound calls before (and the step hid the gathers
    behind that time); now none: the count is unchanged, the estimate has them at 0."""
    report, estimate = _rank(Layout(2, fsdp=2))
    assert _payload(report, "all_gather") == 552_064
    assert _payload(report, "reduce_scatter") == 404_096
    assert {c.kind for c in report.communication} == {"all_gather", "reduce_scatter"}
    assert _op_bytes(report, GATHER) == 1_380_160
    assert _op_bytes(report, SCATTER) == 808_192
    for op in (GATHER, SCATTER):
        row = estimate.by_op[op]
        assert (row.calls, row.bytes, row.time_s) == ((5, 0, 0.0) if op == GATHER
                                                      else (3, 0, 0.0))
    counted = sum(r.cost.bytes_read + r.cost.bytes_written for r in report.records)
    assert estimate.total.bytes == counted - 2_188_352
    # FSDP2's copy-in and copy-out are kernels of their own: still charged
    assert estimate.by_op["fsdp.all_gather_copy_in.default"].time_s > 0
    # the step: the collectives' link time beside a compute without them; the overlapped
    # time exceeds the compute, so all of it but the compute is exposed
    step = rank_step(estimate, report.communication, Links.of(PROFILES["h100-sxm"], 8),
                     dp=2)
    assert step.compute == estimate.total.time_s
    assert step.exposed == pytest.approx(step.comm.total - step.compute, rel=1e-12)


def test_tensor_parallel_all_reduce_keeps_its_copy() -> None:
    """TP 2: 14 all-reduces of one 1 x 32 x 64 bfloat16 activation each (4,096 bytes: the
    payload 14 x 4,096 = 57,344). The functional all-reduce clones its input (4,096 read, 4,096
    written) and reduces the clone in place: 14 x 8,192 = 114,688 bytes, a copy kernel's, in
    the bound as before; the reduction itself is link time."""
    report, estimate = _rank(Layout(2, tp=2))
    assert _payload(report, "all_reduce") == 57_344
    assert _op_bytes(report, ALL_REDUCE) == 114_688
    row = estimate.by_op[ALL_REDUCE]
    assert (row.calls, row.bytes) == (14, 114_688) and row.time_s > 0


def test_the_prediction_gives_a_collective_host_time_only() -> None:
    """On the calibrated H200 profile a gather or reduce-scatter call is predicted as the host's
    launch only (no device time: that is its link's); the all-reduce's copy gets device time."""
    _, fsdp = _rank(Layout(2, fsdp=2), str(H200))
    for op in (GATHER, SCATTER):
        row = fsdp.by_op[op]
        assert row.predicted_s == pytest.approx(row.host_s, rel=1e-12) and row.host_s > 0
    _, tp = _rank(Layout(2, tp=2), str(H200))
    row = tp.by_op[ALL_REDUCE]
    assert row.predicted_s > row.host_s


def test_the_plan_charges_fsdp2_collectives_on_their_link_only() -> None:
    """The plan's role (FSDP 2, micro-batch 1, the cross-entropy): its estimate has no bytes
    of the gathers and reduce-scatters, so the step's compute is the layers' and the loss's
    alone, and the FSDP2 time hidden behind it is at most that compute."""
    from flopscope.plan.space import Choice

    clear_cache()
    roles = Roles(build_model("hf:llama", SEQ, "bfloat16", CONFIG), PROFILES["h100-sxm"],
                  ("test_collective_time",), repeat_layers=False, repeat_microbatches=False)
    run = roles.get(RoleKey(1, 1, 0, 2, 1, 1, "none", loss="cross_entropy"))
    clear_cache()
    for op in (GATHER, SCATTER):
        assert run.estimate.by_op[op].bytes == 0 and run.estimate.by_op[op].time_s == 0.0
    choice = Choice(1, 1, 2, 1, 1, "none")
    t = step_time([run], choice, Links.of(PROFILES["h100-sxm"], 8))
    busy = t.forward + t.backward + t.recompute
    assert busy == pytest.approx(run.estimate.total.time_s, rel=1e-12)
    assert t.fsdp_hidden <= busy + t.tp_comm
