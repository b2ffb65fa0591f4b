"""DDP for decoders (issue 31): data parallelism by whole replicas beside FSDP2's shards, the
rank simulated as FSDP2's hybrid sharding with shards of one, its gradients all-reduced once a
step."""

from __future__ import annotations

import dataclasses

import pytest

import flopscope
from flopscope.cli import main
from flopscope.cost import Phase
from flopscope.distributed import Layout
from flopscope.errors import UsageError
from flopscope.estimate import get_hardware
from flopscope.estimate.comm_time import Links, comm_time
from flopscope.estimate.profile import Hardware
from flopscope.plan import enumerate_layouts
from flopscope.plan.planner import Plan, build_model, model_identity
from flopscope.plan.roles import RoleKey, Roles, clear_cache
from flopscope.plan.space import DATA_PARALLEL, ModelShape, data_parallel_kinds
from flopscope.report.records import CommRecord

from .test_plan import CONFIG, PARAMS

SHAPE = ModelShape(layers=4, heads=8, kv_heads=4, intermediate=512)


def _roles() -> Roles:
    build = build_model("hf:llama", 256, "bfloat16", CONFIG)
    return Roles(build, get_hardware("h100"), model_identity("hf:llama", 256, "bfloat16", CONFIG))


def _comm(run: object) -> dict[tuple[str, str, int], tuple[int, int]]:
    out: dict[tuple[str, str, int], tuple[int, int]] = {}
    for c in run.report.communication:  # type: ignore[attr-defined]
        calls, bus = out.get((c.kind, c.group, c.group_size), (0, 0))
        out[(c.kind, c.group, c.group_size)] = (calls + c.calls, bus + c.bus_bytes)
    return out


def test_a_ddp_rank_holds_whole_parameters_and_all_reduces_its_gradients_once() -> None:
    clear_cache()
    roles = _roles()
    # DDP over 4 replicas: every rank holds the whole model, 2,623,744 bfloat16 parameters =
    # 5,247,488 bytes, and all-reduces all of its gradients over the 4 replicas once: one call
    # per fully_shard unit (4 decoder layers, and the embedding, final norm and head, each a
    # unit of its own so that FSDP2 holds no copy of them through the step: 7), bus bytes
    # 2 (n - 1) / n of the payload = 2 x 3/4 x 5,247,488 = 7,871,232; FSDP2's gathers and
    # reduce-scatters over the shard dimension of one are not collectives (nothing recorded)
    ddp = roles.get(RoleKey(1, 1, 0, 4, 1, 1, "none", loss="cross_entropy", replicate=True))
    assert ddp.parameter_bytes == 2 * PARAMS
    assert _comm(ddp) == {("all_reduce", "dp", 4): (7, 7_871_232)}
    # FSDP2 over the same 4 ranks: a quarter of the parameters, gathered and reduce-scattered
    fsdp = roles.get(RoleKey(1, 1, 0, 4, 1, 1, "none", loss="cross_entropy"))
    assert fsdp.parameter_bytes == 2 * PARAMS // 4  # every dimension 0 divides by 4
    assert {k[0] for k in _comm(fsdp)} == {"all_gather", "reduce_scatter"}
    # the same work on every operator but the collectives: FSDP2's copies in and out of its
    # buffers aside, the products and attention are the same
    def products(run: object) -> dict[str, int]:
        return {op: s.cost.flops for op, s in run.report.by_op().items()  # type: ignore[attr-defined]
                if "mm" in op or "attention" in op}

    assert products(ddp) == products(fsdp) != {}


def test_ddp_with_tensor_parallelism_and_stages() -> None:
    roles = _roles()
    # TP 2 x DDP 2: each rank holds half of every projection (its tensor-parallel shard) and
    # the embedding, norms and head whole; the data-parallel all-reduce is of exactly those
    # bytes, 2 x 1/2 x 2,757,120 = 2,757,120, over the "dp" group; the tensor-parallel
    # all-reduces stay on "tp"
    tp = roles.get(RoleKey(2, 1, 0, 2, 1, 1, "none", loss="cross_entropy", replicate=True))
    comm = _comm(tp)
    assert comm[("all_reduce", "dp", 2)] == (7, tp.parameter_bytes)
    assert ("all_reduce", "tp", 2) in comm
    # a pipeline of 2 stages over 2 microbatches: the schedule's last backward reduces, so the
    # stage all-reduces its gradients once a step, one call per unit: the first stage's 2
    # layers and embedding (3), the last stage's 2 layers, final norm and head (4)
    for stage, units in ((0, 3), (1, 4)):
        run = roles.get(RoleKey(1, 2, stage, 2, 1, 2, "none", loss="cross_entropy",
                                replicate=True))
        assert _comm(run)[("all_reduce", "dp", 2)] == (units, run.parameter_bytes)


def test_outside_units_leave_tied_parameters_to_the_root() -> None:
    from torch import nn

    from flopscope.distributed.fsdp_units import outside_units

    class Tiny(nn.Module):
        def __init__(self, tied: bool) -> None:
            super().__init__()
            self.embed, self.norm = nn.Embedding(8, 4), nn.LayerNorm(4)
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.head = nn.Linear(4, 8, bias=False)
            if tied:
                self.head.weight = self.embed.weight

    untied = Tiny(False)
    # children before parents (reverse model order); the layers are the blocks, left out
    assert outside_units(untied, untied.layers) == [untied.head, untied.norm, untied.embed]
    tied = Tiny(True)
    # the head shares the embedding's weight: both stay in the root's unit
    assert outside_units(tied, tied.layers) == [tied.norm]


def test_layout_refuses_replicas_with_experts_and_names_its_mesh() -> None:
    with pytest.raises(UsageError, match="not built with expert"):
        Layout(4, ep=4, replicate=True)
    assert Layout(8, tp=2, pp=2, replicate=True).dp == 2


def test_enumeration_adds_ddp_where_there_is_data_parallelism() -> None:
    fsdp = enumerate_layouts(4, SHAPE, 4)
    both = enumerate_layouts(4, SHAPE, 4, data_parallel=("fsdp", "ddp"))
    with_dp = [c for c in fsdp if c.dp > 1]
    # every layout with data parallelism once more as DDP; TP4 / PP4 (dp 1) have none to choose
    assert len(both) == len(fsdp) + len(with_dp)
    every = enumerate_layouts(4, SHAPE, 4, data_parallel=DATA_PARALLEL)
    assert len(every) == len(fsdp) + 3 * len(with_dp)  # and as ZeRO-1 and ZeRO-2
    assert {dataclasses.replace(c, data_parallel="fsdp") for c in both
            if c.data_parallel == "ddp"} == set(with_dp)
    ddp_only = enumerate_layouts(4, SHAPE, 4, data_parallel=("ddp",))
    assert {c.data_parallel for c in ddp_only if c.dp > 1} == {"ddp"}
    assert {c.data_parallel for c in ddp_only if c.dp == 1} == {"fsdp"}
    assert data_parallel_kinds(None) == ("fsdp",)
    assert data_parallel_kinds(None, decoder=False) == ("fsdp", "ddp")
    assert data_parallel_kinds("search") == DATA_PARALLEL
    with pytest.raises(UsageError, match="data_parallel must be"):
        data_parallel_kinds("zero3")


def test_ddp_all_reduces_run_once_a_step_beside_the_last_backward() -> None:
    # 1 GB/s and 10 us per call inside a node; 4 replicas, buckets of 2 MB bus bytes
    hw = Hardware("links", 1e10, vector={"fp32": 1e11}, intra_node_bandwidth=1e9,
                  intra_node_latency=1e-5)
    links = Links.of(hw, gpus_per_node=8)
    buckets = [CommRecord("model", Phase.BACKWARD, "all_reduce", 4, 5, 10_000_000, 10_000_000,
                          "dp")]  # 5 calls: 50 us + 10 ms = 10.05 ms
    # simulated at one microbatch of a step of 4: DDP's no_sync all-reduces once, not 4 times
    once = comm_time(buckets, links, dp=4, scale=4, ddp=True)
    assert once.by_kind["all_reduce"] == pytest.approx(10.05e-3)
    assert once.overlapped_first == pytest.approx(2.01e-3)  # one bucket, exposed
    assert once.overlapped_rest == pytest.approx(8.04e-3)
    # beside 40 ms of compute of which the last microbatch's backward is 6 ms: the other
    # buckets hide behind those 6 ms only, 2.04 ms show: 2.01 + 2.04 = 4.05 ms exposed
    assert once.exposure(40e-3, window=6e-3).fsdp == pytest.approx(4.05e-3)
    assert once.exposure(40e-3).fsdp == pytest.approx(2.01e-3)  # the whole step: all but one
    # FSDP2's reduce-scatters are per microbatch (scaled)
    rs = [dataclasses.replace(buckets[0], kind="reduce_scatter")]
    assert comm_time(rs, links, dp=4, scale=4).overlapped_rest == pytest.approx(4 * 10.05e-3)


@pytest.fixture(scope="module")
def searched() -> Plan:
    clear_cache()
    plan = flopscope.plan("hf:llama", gpus=2, hardware="h100", config=CONFIG, seq_len=256,
                          global_batch=2, tp=1, data_parallel="search")
    assert isinstance(plan, Plan)
    return plan


def test_a_searched_plan_ranks_ddp_beside_fsdp(searched: Plan) -> None:
    rows = {c.choice.label: c for c in (*searched.ranked, *searched.dropped)}
    ddp, fsdp = rows["TP1 PP1 DDP2 mb1x1"], rows["TP1 PP1 DP2 mb1x1"]
    # AdamW's two moments per parameter in bfloat16: the whole model's on a DDP rank
    # (2 x 5,247,488), half of it on an FSDP2 rank (plus the root's padding)
    assert ddp.at_peak["optimizer_state"] == 2 * 2 * PARAMS
    assert fsdp.at_peak["optimizer_state"] == 2 * 2 * PARAMS // 2
    assert ddp.memory_bytes > fsdp.memory_bytes
    # its exposed communication is a DDP rank's all-reduces, named so in where the time goes
    d = ddp.to_dict()
    assert d["data_parallel"] == "ddp" and d["layout"] == "TP1 PP1 DDP2 mb1x1"
    assert "DDP" in searched.notes[1] and "once a step" in searched.notes[1]
    # ZeRO-1: the same rank (DDP's simulation, shared), AdamW's moments split over the 2
    # replicas (2 x 5,247,488 / 2) and its update over half the parameters
    z1 = rows["TP1 PP1 DDP2 Z1 mb1x1"]
    assert z1.at_peak["optimizer_state"] == 2 * 2 * PARAMS // 2
    assert z1.memory_bytes == ddp.memory_bytes - 2 * PARAMS
    assert 0 < z1.bound_step.optimizer < ddp.bound_step.optimizer
    assert z1.bound_step.forward == ddp.bound_step.forward
    assert "ZeRO-1" in searched.notes[1]
    # the page names the data-parallel part for every kind it shows
    assert searched.page_data()["explain"]["part_names"]["fsdp_comm"] == (
        "FSDP gathers/reduce-scatters or DDP all-reduces or ZeRO-1 reduce-scatters/gathers "
        "(exposed)")
    # the pipeline (dp 1) has no data parallelism to choose: one row
    assert sum(1 for label in rows if label.startswith("TP1 PP2")) == len(
        [c for c in enumerate_layouts(2, SHAPE, 2) if c.pp == 2])


def test_the_cli_takes_data_parallel_and_refuses_it_for_serving(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "hf:llama", "--gpus", "2", "--data-parallel", "zero3"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'zero3'" in err and "Traceback" not in err
    for word in (*DATA_PARALLEL, "search"):  # the CLI offers exactly the plan's kinds
        assert f"'{word}'" in err
    code = main(["plan", "hf:llama", "--gpus", "2", "--serve", "--data-parallel", "ddp"])
    assert code == 2
    assert "--data-parallel applies to a training plan" in capsys.readouterr().err
    with pytest.raises(UsageError, match="does not take data_parallel"):
        flopscope.plan("hf:llama", gpus=2, mode="serve", data_parallel="ddp")
