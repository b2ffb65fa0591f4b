"""Rules: what each operator costs.

The default rules live in one module per operator family; importing this package registers them
all. Use :func:`default_rules` for the shared, immutable default :class:`RuleSet`.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import NamedTuple

from flopscope.rules import (  # noqa: F401  (imported for their @rule registrations)
    attention,
    collectives,
    conv,
    distance,
    elementwise,
    fft,
    flex,
    grouped,
    linalg,
    loss,
    matmul,
    misc,
    normalization,
    optimizer,
    pooling,
    quantized,
    reduction,
    sampling,
    search,
    sparse,
    special,
    vision,
    zero_cost,
)
from flopscope.rules.registry import DEFAULT_TABLE, Rule, RuleSet, op_key, rule

__all__ = [
    "Convention",
    "Rule",
    "RuleSet",
    "conventions",
    "conventions_markdown",
    "default_rules",
    "op_key",
    "rule",
]

_FAMILIES = ["matmul", "grouped", "conv", "attention", "flex", "elementwise", "special", "reduction",
             "loss", "normalization", "pooling", "sampling", "distance", "fft", "linalg", "search",
             "sparse", "quantized", "vision", "optimizer", "misc", "collectives", "zero_cost"]


@cache
def default_rules() -> RuleSet:
    """The default rules of every operator family, as one immutable :class:`RuleSet`."""
    return RuleSet(DEFAULT_TABLE)


class Convention(NamedTuple):
    """One row of the conventions table: an operator family's rule and the operators it covers."""

    family: str
    rule: str
    ops: tuple[str, ...]
    text: str


def conventions(rules: RuleSet | None = None) -> list[Convention]:
    """Every rule with the operators it covers and its documented convention (from the docstring).

    This is the single source of ``docs/conventions.md`` and of ``flopscope rules``.
    """
    table = rules if rules is not None else default_rules()
    by_rule: dict[int, list[str]] = {}
    fns: dict[int, Rule] = {}
    for key in table:
        fn = table[key]
        by_rule.setdefault(id(fn), []).append(key)
        fns[id(fn)] = fn
    rows = []
    for ident, ops in by_rule.items():
        fn = fns[ident]
        module = getattr(fn, "__module__", "") or ""
        family = module.rsplit(".", 1)[-1] if module.startswith("flopscope.rules.") else "user"
        text = " ".join(inspect.cleandoc(fn.__doc__ or "(undocumented)").split())
        rows.append(Convention(family, getattr(fn, "__name__", repr(fn)), tuple(sorted(ops)), text))
    order = {name: i for i, name in enumerate(_FAMILIES)}
    rows.sort(key=lambda r: (order.get(r.family, len(order)), r.ops[0]))
    return rows


GENERAL_CONVENTIONS = """\
# Counting conventions

This page is generated from the rules themselves (`flopscope.rules.conventions_markdown()`, also
`flopscope rules --format markdown`); regenerate it with `python scripts/gen_conventions.py`. A test
checks that it is up to date.

## Units

- **MACs** (multiply-accumulates) are counted only for sums of products: the matmul family (`mm`,
  `bmm`, `addmm`, `baddbmm`, `linear`, `matmul`, `einsum`), convolution and transposed convolution,
  and the two products inside attention (Q K^T and P V). One MAC = one multiply plus one add.
- **FLOPs** are *every* floating-point operation, and include `2 * MACs`: a matmul of m x k by
  k x n is m\\*n\\*k MACs and 2\\*m\\*n\\*k FLOPs; bias adds, element-wise arithmetic,
  activations, reductions, normalization, softmax, pooling and interpolation add FLOPs (never
  MACs), per element as listed below.
- **Elementary functions** (exp, log, sqrt, rsqrt, erf, tanh, sin, pow ...) count as 1 FLOP each;
  composite functions are counted by their formula in those terms (sigmoid = neg, exp, add, divide
  = 4; softmax = max, subtract, exp, sum, divide = 5 per element).
- **Zero FLOPs** is a deliberate, listed decision (the `zero_cost` family below: views, reshapes,
  copies, dtype casts, indexing, `cat`, padding, tensor creation, random numbers). Those operators
  still move memory: `bytes_read` / `bytes_written` count their tensor inputs and outputs.
- **Views** (an output that aliases its input: `view`, `transpose`, `slice`, `expand` ...) move
  0 bytes.
- Bytes: by default every tensor input is read once and every output written once (`numel *
  itemsize`); an embedding lookup reads only the gathered rows.
- **An operator with no rule is decomposed** (`flopscope.core.decompose`): its
  `CompositeImplicitAutograd` kernel, else PyTorch's decomposition table (functional operators
  only), and the pieces are counted, recursively, under the original operator's name (its record
  is marked `decomposed`; `Report.decomposed` lists them). A rule wins over a table
  decomposition; a composite operator with no kernel of its own (`aten.conv2d`, `aten.linear`)
  is counted by its decomposition, because that is what runs - so `torch.inference_mode()`, where
  such operators reach the dispatcher undecomposed, counts exactly like `torch.no_grad()`. Bytes
  of a decomposed operator are its own inputs and outputs. Only an operator with neither rule nor
  decomposition is listed in `Report.uncounted` with its call count (one warning; `strict=True`
  raises) - never silently zero.
- **Integer work is not FLOPs** (`flopscope.core.numbers`): a call on integer or boolean tensors only
  (index arithmetic, `num_batches_tracked += 1`, quantized kernels) costs 0 FLOPs and keeps its
  bytes, and its MACs where it multiply-accumulates (MACs count sums of products whatever the
  data type: a quantized convolution's MACs equal the float one's, as torchvision publishes them).
  Example: `(torch.arange(1000) + 1) * 2` is 0 FLOPs; `torch.arange(1000) * 0.5` is 1,000.
- **Complex arithmetic is counted in real operations**: a complex MAC is 4 real MACs (4
  multiplies + 4 adds), a complex add 2 FLOPs, multiply 6, divide 11, absolute value 4, other
  element-wise operations 2 per element (an estimate). A complex64 `nn.Linear(4, 3)` on 2 rows is
  96 MACs, not 24. FFT and dense linear algebra rules count complex numbers themselves. A rule
  you give is taken as it is.
- **Higher-order operators** are counted by what they run: `cond` the branch taken,
  `while_loop` every iteration, `flex_attention` by its rule (the blocks of its BlockMask that a
  kernel computes; dense without one). Where the body needs values a fake tensor does not have,
  the operator is listed as uncounted.
- **Tensor subclasses**: wrapper subclasses (jagged nested tensors, DTensor) are counted by the
  operators they run on their inner tensors (a nested tensor's packed rows: attention over
  sequences of 2, 3 and 5 tokens counts 2^2 + 3^2 + 5^2 score rows per head, not 5 x 5 x 3);
  strided nested tensors are costed component by component; sparse tensors by their stored
  entries (a sparse-dense product is nnz x n MACs) and the bytes of their values and indices.
- **Variable-length attention** (`cum_seq_q`/`cu_seqlens_q` offsets): the sum over sequences of
  L_q x L_k, read from the offsets (shape-only: the bound min(total_q x max_k, max_q x total_k)).
- In-place (`add_`) and `out=` forms cost the same as the functional form. Backward operators have
  their own rules (gradients of a product are two products of the same size).

## Relation to other tools

- torch's `torch.utils.flop_counter.FlopCounterMode` counts only matmul, convolution and
  attention, as 2 per multiply-accumulate: its total equals flopscope's `2 * report.macs` wherever
  it has a formula for every operator that ran (it has none for the CPU attention kernels
  `_scaled_dot_product_flash_attention_for_cpu` and `_native_multi_head_attention`, so it misses
  attention on the CPU).
- torchvision's published `weights.meta["_ops"]` ("GFLOPS") are MACs of conv/matmul operators:
  they equal flopscope's `report.macs`.
- thop and fvcore report MACs under the name "FLOPs"; ptflops reports MACs as "MACs".

## Attention: counted, executed and model FLOPs

The report's totals count every attention kernel *dense* (B x H x L_q x L_k scores, whatever the
mask): the **counted** figure, a reproducible upper bound that equals torch's FlopCounterMode.
`flopscope.llm.AttentionFigures` (an observer) gives two more, labelled, per call and per phase,
and `AttentionFigures.adjust(report.total(), "model" | "executed")` reads the totals either way:

- **executed**: what the selected kernel computes. The CPU flash kernel
  (`_scaled_dot_product_flash_attention_for_cpu`, ATen `cpu/FlashAttentionKernel.cpp`) uses query
  blocks of 256 / 64 / 32 rows (L_q >= 768 / >= 192 / shorter) and key blocks of 512; under
  `is_causal` it skips key blocks wholly above the diagonal and computes diagonal blocks whole
  (L = 1024: 75% of the dense scores; checked under valgrind in float64: measured causal /
  measured dense = 0.7500, docs/llm.md). GPU kernels' block skipping is not modelled (executed =
  counted there).
- **model**: the visible query-key pairs (causal top-left T (T + 1) / 2 per head, bottom-right,
  sliding windows, explicit boolean/additive masks read from real tensors, BlockMask `mask_mod`,
  variable lengths); in the backward 2d + 2d_v MACs per visible pair (the kernel's recomputation
  of Q K^T is executed work, not model work). This is what MFU uses.

| tool / paper | attention under a causal mask |
| --- | --- |
| flopscope report totals, torch FlopCounterMode, fvcore, DeepSpeed profiler | dense (counted) |
| flopscope `AttentionFigures` model figure | visible pairs, (T + 1) / 2T of dense |
| PaLM (Chowdhery et al. 2022, App. B), torchtitan, nanoGPT, Megatron-LM (Narayanan et al. 2021) | dense: 12 L H Q T per token (fwd + bwd), no halving |
| FlashAttention papers' benchmark TFLOP/s (Dao et al. 2022/2023) | causal = half the dense FLOPs |
| Chinchilla (Hoffmann et al. 2022, App. F) | dense, attention logits and values included |

## Rules by operator family

Each row is one rule: the operators it covers and its convention, with the derivation (from the
rule's docstring).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def conventions_markdown(rules: RuleSet | None = None) -> str:
    """The conventions page (``docs/conventions.md``) as Markdown: the general conventions, then one
    table per operator family with every rule, its operators and its derivation.

    Args:
        rules: the rules to document; the defaults when ``None``.

    Returns:
        The Markdown text, ending with a newline.
    """
    import importlib

    rows = conventions(rules)
    out = [GENERAL_CONVENTIONS]
    family = None
    for row in rows:
        if row.family != family:
            family = row.family
            out.append(f"\n### {family}\n")
            if family != "user":
                doc = importlib.import_module(f"flopscope.rules.{family}").__doc__ or ""
                intro = " ".join(inspect.cleandoc(doc).split())
                if intro:
                    out.append(f"{_cell(intro)}\n")
            out.append("| operators | convention |")
            out.append("| :--- | :--- |")
        ops = ", ".join(f"`{op}`" for op in row.ops)
        out.append(f"| {ops} | {_cell(row.text)} |")
    return "\n".join(out) + "\n"
