"""Overhead of :class:`flopscope.llm.monitor.TrainingMonitor`: 100 training steps of a small
transformer with and without monitoring, interleaved rounds, median ratio.

    python -m benchmarks.llm_monitor_overhead [--rounds 5] [--steps 100]

The monitored run counts its first step (a new signature) and reuses the count for the other 99;
the ratio is median(monitored) / median(plain). Target: at most 1.01.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from flopscope.llm.monitor import TrainingMonitor


class Small(nn.Module):
    """Embedding, 2 encoder layers (d = 128, 4 heads, causal), LM head; vocab 1000."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(128, 1000)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.layers(self.emb(ids), mask=mask, is_causal=True))


def run(steps: int, monitored: bool) -> float:
    """Seconds for ``steps`` training steps (a fresh model and optimizer each run)."""
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [torch.randint(0, 1000, (8, 128)) for _ in range(steps)]
    monitor = TrainingMonitor(model, peak=1e12) if monitored else None
    t0 = time.perf_counter()
    for ids in batches:
        if monitor is not None:
            monitor.begin(ids)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if monitor is not None:
            monitor.end()
    return time.perf_counter() - t0


def main() -> None:
    """Interleave plain and monitored runs; print medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain, monitored = [], []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for m in order:
            (monitored if m else plain).append(run(args.steps, m))
        print(f"round {r}: plain {plain[-1]:.3f} s, monitored {monitored[-1]:.3f} s", flush=True)
    p, m = statistics.median(plain), statistics.median(monitored)
    print(f"median plain {p:.3f} s, monitored {m:.3f} s, ratio {m / p:.4f} "
          f"({args.rounds} interleaved rounds of {args.steps} steps, 1 thread)")


if __name__ == "__main__":
    main()
