"""Pages to look at: a tiny model counted with every section a count can add, written by the
command line as HTML and as JSON (the same count, so the page's data must equal the JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.cli.conftest import TINY, cli
from torch import nn

from flopscope.cli import main

__all__ = ["GENERATE", "PLAN", "TINY_FULL", "attention_symbolic", "cli", "count_both", "plan_both"]  # cli: the command-line fixture, shared


def count_both(tmp_path: Path, *args: str) -> tuple[str, Any]:
    """``flopscope count ARGS`` written once as HTML and once as JSON: (page, parsed JSON)."""
    page, data = tmp_path / "r.html", tmp_path / "r.json"
    assert main(["count", *args, "--format", "html", "--output", str(page)]) == 0
    assert main(["count", *args, "--format", "json", "--output", str(data)]) == 0
    return page.read_text(encoding="utf-8"), json.loads(data.read_text(encoding="utf-8"))


TINY_FULL = (f"{TINY}:tiny", "--hardware", "h100-sxm", "--memory")


# a small Llama-style decoder generating: prefill of 8 tokens, then 2 decode steps
GENERATE = ("generate", "hf:llama", "--shape-only", "--config", "num_hidden_layers=2",
            "--config", "hidden_size=64", "--config", "intermediate_size=128",
            "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2",
            "--config", "vocab_size=256", "--prompt-len", "8", "--new-tokens", "3",
            "--hardware", "h100-sxm")


# a 4-layer Llama-style decoder (hidden 256, 8 heads, 4 KV heads) on 2 H100s, 2 sequences of 256
# tokens, a 20 MiB budget: 4 of its 8 layouts fit (tests/plan has the same model)
PLAN = ("plan", "hf:llama", "--gpus", "2", "--hardware", "h100", "--seq-len", "256",
        "--global-batch", "2", "--memory-budget", "20MiB", "--config", "vocab_size=512",
        "--config", "hidden_size=256", "--config", "intermediate_size=512",
        "--config", "num_hidden_layers=4", "--config", "num_attention_heads=8",
        "--config", "num_key_value_heads=4")


@pytest.fixture(scope="session")
def plan_both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """``flopscope plan PLAN`` written as HTML and as JSON: (the page's file, parsed JSON)."""
    folder = tmp_path_factory.mktemp("plan")
    page, data = folder / "plan.html", folder / "plan.json"
    assert main([*PLAN, "--format", "html", "--output", str(page)]) == 0
    assert main([*PLAN, "--format", "json", "--output", str(data)]) == 0
    return page, json.loads(data.read_text(encoding="utf-8"))


class _Attention(nn.Module):
    """A projection, then (h h^T) h: seq_len-squared terms beside linear ones."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return (h @ h.transpose(1, 2)) @ h


def attention_symbolic() -> Any:
    """:class:`_Attention` counted with symbols ``batch`` and ``seq_len`` (traced at 2 x 16)."""
    from flopscope.symbolic import count_symbolic

    return count_symbolic(_Attention(), torch.ones(2, 16, 8),
                          symbolic={"batch": (0, 0), "seq_len": (0, 1)})
