"""The GPU check (benchmarks/gpu_check.py) runs its logic here in its dry mode, and reads Nsight
Compute's output correctly (a recorded report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmarks import gpu_check, gpu_ncu

# the shape of `ncu --csv --metrics ...` output (two kernels; values as ncu prints them)
NCU = '''==PROF== Connected to process 1234
==PROF== Profiling "ampere_sgemm_128x64_nn": 0%....50%....100% - 3 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","python","host","ampere_sgemm_128x64_nn","1","7","(256, 1, 1)","(8, 16, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum","inst","1,073,741,824"
"0","1234","python","host","ampere_sgemm_128x64_nn","1","7","(256, 1, 1)","(8, 16, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_fadd_pred_on.sum","inst","1,048,576"
"0","1234","python","host","ampere_sgemm_128x64_nn","1","7","(256, 1, 1)","(8, 16, 1)","0","9.0","Command line profiler metrics","sm__ops_path_tensor_src_fp64.sum","","n/a"
"1","1234","python","host","elementwise_kernel","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_fadd_pred_on.sum","inst","512"
"1","1234","python","host","elementwise_kernel","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_dfma_pred_on.sum","inst","10"
'''


def test_ncu_output_is_read_and_fma_counts_two() -> None:
    metrics = gpu_ncu.parse_csv(NCU)
    assert metrics["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"] == 1_048_576 + 512
    assert "sm__ops_path_tensor_src_fp64.sum" not in metrics  # n/a on this architecture
    assert metrics["kernels"] == 2
    ex = gpu_ncu.executed(metrics)
    # a 1024^3 fp32 GEMM: 1024^3 FFMA = 2 * 1024^3 FLOPs, plus the adds; dfma 10 = 20 fp64 ops
    assert ex["fp32"] == 2 * 1_073_741_824 + 1_048_576 + 512
    assert ex["fp64"] == 20 and ex["tensor_ops"] == 0
    assert ex["total"] == ex["fp32"] + 20
    assert gpu_ncu.parse_csv("no csv here") == {}
    kernels = gpu_ncu.per_kernel(NCU)  # the GEMM first: 2 * 2^30 + 2^20 fp32 operations
    assert [(k["name"], k["total"]) for k in kernels] == [
        ("ampere_sgemm_128x64_nn", 2 * 1_073_741_824 + 1_048_576),
        ("elementwise_kernel", 512 + 20)]


def test_every_part_runs_dry_and_resumes(tmp_path: Path) -> None:
    summary = gpu_check.run(tmp_path, list(gpu_check.PARTS), force=False, dry=True)
    assert summary["dry"] and summary["parts"] == {p: "ok" for p in gpu_check.PARTS}
    flops = json.loads((tmp_path / "flops.json").read_text())
    rows = {r["workload"]: r for r in flops["rows"]}
    assert not [r for r in flops["rows"] if "error" in r]
    assert rows["mm_fp32"]["macs"] == 64 ** 3  # dry shapes: 64 x 64 x 64
    assert "executed" not in rows["mm_fp32"]  # nothing measured without CUDA
    # forward + backward of a whole model: the backward's two products per layer (grad of the
    # input, grad of the weight) make it about 3x the forward
    assert 2.5 < rows["resnet50_bwd"]["macs"] / rows["resnet50"]["macs"] < 3.1
    attention = json.loads((tmp_path / "attention.json").read_text())["rows"]
    assert all(r["macs"] == r["flop_counter_macs"] for r in attention)  # math backend
    # math SDPA on 1 x 8 x 128 x 64: QK^T and PV, 2 * 8 * 128 * 128 * 64 MACs; backward 2x that
    assert [r["macs"] for r in attention] == [2 * 8 * 128 * 128 * 64, 6 * 8 * 128 * 128 * 64] * 2
    memory = json.loads((tmp_path / "memory.json").read_text())["rows"]
    assert [(r["model"], r["train"]) for r in memory] == [
        (m, t) for m in ("resnet50", "gpt2", "llama") for t in (False, True)]
    assert all(r["predicted"]["peak_bytes"] > 0 and r["predicted_shape_only"] > 0 for r in memory)
    calib = json.loads((tmp_path / "calib.json").read_text())
    assert calib["gemm"][0]["tflops"] > 0 and calib["host"][0]["host_s_per_call"] > 0
    # DTensor's and FSDP2's host time, measured on the host as a CPU calibration does, and
    # carried into the profile made from the calib
    framework = calib["framework"]
    assert 0 < framework["dtensor_pointwise_s"] < framework["dtensor_call_s"]
    assert framework["fsdp_collective_s"] > 0
    from benchmarks import gpu_profile

    cal = gpu_profile.calibrated(calib, {"device": "NVIDIA H200", "date": "2026-11-29 12:00 UTC",
                                         "torch": torch.__version__, "cuda": "13.0"}).calibration
    assert cal is not None and (cal.dtensor_call_s, cal.dtensor_pointwise_s,
                                cal.fsdp_collective_s) == (
        framework["dtensor_call_s"], framework["dtensor_pointwise_s"],
        framework["fsdp_collective_s"])
    # the host time of mixed operators: the tiny calls in rotation, the chains of layers
    assert len(calib["host_rotation"]) == len(calib["host"]) and len(calib["chains"]) == 4
    # the same calls and chain kinds at a batch-1 model's sizes (dry: 16 x 32 rows, 8 x 12 x 12)
    sized = {r["op"]: r for r in calib["host_sized"]}
    assert set(sized) == {r["op"] for r in calib["host"]} | {"(all, sized, until done)"}
    assert sized["add"]["sized_out_bytes"] == 16 * 32 * 4  # float32 rows x width
    assert sized["conv2d"]["sized_out_bytes"] == 8 * 10 * 10 * 4  # 3x3, no padding: 12 -> 10
    assert sized["add"]["tiny_kernels"] == sized["add"]["sized_kernels"] == 0  # no device here
    assert [r["what"] for r in calib["chains_sized"]] == [
        "depthwise3x3+bn+relu 96x56x56 x3", "linear+layernorm+gelu 256x768 x3"]
    predict = json.loads((tmp_path / "predict.json").read_text())
    assert predict["profile"] == "shipped docs/gpu/h200_calibrated.json"  # dry: not from calib
    assert [(r["model"], r["train"], r["dtype"]) for r in predict["rows"]] == [
        ("resnet18", False, "float32"), ("llama", True, "bfloat16"), ("squeezenet1_0", False, "float32")]
    for r in predict["rows"]:
        assert "error" not in r and r["eager_s"] > 0 and r["calls"] > 0
        # the step is host and device overlapping: at least each, at most their sum
        assert max(r["predicted_host_s"], r["predicted_device_s"]) <= r["predicted_step_s"]
        assert r["predicted_step_s"] <= r["predicted_host_s"] + r["predicted_device_s"] + 1e-12
        assert r["ratio"] == r["predicted_step_s"] / r["eager_s"]
        assert sum(f["calls"] for f in r["families"].values()) == r["calls"]
    # the serving planner's forwards of a tiny decoder, measured (dry: on the CPU) and then
    # predicted by the serving role's simulation (benchmarks/gpu_serve.py)
    serve = json.loads((tmp_path / "serve.json").read_text())
    assert [(r["model"], r["batch"]) for r in serve["rows"]] == [("tiny", 1), ("tiny", 2)]
    from benchmarks import gpu_serve

    predicted = gpu_serve.predict(serve, "h200")
    for r in predicted["rows"]:
        for step in gpu_serve.STEPS:
            x = r[step]
            assert "error" not in r and x["measured_s"] > 0 and x["bound_s"] <= x["predicted_s"]
            assert x["ratio"] == x["predicted_s"] / x["measured_s"]
    # a second run keeps what is complete; a flops file cut short goes on where it stopped: cut
    # before its last workload (the tiny ViT's backward), so the resumed run measures that one
    # only (cut at 3 it ran the 15 others again, resnet50's forward and backward among them)
    again = gpu_check.run(tmp_path, ["flops"], force=False, dry=True)
    assert again["parts"] == {"flops": "kept"}
    flops["complete"] = False
    kept, flops["rows"] = flops["rows"][:-1], flops["rows"][:-1]
    (tmp_path / "flops.json").write_text(json.dumps(flops))
    resumed = gpu_check.run(tmp_path, ["flops"], force=False, dry=True)
    assert resumed["parts"] == {"flops": "ok"}
    after = json.loads((tmp_path / "flops.json").read_text())["rows"]
    assert len(after) == len(rows) and after[:-1] == kept  # the kept rows as they were
    last = list(rows)[-1]  # measured again: the same count
    assert after[-1]["workload"] == last and after[-1]["macs"] == rows[last]["macs"]


def test_unknown_part_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["--parts", "flops,bogus", "--dry"])


def test_the_gpu_page_holds_the_tables_made_from_its_results() -> None:
    """docs/gpu.md's figures come from docs/gpu/*.json (benchmarks/gpu_tables.py), never typed."""
    from benchmarks import gpu_tables

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "gpu.md").read_text()
    assert gpu_tables.render(root / "docs" / "gpu") in page
    assert gpu_tables.render(root / "docs" / "gpu" / "h100") in page  # the H100's run
    rows = {r["workload"]: r for r in json.loads((root / "docs/gpu/flops.json").read_text())["rows"]}
    # the causal flash kernel on the H200: 36 of 64 128 x 128 tiles of a 1024-long sequence,
    # 8 heads of 64: 36 * 128 * 128 * 64 * 2 (products) * 2 (FLOPs) * 8 = 1,207,959,552
    assert gpu_ncu.executed(rows["sdpa_causal"]["raw"])["tensor_ops"] == 1_207_959_552
    # ... which is flopscope's block-skipping model of the flash kernel on compute capability 9.0
    from flopscope.llm import flash2_block_sizes, flash2_executed_pairs

    bm, bn = flash2_block_sizes(64, capability=(9, 0))
    assert flash2_executed_pairs(1024, 1024, block_m=bm, block_n=bn) * 64 * 2 * 2 * 8 == 1_207_959_552


def test_the_gpu_serve_part_runs_the_forwards_the_planner_simulates() -> None:
    """Each measured step starts from the cache the serving role's simulated forward starts
    from and adds as many positions: prompt 16 and 8 new tokens give a prefill of 16, decode
    steps on 16 and (after the catch-up chunk of 8 - 3) 22 positions, and the mixed step of
    ceil((16 + 7) / 8) = 3 positions on the middle, 16 + 1 + (8 - 3 - 3) // 2 = 18."""
    from benchmarks import gpu_serve
    from benchmarks.decode_validation import build

    from flopscope.estimate import get_hardware
    from flopscope.plan.serving import simulate_serving

    plan = gpu_serve.step_plan(16, 8)
    assert plan == {"prefill": (0, 16), "first": (16, 1), "last": (22, 1), "mixed": (18, 3)}
    config = gpu_serve.llama(64, 2, 4, 2, 128, 256)
    run = simulate_serving(lambda: build(config, "meta"), 1, 2, 16, 8, get_hardware("h200"))
    for step, (start, new) in plan.items():
        simulated = getattr(run, step)
        assert (simulated.context, simulated.tokens) == (start + new, 2 * new), step


def test_the_same_cases_measured_again_are_set_side_by_side(tmp_path: Path) -> None:
    """gpu_tables.repeat_table: a later file's eager and graph times over the first's, case by
    case (the same model, batch, step and dtype)."""
    from benchmarks import gpu_tables

    def write(name: str, eager: list[float], graph: list[float]) -> None:
        rows = [{"model": m, "batch": 1, "train": False, "dtype": "float32", "eager_s": e,
                 "graph_s": g} for m, e, g in zip(("a", "b"), eager, graph, strict=True)]
        (tmp_path / name).write_text(json.dumps({"rows": rows}))

    write("predict.json", [1.0, 2.0], [1.0, 1.0])
    write("predict_run2_shipped.json", [1.5, 1.0], [1.0, 1.1])
    lines = gpu_tables.repeat_table(tmp_path, "predict.json", ("predict_run2_shipped.json",))
    # eager 1.5/1.0 and 1.0/2.0: ratios 1.5 and 0.5, median 1.00, |ratio - 1| 50% both;
    # graph 1.0 and 1.1: median 1.05, |ratio - 1| 0% and 10% (median 5%, p90 the larger)
    assert lines[2] == ("| predict_run2_shipped.json | predict.json | 1.00 (0.50-1.50); 50% / 50% (2)"
                        " | 1.05 (1.00-1.10); 5% / 10% (2) |")
