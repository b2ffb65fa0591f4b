"""Language-model workloads: generation step by step, model vs executed attention FLOPs,
FLOPs per token and MFU, and monitoring a training loop at almost no cost.

- :mod:`flopscope.llm.generate`: :class:`StepCounter` (any decode loop, ``generate()``),
  :func:`count_generation` (real or shape-only), :class:`GenerationReport`;
- :mod:`flopscope.llm.attention`: :class:`AttentionFigures` (counted / executed / model attention
  FLOPs); :mod:`flopscope.llm.pairs`: the causal and sliding-window pair counts, the CPU flash
  kernel's and FlashAttention-2's blocks;
- :mod:`flopscope.llm.flops`: FLOPs per token for training and inference, MFU and HFU, and the
  PaLM / Megatron / nanoGPT formulas;
- :mod:`flopscope.llm.monitor`: :class:`TrainingMonitor` (count once per input signature) and the
  ``transformers`` / Lightning callbacks in :mod:`flopscope.llm.integrations`.

See docs/llm.md.
"""

from __future__ import annotations

from flopscope.llm.attention import AttentionFigures, AttentionTotals
from flopscope.llm.generate import StepCounter, count_generation
from flopscope.llm.pairs import (
    causal_pairs,
    cpu_flash_block_sizes,
    cpu_flash_executed_pairs,
    flash2_block_sizes,
    flash2_executed_pairs,
    sliding_window_pairs,
)
from flopscope.llm.steps import GenerationReport, Step

__all__ = [
    "AttentionFigures",
    "AttentionTotals",
    "GenerationReport",
    "Step",
    "StepCounter",
    "causal_pairs",
    "count_generation",
    "cpu_flash_block_sizes",
    "cpu_flash_executed_pairs",
    "flash2_block_sizes",
    "flash2_executed_pairs",
    "sliding_window_pairs",
]
