"""MFU, HFU, MBU and tokens/s of a measured run, on the CLI: ``count --step-time`` and
``generate --step-time / --prefill-time``; the arithmetic written out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import flopscope
from flopscope.cli import main
from flopscope.llm.attention import AttentionFigures
from flopscope.llm.flops import Utilization, peak_flops, report_flops

MLP = '''
import torch
from torch import nn

def mlp():
    return nn.Linear(64, 32, bias=False), (torch.randn(8, 64),)
'''


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_count_step_time_mlp_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mlp.py").write_text(MLP)
    source = f"{tmp_path / 'mlp.py'}:mlp"
    # y = x W^T, x 8 x 64, W 32 x 64: 8 * 64 * 32 = 16,384 MACs = 32,768 FLOPs, no attention;
    # 0.5 s against a given 1e-6 TFLOP/s = 1e6 FLOP/s: MFU = 32,768 / 0.5 / 1e6 = 0.065536
    data = _json(capsys, ["count", source, "--step-time", "0.5", "--peak-tflops", "1e-6",
                          "--format", "json"])
    u = data["utilization"]
    assert isinstance(u, dict)
    assert u["model_flops"] == u["hardware_flops"] == 32_768
    assert u["mfu"] == pytest.approx(0.065536, rel=1e-12) and u["peak_name"] == "given"
    assert u["label"] == "forward" and u["tokens"] is None and u["mbu"] is None
    # with --backward, on a profile's peak; no attention, so model FLOPs = the report's total
    data = _json(capsys, ["count", source, "--backward", "--step-time", "2",
                          "--hardware", "h100-sxm", "--format", "json"])
    u = data["utilization"]
    assert isinstance(u, dict) and u["label"] == "forward + backward"
    # the peak: H100 SXM's float32 matrix rate (the model's dtype), from its profile
    assert u["peak_flops"] == peak_flops("h100-sxm", torch.float32)
    assert u["mfu"] == pytest.approx(u["model_flops"] / 2 / u["peak_flops"], rel=1e-12)
    assert u["model_flops"] == data["totals"]["flops"]


def test_count_step_time_llama_reads_attention_as_visible_pairs(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    argv = ["count", "hf:llama", "--shape-only", "--seq-len", "64", "--batch", "2",
            "--step-time", "0.25", "--peak-tflops", "0.001", "--format", "json",
            *[f"--config={k}={v}" for k, v in config.items()]]
    u = _json(capsys, argv)["utilization"]
    assert isinstance(u, dict)
    model = flopscope.sources.load_model("hf:llama", config=config, shape_only=True,
                                         seq_len=64, batch=2)
    figures = AttentionFigures(assume_mask="causal")
    report = flopscope.count(model.model, model.inputs, shape_only=True, warn=False,
                             observers=[figures])
    counted, model_flops, hardware = report_flops(report, figures)
    a = figures.total()
    # causal, top-left: (T + 1) / 2T of the dense scores are visible, T = 64
    assert a.model.macs * 2 * 64 == a.counted.macs * 65
    assert u["model_flops"] == model_flops == counted - a.counted.flops + a.model.flops
    assert u["hardware_flops"] == hardware
    assert u["tokens"] == 2 * 64 and u["tokens_per_second"] == 128 / 0.25
    assert u["mfu"] == pytest.approx(model_flops / 0.25 / 1e9, rel=1e-12)


def test_generate_step_time_mfu_and_mbu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
    argv = ["generate", "hf:llama", "--shape-only", "--prompt-len", "16", "--new-tokens", "3",
            "--step-time", "0.01", "--prefill-time", "0.02", "--hardware", "h100-sxm",
            "--peak-tflops", "1", "--format", "json",
            *[f"--config={k}={v}" for k, v in config.items()]]
    data = _json(capsys, argv)
    steps, (pre, dec) = data["steps"], data["utilization"]
    assert pre["label"] == "prefill" and pre["seconds"] == 0.02 and pre["tokens"] == 16
    assert pre["model_flops"] == steps[0]["model_flops"]
    assert pre["mfu"] == pytest.approx(steps[0]["model_flops"] / 0.02 / 1e12, rel=1e-12)
    # decode: 2 steps x 0.01 s, one token each
    assert dec["seconds"] == pytest.approx(0.02) and dec["tokens"] == 2
    assert dec["model_flops"] == steps[1]["model_flops"] + steps[2]["model_flops"]
    # weights (fp32): embedding 100 x 64 + LM head 64 x 100 + final norm 64 + 2 layers x (q 64x64,
    # k, v 64x32, o 64x64, gate/up/down 3 x 64x128, 2 norms of 64) = 86,848 params x 4 B;
    # KV cache per key: 2 (K, V) x 2 layers x 2 KV heads x 16 x 4 B = 512 B; decode step j
    # reads 16 + j keys and writes 1: 512 x (17 + 18 + 2) B
    weights = (100 * 64 * 2 + 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64)) * 4
    assert weights == 86_848 * 4
    assert dec["bytes"] == 2 * weights + 512 * (17 + 18 + 2)
    bandwidth = flopscope.estimate.PROFILES["h100-sxm"].memory_bandwidth
    assert dec["bandwidth"] == bandwidth
    assert dec["mbu"] == pytest.approx(dec["bytes"] / 0.02 / bandwidth, rel=1e-12)


@pytest.mark.parametrize(("argv", "message"), [
    (["count", "hf:llama", "--shape-only", "--step-time", "1"], "needs a peak: --hardware"),
    (["count", "hf:llama", "--shape-only", "--peak-tflops", "3"], "needs a measured time"),
    (["count", "hf:llama", "--step-time", "-1", "--peak-tflops", "3"], "above 0"),
    (["generate", "hf:llama", "--shape-only", "--prompt-len", "4", "--new-tokens", "1",
      "--step-time", "0.1", "--peak-tflops", "3"], "makes none"),
    # (generate --hardware without a time now gives each step's roofline: test_generate.py)
    (["generate", "hf:llama", "--shape-only", "--prompt-len", "4", "--new-tokens", "2",
      "--peak-tflops", "3"], "needs a measured time"),
    (["generate", "hf:llama", "--shape-only", "--prompt-len", "4", "--new-tokens", "2",
      "--hardware", "h900", "--step-time", "1"], "unknown hardware 'h900'"),
])
def test_step_time_usage_errors(argv: list[str], message: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_utilization_record() -> None:
    # 6e12 model FLOPs in 2 s on 1e13 FLOP/s = 30%; 4e12 bytes in 2 s of 4e12 B/s = 50%
    u = Utilization("step", 2.0, 6 * 10**12, 8 * 10**12, 1e13, "given", 4096, 4 * 10**12, 4e12)
    assert (u.mfu, u.hfu, u.mbu, u.tokens_per_second) == pytest.approx((0.3, 0.4, 0.5, 2048))
    assert "MFU 30.00% (HFU 40.00%)" in u.line() and "MBU 50.00%" in u.line()
