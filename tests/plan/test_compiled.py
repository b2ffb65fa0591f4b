"""Plans of compiled steps (``plan(..., compiled=True)``, ``flopscope plan --compiled``): the
calibration predicts no host time per call (CUDA graphs, torch.compile), the kernels as eager's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import flopscope
from flopscope.estimate import get_hardware
from flopscope.estimate.predict import predictor
from flopscope.estimate.profile import compiled_hardware
from flopscope.plan import ServePlan

# the serving tests' model: hidden 256, 8 heads, 4 KV heads, MLP 512, 4 layers, vocab 512
CONFIG: dict[str, Any] = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
SERVE = dict(gpus=2, hardware="h100-sxm", config=CONFIG, seq_len=64, mode="serve",
             max_new_tokens=8, batches=[1, 4], memory_budget=64 * 2**20)


def test_a_compiled_call_has_no_host_time_and_the_same_device_time() -> None:
    from flopscope.estimate import CallLog

    eager = get_hardware("h100-sxm")
    compiled = compiled_hardware(eager, True)
    assert compiled.calibration is not None and compiled.calibration.compiled
    assert eager.calibration is not None and not eager.calibration.compiled
    assert compiled_hardware(eager, False) is eager
    bare = get_hardware("xeon-8480")  # no calibration: the bound, which has no host time
    assert compiled_hardware(bare, True) is bare
    log = CallLog()
    flopscope.count(nn.Sequential(nn.Linear(64, 64), nn.GELU()), torch.randn(8, 64),
                    observers=[log])
    for rec in log.records:
        before = predictor(eager.calibration).call(rec, 1e-12)
        after = predictor(compiled.calibration).call(rec, 1e-12)
        assert after.host_s == 0.0 and after.device_s == before.device_s
        assert after.family == before.family
    assert any(predictor(eager.calibration).call(r, 1e-12).host_s > 0 for r in log.records)


def test_a_compiled_serving_plan_is_the_eager_plans_time_without_the_host() -> None:
    """Every row without stages: the compiled step is the eager step's device work and
    collectives (``latency_per_token_without_host_s``), never host-bound; its words say
    compiled."""
    eager, compiled = (flopscope.plan("hf:llama", **SERVE, compiled=c) for c in (False, True))
    assert isinstance(eager, ServePlan) and isinstance(compiled, ServePlan)
    rows = {(c.label, c.batch): c for c in eager.ranked}
    checked = 0
    for c in compiled.ranked:
        if c.layout.pp != 1:
            continue
        e = rows[(c.label, c.batch)]
        assert c.decode.total == pytest.approx(e.decode.device_only, rel=1e-12)
        assert c.decode.host == 0.0 and not c.host_bound
        checked += 1
    assert checked >= 4  # TP1 and TP2 at batch 1, 4 and the largest
    assert "compiled: no host time per call" in compiled.to_dict()["prediction"]["source"]
    assert "compiled" not in eager.to_dict()["prediction"]["source"]


def test_cli_compiled_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from flopscope.cli import main

    flags = [a for k, v in CONFIG.items() for a in ("--config", f"{k}={v}")]
    argv = ["plan", "hf:llama", "--serve", "--gpus", "2", "--hardware", "h100", "--seq-len",
            "64", "--max-new-tokens", "8", "--batch", "1", "--memory-budget", "64MiB",
            "--compiled", *flags]
    assert main(argv) == 0
    assert "compiled: no host time per call" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["count", "generate"])
def test_count_and_generate_predict_a_compiled_step(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--compiled`` with ``--hardware``: no host time in the prediction (a count's host 0, its
    step the device's; a generation's decode step shorter: the eager one is the host's) and its
    label says compiled; without ``--hardware`` a one-line usage error."""
    import json

    from flopscope.cli import main

    model = (["count", "torchvision:resnet18", "--shape-only"] if command == "count" else
             ["generate", "hf:llama", "--shape-only", "--prompt-len", "8", "--new-tokens", "3",
              "--config=num_hidden_layers=1", "--config=hidden_size=64",
              "--config=intermediate_size=128", "--config=num_attention_heads=4",
              "--config=num_key_value_heads=2", "--config=vocab_size=256"])
    runs = {}
    for compiled in (False, True):
        argv = [*model, "--hardware", "h100-sxm", "--format", "json",
                *(["--compiled"] if compiled else [])]
        assert main(argv) == 0
        runs[compiled] = json.loads(capsys.readouterr().out)["estimate"]["prediction"]
    if command == "count":
        assert runs[False]["host_s"] > 0 and runs[True]["host_s"] == 0.0
        assert runs[True]["step_s"] < runs[False]["step_s"]
    else:
        assert runs[True]["decode_step_s"] < runs[False]["decode_step_s"]
    assert "compiled: no host time per call" in runs[True]["source"]
    assert "compiled" not in runs[False]["source"]
    assert main([*model, "--compiled"]) == 2
    assert "--compiled predicts with a --hardware profile" in capsys.readouterr().err
