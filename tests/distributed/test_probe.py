"""The collective probe (issue 29): real gloo processes time collectives; ``flopscope calibrate
--comm`` fits the profile's link figures to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flopscope.cli import main
from flopscope.distributed import probe
from flopscope.errors import UsageError
from flopscope.estimate import get_hardware
from flopscope.estimate.link_calibration import LinkPoint, fit_alpha_beta


def test_two_gloo_ranks_time_collectives() -> None:
    # 2 real processes (gloo, loopback); one repetition per point: a few seconds
    points = probe.probe_links(2, sizes=(1024, 65536), kinds=("all_reduce", "reduce_scatter",
                                                                "send"), repeats=1)
    got = {(p.kind, p.ranks, p.payload_bytes): p for p in points}
    assert set(got) == {(k, 2, s) for k in ("all_reduce", "reduce_scatter", "send")
                        for s in (1024, 65536)}
    # bus bytes of 2 ranks: all-reduce 2 x 1/2 x S = S; reduce-scatter 1/2 x S; send S
    assert got["all_reduce", 2, 65536].bus_bytes == 65536
    assert got["reduce_scatter", 2, 65536].bus_bytes == 32768
    assert got["send", 2, 1024].bus_bytes == 1024
    assert all(p.seconds > 0 and p.spread == 0 for p in points)  # one repetition: no spread


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ranks": 1}, "at least 2 ranks, not 1"),
    ({"backend": "mpi"}, "unknown backend 'mpi'"),
    ({"kinds": ("all_to_all",)}, "does not time all_to_all"),
])
def test_probe_refuses_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        probe.probe_links(**kwargs)  # type: ignore[arg-type]


def _fake_points(ranks: int = 2, **_: object) -> list[LinkPoint]:
    # t = 100 us + bus / 1 GB/s
    return [LinkPoint(k, ranks, s, s, 1e-4 + s / 1e9) for k in ("all_reduce", "send")
            for s in (1024, 1 << 20, 1 << 24)]


def test_cli_calibrate_comm_writes_the_fit_into_the_link_fields(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "probe_links", _fake_points)
    base = tmp_path / "base.json"
    base.write_text(json.dumps(get_hardware("epyc-9654").to_dict()))
    out = tmp_path / "links.json"
    code = main(["calibrate", "--comm", "--ranks", "4", "--hardware", str(base), "--output",
                 str(out)])
    assert code == 0
    err = capsys.readouterr().err
    assert "timing collectives on 4 gloo processes" in err
    assert "intra-node link: latency 100 us, bandwidth 1.00 GB/s" in err
    data = json.loads(out.read_text())
    assert data["intra_node_gb_s"] == pytest.approx(1.0)
    assert data["intra_node_latency_us"] == pytest.approx(100)
    assert "inter_node_gb_s" not in data
    block = data["link_calibration"]
    assert block["backend"] == "gloo" and block["ranks"] == 4 and block["link"] == "intra"
    assert len(block["points"]) == 6 and set(block["kinds"]) == {"all_reduce", "send"}
    assert block["versions"]["torch"]
    hw = get_hardware(str(out))
    assert hw.link_calibration is not None
    assert hw.matrix == get_hardware("epyc-9654").matrix  # the rest of the profile kept
    expected = fit_alpha_beta(_fake_points())
    assert hw.link_calibration.fit.latency == pytest.approx(expected.latency)
    assert hw.link_calibration.fit.bandwidth == pytest.approx(expected.bandwidth)


@pytest.mark.parametrize(("argv", "message"), [
    (["--ranks", "4"], "--ranks configure the collective probe: add --comm"),
    (["--comm", "--ranks", "1"], "--ranks 1: the collective probe needs at least 2 ranks"),
    (["--comm", "--threads", "1"], "--comm times collectives"),
    (["--comm", "--backend", "nccl"], "--backend nccl with 2 ranks needs 2 GPUs"),
])
def test_cli_calibrate_comm_usage_errors(argv: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.json"
    assert main(["calibrate", "--hardware", "h100", "--output", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
