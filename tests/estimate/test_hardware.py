"""Hardware profiles: shipped figures, files, lookup, and the measured profile."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from flopscope.errors import UsageError
from flopscope.estimate import PROFILES, Hardware, get_hardware, load_hardware
from flopscope.estimate.profile import SPECIAL_FUNCTIONS, dtype_key
from flopscope.estimate.this_machine import measure_this_machine


def test_shipped_profiles_cover_the_issue_list() -> None:
    for name in ("h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l4", "l40s",
                 "mi300x", "epyc-9654", "xeon-8480", "graviton3"):
        hw = PROFILES[name]
        assert hw.memory_bandwidth > 0 and hw.vector["fp32"] > 0 and hw.source


def test_h100_sxm_datasheet_figures() -> None:
    hw = PROFILES["h100-sxm"]
    assert hw.memory_bandwidth == 3350e9
    assert hw.peak("bf16", True) == 989.5e12  # tensor cores, dense
    assert hw.peak("fp8", True) == 1979e12
    assert hw.peak("tf32", True) == 494.5e12
    assert hw.peak("fp32", True) == 67e12  # no FP32 tensor-core rate: CUDA cores
    assert hw.peak("fp64", True) == 67e12 and hw.peak("fp64", False) == 34e12
    assert hw.peak("bf16", False) == 133.8 * 1e12  # element-wise bf16 on CUDA cores
    assert hw.peak("fp8", False) == 67e12  # no vector fp8: done in fp32


def test_aliases_and_case() -> None:
    # one object per name: the datasheet profile with its reference calibration (a GPU)
    assert get_hardware("H100") is get_hardware("h100-sxm")
    assert dataclasses.replace(get_hardware("H100"), calibration=None) == PROFILES["h100-sxm"]
    assert dataclasses.replace(get_hardware("A100"), calibration=None) == PROFILES["a100-80gb"]
    assert get_hardware("EPYC-9654") is PROFILES["epyc-9654"]  # a CPU: none


def test_unknown_name_suggests() -> None:
    with pytest.raises(UsageError, match="unknown hardware 'h100-sx'.*h100-sxm"):
        get_hardware("h100-sx")


def test_dtype_keys() -> None:
    assert dtype_key(torch.float32) == "fp32"
    assert dtype_key(torch.float32, tf32=True) == "tf32"
    assert dtype_key(torch.bfloat16) == "bf16"
    assert dtype_key(torch.float8_e4m3fn) == "fp8"
    assert dtype_key(torch.int8) == "int8"
    assert dtype_key(torch.int64) is None


def test_json_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"profiles": [
        {"name": "my-gpu", "memory_bandwidth_gb_s": 1000, "matrix_tflops": {"bf16": 100},
         "vector_tflops": {"fp32": 10}, "memory_gb": 16},
        {"name": "other", "memory_bandwidth_gb_s": 500, "vector_tflops": {"fp32": 5}},
    ]}))
    first, other = load_hardware(path)
    assert first.memory_bandwidth == 1e12 and first.peak("bf16", True) == 100e12
    assert first.memory_bytes == 16 * 10**9
    assert get_hardware(f"{path}:other") == other
    assert get_hardware(str(path)) == first
    # round trip through the file format
    assert Hardware.from_dict(first.to_dict()) == first


def test_malformed_profiles(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "x", "memory_bandwidth_gb_s": 1,
                                "vector_tflops": {"fp33": 1}}))
    with pytest.raises(UsageError, match="unknown dtype 'fp33'"):
        load_hardware(path)
    path.write_text(json.dumps({"name": "x", "vector_tflops": {"fp32": 1}}))
    with pytest.raises(UsageError, match="needs 'memory_bandwidth_gb_s'"):
        load_hardware(path)
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_hardware(path)
    with pytest.raises(UsageError, match="cannot read hardware file"):
        load_hardware(tmp_path / "missing.json")


def test_measured_profile_is_labelled() -> None:
    hw = measure_this_machine(gemm_size=128, copy_mib=8, repeats=1)
    assert hw.measured and hw.name == "this-machine"
    assert hw.memory_bandwidth > 0 and hw.peak("fp32", True) > 0


def test_cache_figures_in_profile_files(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"name": "g", "memory_bandwidth_gb_s": 1000,
                                "vector_tflops": {"fp32": 10}, "cache_mib": 50,
                                "cache_bandwidth_gb_s": 7000, "write_bandwidth_gb_s": 500}))
    (hw,) = load_hardware(path)
    assert hw.cache_bytes == 50 * 2**20 and hw.cache_bandwidth == 7e12 and hw.has_cache
    assert hw.write_bandwidth == 5e11
    assert Hardware.from_dict(hw.to_dict()) == hw
    path.write_text(json.dumps({"name": "g", "memory_bandwidth_gb_s": 1000,
                                "vector_tflops": {"fp32": 10}, "cache_mib": -1}))
    with pytest.raises(UsageError, match="cache capacity must be positive"):
        load_hardware(path)


def test_this_machine_measures_its_last_level_cache() -> None:
    from flopscope.estimate.this_machine import last_level_cache_bytes

    hw = measure_this_machine(gemm_size=128, copy_mib=8, repeats=1)
    capacity = last_level_cache_bytes()
    assert hw.cache_bytes == capacity
    if capacity is not None:  # reported by the OS: the bandwidth was measured
        assert hw.cache_bandwidth is not None and hw.cache_bandwidth > 0
        assert "last-level cache" in hw.description


def test_measure_only_the_dtypes_asked_for() -> None:
    hw = measure_this_machine(gemm_size=64, copy_mib=1, repeats=1, dtypes=("fp64",))
    assert set(hw.vector) == {"fp32", "fp64"}  # fp32 always: the fallback rate
    with pytest.raises(UsageError, match="cannot measure fp16"):
        measure_this_machine(dtypes=("fp16",))


def test_this_machine_matrix_rate_is_the_fastest_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A roof must not be beaten by any kernel of its kind: the matrix rate is the best of the
    GEMM probes (an n^3 and a 512^3 GEMM, in fp32 a 1x1 convolution), the convolution rate
    the best of two fp32 3x3 convolutions (oneDNN's, which on a CPU reach another fraction of
    the cores than BLAS); each special function has its element rate."""
    import flopscope.estimate.this_machine as this_machine

    monkeypatch.setattr(this_machine, "best_seconds", lambda fn, repeats: 1.0)  # every probe 1 s
    hw = measure_this_machine(gemm_size=64, copy_mib=1, repeats=1, dtypes=("fp64",))
    # with equal times each rate is its largest FLOP count: the GEMMs 2 x 64^3 = 524,288, in
    # fp32 also the 1x1 convolution 2 x 8 x 14 x 14 x 1024 x 256 = 822,083,584; the 3x3
    # convolutions 2 x 8 x 64 x 56 x 56 x 64 x 9 = 1,849,688,064 and
    # 2 x 8 x 256 x 14 x 14 x 256 x 9 = 1,849,688,064 (the same by design)
    assert hw.matrix["fp32"] == 822_083_584
    assert hw.matrix["fp64"] == 2 * 64**3
    assert hw.convolution == {"fp32": 1_849_688_064}
    assert hw.peak("fp32", True, True) == 1_849_688_064  # a convolution's products
    assert hw.peak("fp32", True) == 822_083_584  # any other matrix product
    assert hw.peak("fp64", True, True) == 2 * 64**3  # no fp64 convolution rate: the matrix one
    assert set(hw.special) == {"fp32"}
    assert set(hw.special["fp32"]) == set(SPECIAL_FUNCTIONS)
    again = Hardware.from_dict(hw.to_dict())
    assert again.convolution == pytest.approx(hw.convolution)


def test_special_function_rates_in_profile_files(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"name": "c", "memory_bandwidth_gb_s": 50,
                                "vector_tflops": {"fp32": 0.1},
                                "special_gelem_s": {"fp32": {"exp": 1.5, "tanh": 0.45}}}))
    (hw,) = load_hardware(path)
    assert hw.special == {"fp32": {"exp": 1.5e9, "tanh": 0.45e9}}
    assert hw.special_rate("fp32", "exp") == 1.5e9
    assert hw.special_rate("fp64", "exp") is None and hw.special_rate("fp32", "erf") is None
    assert Hardware.from_dict(hw.to_dict()) == hw
    for bad, message in [({"fp32": {"expo": 1}}, "no special function 'expo'"),
                         ({"fp33": {"exp": 1}}, "unknown dtype 'fp33'"),
                         ({"fp32": {"exp": 0}}, "the fp32 rate of exp must be positive"),
                         ({"fp32": 1.5}, "special_gelem_s must be a table")]:
        path.write_text(json.dumps({"name": "c", "memory_bandwidth_gb_s": 50,
                                    "vector_tflops": {"fp32": 0.1}, "special_gelem_s": bad}))
        with pytest.raises(UsageError, match=message):
            load_hardware(path)


def test_shipped_profiles_have_no_special_function_rates() -> None:
    # not applied on vendor profiles (see docs/roofline.md: no datasheet figure bounds the
    # library functions that PyTorch's kernels call)
    assert all(not hw.special for hw in PROFILES.values())


def test_special_rate_is_the_marginal_element_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    import flopscope.estimate.this_machine as this_machine

    def big() -> None: ...

    def one() -> None: ...

    monkeypatch.setattr(this_machine, "_special_probes", lambda numel: [("exp", big, one)])
    times = {big: 2e-3, one: 1e-5}
    monkeypatch.setattr(this_machine, "best_seconds", lambda fn, repeats: times[fn])
    # a 32 MiB cache: 32 MiB / 32 = 1,048,576 elements (input and output a quarter of it);
    # the one-element call's 1e-5 s is taken off: 1,048,575 / (2e-3 - 1e-5) per second
    assert this_machine._special_rates(1, 32 * 2**20) == {"exp": 1_048_575 / (2e-3 - 1e-5)}
    # no difference to take: elements / time
    times[one] = 2e-3
    assert this_machine._special_rates(1, 32 * 2**20) == {"exp": 1_048_576 / 2e-3}
    # unknown cache: 2^18 elements
    assert this_machine._special_rates(1, None) == {"exp": 2**18 / 2e-3}
