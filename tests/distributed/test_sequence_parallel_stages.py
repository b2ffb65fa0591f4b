"""Sequence parallelism with pipeline stages run for real (slow tier: four gloo processes on
loopback, about 25 s here): the stage boundary carries sequence shards and each later stage
computes its rotary positions for the whole sequence, so the training loss is the unsharded
model's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.distributed._models import tiny_llama

from flopscope.execution.training import causal_lm_loss

pytestmark = pytest.mark.skipif(not os.environ.get("FLOPSCOPE_SLOW"),
                                reason="slow tier: FLOPSCOPE_SLOW=1")

ROOT = Path(__file__).resolve().parents[2]


def test_loss_with_sequence_parallel_stages_is_the_whole_models(tmp_path: Path) -> None:
    import torch.distributed as dist

    if not dist.is_gloo_available():
        pytest.skip("torch built without gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = tmp_path / "losses.json"
    subprocess.run([sys.executable, "-m", "tests.distributed._sp_stages_job", str(out),
                    str(port)], cwd=ROOT, check=True, timeout=600)
    got = json.loads(out.read_text())
    # the same token ids through the unsharded model, one microbatch (sequence) at a time
    model, _, kwargs = tiny_llama("cpu")
    ids = torch.randint(0, 512, kwargs["input_ids"].shape,
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = sum(float(causal_lm_loss(model(input_ids=ids[i:i + 1]).logits, ids[i:i + 1]))
                    for i in range(2)) / 2
    assert got["False"] == pytest.approx(whole, rel=1e-5)
    assert got["True"] == pytest.approx(whole, rel=1e-5)
