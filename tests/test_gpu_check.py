"""The GPU check (benchmarks/gpu_check.py) runs its logic here in its dry mode, and reads Nsight
Compute's output correctly (a recorded report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import gpu_check

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
    metrics = gpu_check.parse_ncu_csv(NCU)
    assert metrics["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"] == 1_048_576 + 512
    assert "sm__ops_path_tensor_src_fp64.sum" not in metrics  # n/a on this architecture
    ex = gpu_check.executed(metrics)
    # a 1024^3 fp32 GEMM: 1024^3 FFMA = 2 * 1024^3 FLOPs, plus the adds; dfma 10 = 20 fp64 ops
    assert ex["fp32"] == 2 * 1_073_741_824 + 1_048_576 + 512
    assert ex["fp64"] == 20 and ex["tensor_ops"] == 0
    assert ex["total"] == ex["fp32"] + 20
    assert gpu_check.parse_ncu_csv("no csv here") == {}


def test_every_part_runs_dry_and_resumes(tmp_path: Path) -> None:
    summary = gpu_check.run(tmp_path, list(gpu_check.PARTS), force=False, dry=True)
    assert summary["dry"] and summary["parts"] == {p: "ok" for p in gpu_check.PARTS}
    flops = json.loads((tmp_path / "flops.json").read_text())
    rows = {r["workload"]: r for r in flops["rows"]}
    assert rows["mm_fp32"]["macs"] == 64 ** 3  # dry shapes: 64 x 64 x 64
    assert "executed" not in rows["mm_fp32"]  # nothing measured without CUDA
    attention = json.loads((tmp_path / "attention.json").read_text())["rows"]
    assert all(r["macs"] == r["flop_counter_macs"] for r in attention)  # math backend
    memory = json.loads((tmp_path / "memory.json").read_text())["rows"]
    assert [r["train"] for r in memory] == [False, True] and all(r["predicted"] > 0 for r in memory)
    # a second run keeps what is written
    again = gpu_check.run(tmp_path, ["flops"], force=False, dry=True)
    assert again["parts"] == {"flops": "kept"}


def test_unknown_part_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(["--parts", "flops,bogus", "--dry"])
