"""The whole validation page from stored runs: ``python -m benchmarks.validation_page``.

docs/validation.md is built from every ``runs/`` directory under ``docs/validation`` (one JSON
per measured workload, as :mod:`benchmarks.validation` writes them):

- ``zoo64/`` every torchvision classifier but the attention ones at 1x3x64x64, ``zoo224/`` the
  attention classifiers (vit, swin, maxvit) and inception_v3 at 1x3x224x224, ``runs/`` the first
  five CNNs at 224x224: the zoo table;
- ``ops/``: :mod:`benchmarks.validation_ops`, one row per operator and size (the per-module split
  of one run);
- ``transformers/``: :mod:`benchmarks.validation_transformers`, with the attention figures
  (counted, what the CPU flash kernel executes, what the model needs) stored beside each run;
- ``families/``: the zoo models of :data:`FAMILY_SPLIT` measured with every module a segment,
  with each module's type and counted operators stored beside each run: their gap per operator
  family (module type).

``--run`` first measures whatever is missing, group by group (resumable: a stored result with the
same options is kept), then writes the page; without it the page, CSV and plot are rewritten from
what is stored, in seconds.  Everything between the generated-section markers of the page is
rewritten; the prose around them is kept.

    .venv/bin/python -m benchmarks.validation_page --run      # the whole sweep, then the page
    .venv/bin/python -m benchmarks.validation_page            # the page from stored runs
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import plotting
from benchmarks.validation import Record, label_of, run, update_markdown

MARK_BEGIN = "<!-- flopscope-validation-page:begin (generated; edit outside these markers) -->"
MARK_END = "<!-- flopscope-validation-page:end -->"
COMMAND = "python -m benchmarks.validation_page"
DEVIATION = 0.02
"""Deviations above this are listed, each with its cause."""

ZOO_ATTENTION = ("inception_v3", "swin_t", "maxvit_t", "vit_b_16", "swin_s", "swin_b",
                 "swin_v2_t", "swin_v2_s", "swin_v2_b", "vit_b_32", "vit_l_16", "vit_l_32",
                 "vit_h_14")
"""Measured at 224x224 (fixed-size attention windows, inception's minimum input)."""

FAMILY_SPLIT = {"maxvit_t": 9}
"""Zoo models also measured with every module a segment (name -> module depth of the model), so
that their gap is split per operator family (the module types whose code ran)."""

NOT_YET = ("the resumable sweep has not reached them yet (`python -m benchmarks.validation_page "
           "--run --groups zoo64 zoo224` measures what is missing and keeps what is stored)")
"""Why a zoo model with no stored run and no reason of its own is not in the table yet."""


@dataclass(frozen=True)
class Group:
    """One ``runs/`` directory of the page and how its workloads are measured.

    Attributes:
        name: the directory under the root (``zoo64``).
        title: what its rows are.
        kind: ``zoo``, ``ops`` or ``transformers`` (which table shows them).
        sources: the SOURCEs ``--run`` measures (empty: only read what is stored).
        inputs: ``--input`` shapes.
        depth: module depth per source (default 1).
    """

    name: str
    title: str
    kind: str
    sources: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    depth: tuple[tuple[str, int], ...] = ()


def _torchvision_classifiers() -> list[str]:
    """Every torchvision classifier with published weights metadata, smallest first."""
    import torchvision.models as tvm
    from torchvision.models import get_model_weights, list_models

    names = []
    for name in list_models(module=tvm):
        weights = list(get_model_weights(name))
        ops = weights[0].meta.get("_ops", 0.0) if weights else 0.0
        names.append((ops, name))
    return [n for _, n in sorted(names)]


def groups() -> list[Group]:
    """The page's groups, with what ``--run`` measures in each.

    Returns:
        zoo64, zoo224, the first five CNNs at 224 (``runs/``), ops, transformers.
    """
    from benchmarks import validation_transformers as T
    from benchmarks import validation_zoo as Z

    try:
        zoo = _torchvision_classifiers()
    except ImportError:  # torchvision missing: the page is still written from stored runs
        zoo = []
    tf_file = "benchmarks/validation_transformers.py"
    return [
        Group("zoo64", "torchvision classifiers at 1x3x64x64", "zoo",
              tuple(f"torchvision:{n}" for n in zoo if n not in ZOO_ATTENTION), ("1x3x64x64",)),
        Group("zoo224", "attention classifiers and inception_v3 at 1x3x224x224", "zoo",
              tuple(Z.VARIANTS[n].source if n in Z.VARIANTS else f"torchvision:{n}"
                    for n in zoo if n in ZOO_ATTENTION)),
        Group(".", "the first five CNNs at 1x3x224x224 (benchmarks.validation's default)", "zoo"),
        Group("ops", "operator families", "ops", ("benchmarks/validation_ops.py:all_ops",)),
        Group("families", "zoo models measured module by module, split per operator family",
              "families", tuple(f"torchvision:{n}" for n in FAMILY_SPLIT),
              depth=tuple((f"torchvision:{n}", d) for n, d in FAMILY_SPLIT.items())),
        Group("transformers", "transformers at 1,024 tokens", "transformers",
              tuple(f"{tf_file}:{m}" for m in T.MODELS),
              depth=tuple((f"{tf_file}:{m}", d) for m, d in T.DEPTH.items())),
    ]


def load_runs(directory: Path) -> list[Record]:
    """Every stored record of a ``runs/`` directory, by file name.

    Args:
        directory: ``OUT/runs``.

    Returns:
        The records (unreadable files are skipped).
    """
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


# --- families and causes ---------------------------------------------------------------------------

def model_family(label: str) -> str:
    """The family of a model for the plot's colours (``resnext50_32x4d`` -> ``resnext``).

    Args:
        label: a model label (a torchvision name or a factory name).

    Returns:
        The family.
    """
    name = label.rsplit(":", 1)[-1]
    if name.startswith("wide_resnet"):
        return "wide_resnet"
    m = re.match(r"[a-z]+", name)
    return m.group(0) if m else name


CAUSES: tuple[tuple[str, str], ...] = (
    # (regex searched in "family/op" of an operator row or the family of a zoo model, cause);
    # first match wins.  Each is argued with the executed instructions in docs/validation.md.
    ("elementwise/exp", "exp counts 1 FLOP by convention; the vectorised float64 exp executes 19"),
    ("softmax/", "the exp inside (19 executed, 1 counted): 38-39 FLOPs per element vs 5"),
    ("activation/gelu_tanh", "tanh's evaluation: 137 FLOPs per element executed vs 9 counted"),
    ("activation/gelu", "erf's evaluation: 126 FLOPs per element executed vs 5 counted"),
    ("activation/silu", "sigmoid's exp and divide: 36 FLOPs per element executed vs 5 counted"),
    ("loss/cross_entropy", "the log-softmax inside (exp, log: 39 per element executed vs 5)"),
    ("loss/ctc", "the alpha recursion's log-sum-exp (exp and log1p per step, 1 FLOP each by "
                 "convention)"),
    ("elementwise/add", "add computes self + alpha * other: the multiply by alpha = 1 runs too "
                        "(2 per element vs 1)"),
    ("pooling/max_pool", "max pooling executes compares and blends, not maxpd: 0 arithmetic "
                         "FLOPs against 1 per window element counted"),
    ("pooling/avg_pool2d", "the kernel accumulates from zero and divides: 6 FLOPs per 2x2 window "
                           "vs 4 counted"),
    ("pooling/adaptive_avg|reduction/(sum|mean)", "the vectorised cascade sum: ~129 extra FLOPs "
     "per reduced row of 1,024 (partial accumulators combined) and ~4,400 per whole-tensor sum"),
    ("reduction/var", "Welford's algorithm: 6 FLOPs per element vs 4 for the two-pass formula "
                      "counted"),
    ("norm/layer_norm", "moments by the kernel's Welford-style pass plus the fused "
                        "normalisation: 10.9 FLOPs per element vs 8 counted"),
    ("norm/group_norm", "moments by a Welford-style pass (1.11: fewer per element than layer "
                        "norm's, the groups are long)"),
    ("conv/conv_transpose", "col2im adds the GEMM's overlapping columns into the output: ~2 "
                            "FLOPs per column element, 1/K of the product"),
    ("conv/|matmul/", "small-K GEMM: the blocked kernel adds K-panel partial sums into C, a few "
                      "FLOPs per output (K = 48 to 144 here)"),
    ("attention/sdpa_causal", "the exp cost of dense attention, times the fraction of score "
     "blocks the CPU flash kernel computes under is_causal: 3/4 at 1,024 tokens (measured "
     "causal/dense = 0.7500, flopscope's executed figure), all at 256 (one key block)"),
    ("attention/", "the exp of the softmax (19 executed, 1 counted) and the flash kernel's online "
                   "softmax rescaling: ~34 FLOPs per score beyond the count at d = 32"),
    ("distance/cdist_p1", "|d| is a logic instruction (andpd), not arithmetic: 2 of the 3 counted "
                          "FLOPs per coordinate execute"),
    ("distance/cdist_p2", "matrix-product path; per output pair beyond the count: the sqrt, "
                          "which torch runs as MKL's vdSqrt, 21 FLOPs per element on the SSE4.2 "
                          "path measured here (16 on AVX2) vs 1 counted (+20.0); the SSE GEMM "
                          "kernel at K = M + 2, 2K + 5 per output (+5.0; +0.06 on AVX2); its "
                          "packing of x1 scaled by alpha (+0.3); the row norms' cascade sum, 65 "
                          "per row (+2.0 at M = 16, +0.5 at M = 64)"),
    ("distance/pdist", "per-pair horizontal sum and root on short vectors (M = 16: +16 %)"),
    ("fft/", "pocketfft's mixed-radix algorithms execute 0.71-0.81 of the nominal 5 N log2 N "
             "(2.5 N log2 N real) for powers of two; N = 1000 needs radix-5 passes (1.08)"),
    ("linalg/svdvals", "under any dispatch mode (flopscope's counter) svdvals calls _linalg_svd "
                       "with compute_uv=True, so the count charges U and V; an uncounted run "
                       "computes values only"),
    ("linalg/svd", "LAPACK gesdd (divide and conquer) executes less than the Golub-Reinsch "
                   "estimate counted, and less at larger n"),
    ("linalg/eigh", "LAPACK syevd (divide and conquer with deflation) executes less than the 9n^3 "
                    "QR estimate counted"),
    ("linalg/inv", "torch computes inv as LU + solve(A, I): 2/3 n^3 + 2 n^3 = 8/3 n^3; runs "
                   "counted before ca50ea7 hold getri's 2 n^3 (the rule now counts 8/3 n^3: "
                   "1.023-1.037, blocked LAPACK at small n)"),
    ("linalg/qr", "blocked Householder (WY form: T factors, larfb updates) adds 11-14 %"),
    ("linalg/eig$", "Hessenberg reduction and QR iterations against the 25 n^3 estimate: "
                   "balancing and iterations cost relatively more at n = 32"),
    ("linalg/", "blocked LAPACK at small n: panel factorisations, pivot search and scaling; "
                "converges to the textbook count as n grows"),
    ("interpolation/bilinear", "two CPU kernels, chosen by output size: H + W > 128 runs the "
                               "generic one, two 1-D lerps then one across (3 multiplies + 3 "
                               "FMAs = 9 FLOPs per output vs 7 counted); H + W <= 128 runs the "
                               "vectorised channels-last one, 7 per output as counted plus 9 "
                               "per output pixel (4 weight products, source index) shared by "
                               "the C channels: 7 + 9/16 = 7.57"),
    ("loss/mse", "the cascade sum of the mean"),
    ("interpolation/nearest", "no arithmetic counted; a few hundred scalar FLOPs compute the "
                              "source indices in floating point"),
    ("efficientnet", "SiLU's exp (7.2x its count, operator table) and the squeeze-excitation "
                     "sigmoids; small-K 1x1 convolutions and average pools on small maps"),
    ("mobilenet|mnasnet", "small-K 1x1 and stem convolutions (K = 16-96 and 27), "
     "the global average pool's per-output overhead on 2x2 maps, and the exp of SiLU / "
     "sigmoid / hardswish's divide where present"),
    ("^vit$", "GELU's erf (126 FLOPs per element executed vs 5 counted) and MKL's SSE4.2 GEMM "
              "on token matrices: vit_h_14 at 112x112 (65 tokens) = erf 37 % of the gap, the odd "
              "65 rows computed as 66 (2-row registers) 36 %, weights packed with the alpha "
              "multiply 18 %, K-panel partial sums 4 %, softmax / layer norm / adds 4 %"),
    ("^maxvit$", "not split per operator family yet (`python -m benchmarks.validation_page --run "
                 "--groups families` measures every module and names the gap per module type)"),
    ("convnext|vit|swin", "GELU's erf, softmax's exp and layer norm's moments execute "
                                 "more than their conventions count (operator table)"),
    ("^[a-z_]+$", "small-K convolution GEMMs (the 3-channel stem: K = 27 or 147) and the global average "
         "pool's per-output overhead at 64x64"),
)


NOT_EXPLAINED = "not explained yet"
"""What :func:`cause_of` says when no pattern matches."""

TYPE_CAUSES: dict[str, str] = {
    # module type of a family split (the ``families`` group) -> the operator row that explains it
    "GELU": "activation/gelu", "SiLU": "activation/silu", "LayerNorm": "norm/layer_norm",
    "GroupNorm": "norm/group_norm",
    "AdaptiveAvgPool2d": "pooling/adaptive_avg", "AvgPool2d": "pooling/avg_pool2d",
    "MBConv": "elementwise/add", "PartitionAttentionLayer": "elementwise/add",
}
"""The cause of a module type's gap, as the operator table's key (:data:`CAUSES`)."""

OWN_CAUSES: dict[str, str] = {
    "Linear": "the blocked GEMM's K-panel partial sums added into C, a few FLOPs per output "
              "(the operator table's matmul rows: 1.003-1.021)",
    "Conv2d": "the convolution GEMMs' per-output overheads (the operator table's conv rows: "
              "1.000-1.031 for 3x3 and depthwise)",
    "RelativePositionalMultiHeadAttention": (
        "measured operator by operator on the first stage's shapes (64 windows x 2 heads x 49 "
        "tokens x 32; `flopscope measure benchmarks/validation_zoo.py:maxvit_attention_core "
        "--dtype float64`, detail/maxvit_attention_core.json): 1.343 as here, 77 % of it the "
        "softmax over 49-key rows (8.13x its count: 40.7 FLOPs per element executed vs 5, its "
        "exp), 14 % attention x values (1.103, K = 49: 10 extra FLOPs per output), 6 % q k^T "
        "(1.046, K = 32: 2.9 per output), 2 % the position-bias add (2.0, add's alpha multiply); "
        "the scale q * 32^-0.5 is exact"),
}
"""Causes of module types stated here rather than by one operator row (an attention module's own
code is several operators, measured operator by operator)."""


def cause_of(key: str, causes: Sequence[tuple[str, str]] = CAUSES) -> str:
    """The documented cause of a deviation, or a plain "not explained".

    Args:
        key: ``family/op`` of an operator row, or a model family.
        causes: (regex, cause) pairs, first match wins.

    Returns:
        The cause.
    """
    for pattern, cause in causes:
        if re.search(pattern, key):
            return cause
    return NOT_EXPLAINED


# --- rows ------------------------------------------------------------------------------------------

def _ratio(counted: int, measured: int) -> float | None:
    return measured / counted if counted else None


def _r(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def zoo_label(source: str) -> str:
    """How the zoo table names a model: its torchvision name, or its reduced-input variant's label
    (:data:`benchmarks.validation_zoo.VARIANTS`).

    Args:
        source: a SOURCE.

    Returns:
        The label.
    """
    from benchmarks.validation_zoo import VARIANTS

    return next((v.label for v in VARIANTS.values() if v.source == source), label_of(source))


def zoo_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """One row per zoo model.

    Args:
        records: stored records.

    Returns:
        Dicts with source, model, family, input, counted_macs, counted, measured, ratio, error.
    """
    rows = []
    for rec in records:
        res = rec.get("result") or {}
        inputs = ", ".join(res.get("inputs") or rec["request"].get("inputs") or ["default"])
        rows.append({
            "source": rec["source"],
            "model": zoo_label(rec["source"]), "family": model_family(zoo_label(rec["source"])),
            "input": inputs.split(":")[0], "counted_macs": res.get("counted_macs"),
            "counted": res.get("counted_flops"), "measured": res.get("measured_flops"),
            "ratio": res.get("ratio"), "error": rec.get("error"),
            "region_seconds": res.get("region_seconds"), "seconds": rec.get("seconds"),
            "gaps": largest_gaps(res),
        })
    return rows


def largest_gaps(result: dict[str, Any], n: int = 2) -> str:
    """The modules holding most of a model's gap, e.g. ``conv1 1.0725 (41 %)``.

    Args:
        result: a stored result (its per-module rows).
        n: how many.

    Returns:
        Up to ``n`` modules with their measured/counted and share of the gap, largest first.
    """
    gap = (result.get("measured_flops") or 0) - (result.get("counted_flops") or 0)
    mods = [m for m in result.get("modules", []) if m["measured_flops"] != m["counted_flops"]]
    if not gap or len(result.get("modules", [])) < 2:
        return ""
    mods.sort(key=lambda m: -abs(m["measured_flops"] - m["counted_flops"]))
    out = []
    for m in mods[:n]:
        name = f"`{m['path']}`" if m["path"] else "(outside modules)"
        r = (f"{m['measured_flops'] / m['counted_flops']:.3f}" if m["counted_flops"]
             else "n/a")
        out.append(f"{name} {r} ({(m['measured_flops'] - m['counted_flops']) / gap:.0%})")
    return ", ".join(out)


def op_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """One row per operator workload: the per-module rows of the ops runs.

    Args:
        records: stored records of :mod:`benchmarks.validation_ops` sources.

    Returns:
        Dicts with family, op, size, counted, measured, ratio, dtype.
    """
    rows = []
    for rec in records:
        res = rec.get("result")
        if res is None:
            continue
        modules = [m for m in res["modules"] if m["path"].count("__") == 2]
        if not modules and rec["source"].count("__") == 2:  # a single-op factory
            name = rec["source"].rsplit(":", 1)[-1]
            modules = [{"path": name, "counted_flops": res["counted_flops"],
                        "measured_flops": res["measured_flops"]}]
        for m in modules:
            family, op, size = m["path"].rsplit(".", 1)[-1].split("__")
            rows.append({"family": family, "op": op, "size": size,
                         "dtype": "float32" if op.endswith("_f32") else rec["request"]["dtype"],
                         "counted": m["counted_flops"], "measured": m["measured_flops"],
                         "ratio": _ratio(m["counted_flops"], m["measured_flops"])})
    return rows


def transformer_rows(records: Iterable[Record]) -> list[dict[str, Any]]:
    """One row per transformer run, with its attention figures.

    Args:
        records: stored records of :mod:`benchmarks.validation_transformers` sources (the
            ``attention`` entry is added by ``--run``).

    Returns:
        Dicts with model, counted, measured, ratio, and the attention kernel's counted /
        executed / model FLOPs, and the model total with attention as executed.
    """
    rows = []
    for rec in records:
        res = rec.get("result") or {}
        att = rec.get("attention") or {}
        if not att.get("counted"):  # no SDPA call the attention figures know (fused MHA, matmuls)
            att = {}
        counted = res.get("counted_flops")
        executed_total = (counted - att["counted"] + att["executed"]
                          if counted is not None and att else None)
        rows.append({
            "model": rec["source"].rsplit(":", 1)[-1], "input": ", ".join(res.get("inputs", [])),
            "counted": counted, "measured": res.get("measured_flops"), "ratio": res.get("ratio"),
            "attn_counted": att.get("counted"), "attn_executed": att.get("executed"),
            "attn_model": att.get("model"), "counted_as_executed": executed_total,
            "ratio_to_executed": (_ratio(executed_total, res["measured_flops"])
                                  if executed_total and res else None),
            "attn_segment_counted": _attn_segments(res, "counted_flops"),
            "attn_segment_measured": _attn_segments(res, "measured_flops"),
            "attn_segment_scope": _attn_scope(res),
            "error": rec.get("error"),
        })
    return rows


def family_rows(record: Record) -> list[dict[str, Any]]:
    """A model measured with every module a segment, summed per module type (operator family).

    Each module's segment holds the code of its own ``forward`` (its children have segments of
    their own), so a type's row is what its modules' own code counted and executed: ``GELU`` is
    the activation, ``RelativePositionalMultiHeadAttention`` the functional code of the attention
    module (score products, softmax, position bias).

    Args:
        record: a stored record of the ``families`` group (with ``module_types`` and
            ``module_ops`` added by ``--run``).

    Returns:
        Dicts with type, modules, counted, measured, ratio, share (of the model's gap) and ops
        (counted FLOPs per operator), largest gap first.
    """
    res = record.get("result") or {}
    types = record.get("module_types") or {}
    ops = record.get("module_ops") or {}
    gap = (res.get("measured_flops") or 0) - (res.get("counted_flops") or 0)
    acc: dict[str, dict[str, Any]] = {}
    for m in res.get("modules", []):
        kind = types.get(m["path"], "(outside modules)") if m["path"] else "(outside modules)"
        row = acc.setdefault(kind, {"type": kind, "modules": 0, "counted": 0, "measured": 0,
                                    "ops": {}})
        row["modules"] += 1
        row["counted"] += m["counted_flops"]
        row["measured"] += m["measured_flops"]
        for op, flops in (ops.get(m["path"]) or {}).items():
            row["ops"][op] = row["ops"].get(op, 0) + flops
    rows = [r for r in acc.values() if r["counted"] or r["measured"]]
    for r in rows:
        r["ratio"] = _ratio(r["counted"], r["measured"])
        r["share"] = (r["measured"] - r["counted"]) / gap if gap else None
    rows.sort(key=lambda r: -abs(r["measured"] - r["counted"]))
    return rows


def families_markdown(records: Sequence[Record]) -> list[str]:
    """One table per model of the ``families`` group: its gap per operator family.

    Args:
        records: stored records of the ``families`` group.

    Returns:
        Markdown lines.
    """
    lines: list[str] = []
    for rec in records:
        res = rec.get("result")
        if res is None or not rec.get("module_types"):
            continue
        inputs = ", ".join(res.get("inputs", [])).split(":")[0]
        lines += [f"**{label_of(rec['source'])}** ({inputs}, every module a segment: "
                  f"{len(res['modules'])} segments), measured/counted {res['ratio']:.4f}, gap "
                  f"{res['measured_flops'] - res['counted_flops']:,} FLOPs:", "",
                  "| module type (own code) | modules | counted FLOPs | measured FLOPs | "
                  "measured/counted | share of gap | counted operators |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for r in family_rows(rec):
            share = "-" if r["share"] is None else f"{r['share']:.1%}"
            ops = ", ".join(f"{op.removeprefix('aten.').removesuffix('.default')} {f:,}"
                            for op, f in sorted(r["ops"].items(), key=lambda kv: -kv[1]) if f)
            lines.append(f"| {r['type']} | {r['modules']} | {r['counted']:,} | "
                         f"{r['measured']:,} | {_r(r['ratio'])} | {share} | {ops or '-'} |")
        lines.append("")
    return lines


_ATTN_SEGMENT = re.compile(r"(self_attn|\.attn|attention\.self|self_attention)$")


def _attn_scope(res: dict[str, Any]) -> str:
    """``own code`` where the attention modules' children are segments of their own (their
    segment is then the attention call itself), ``with projections`` where they are not."""
    paths = [m["path"] for m in res.get("modules", [])]
    attn = [p for p in paths if _ATTN_SEGMENT.search(p)]
    if not attn:
        return ""
    own = any(p.startswith(a + ".") for a in attn for p in paths)
    return "own code" if own else "with projections"


def _attn_segments(res: dict[str, Any], key: str) -> int | None:
    segs = [m[key] for m in res.get("modules", []) if _ATTN_SEGMENT.search(m["path"])]
    return sum(segs) if segs else None


# --- outputs ---------------------------------------------------------------------------------------

def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


def zoo_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| model | family | input | counted MACs | counted FLOPs | measured FLOPs | "
             "measured/counted | largest gaps: module measured/counted (share of gap) |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        shown = f"**{r['ratio']:.4f}**" if r["ratio"] is not None else (
            "failed" if r["error"] else "not measured yet" if r.get("pending") else "-")
        lines.append(f"| {r['model']} | {r['family']} | {r['input']} | {_n(r['counted_macs'])} | "
                     f"{_n(r['counted'])} | {_n(r['measured'])} | {shown} | "
                     f"{r.get('gaps', '')} |")
    for r in rows:
        if r["error"]:
            lines.append(f"\n- **{r['model']} failed**: `{str(r['error']).splitlines()[0][:300]}`")
    lines += not_measured(rows)
    return lines


def not_measured(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Why each zoo model without a measurement at its own input has none: a reduced-input
    variant's reason, or :data:`NOT_YET` for the models the sweep has not reached.

    Args:
        rows: zoo rows.

    Returns:
        Markdown bullets (none when every model is measured as itself).
    """
    from benchmarks.validation_zoo import VARIANTS

    out = []
    for name, v in VARIANTS.items():
        itself = next((r for r in rows if r.get("source") == f"torchvision:{name}"), None)
        if itself is not None and itself["ratio"] is not None:
            continue  # measured at its own input too: the variant is one more row, no reason due
        row = next((r for r in rows if r.get("source") == v.source), None)
        if row is not None:
            how = "is measured" if row["ratio"] is not None else "is to be measured"
            out.append(f"\n- **{name} {how} as {v.label}**, not at its own input size: "
                       f"{v.reason}")
    waiting = [r["model"] for r in rows if r.get("pending")]
    if waiting:
        out.append(f"\n- **Not measured yet** ({len(waiting)}): {', '.join(waiting)} -- "
                   f"{NOT_YET}.")
    return out


def ops_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| family | operator | size | dtype | counted FLOPs | measured FLOPs | "
             "measured/counted |", "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = _r(r["ratio"]) if r["counted"] else ("0 / 0" if not r["measured"] else "n/a")
        if r["ratio"] is not None and abs(r["ratio"] - 1) > 0.03:
            ratio = f"**{ratio}**"
        lines.append(f"| {r['family']} | `{r['op']}` | {r['size']} | {r['dtype']} | "
                     f"{_n(r['counted'])} | {_n(r['measured'])} | {ratio} |")
    return lines


def family_summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per operator family: workloads, measured/counted range, how many within 3 %.

    Args:
        rows: operator rows.

    Returns:
        Markdown table lines.
    """
    lines = ["| family | workloads | measured/counted, lowest - highest | within 3 % |",
             "|---|---:|---|---:|"]
    for fam in sorted({r["family"] for r in rows}):
        sel = [r for r in rows if r["family"] == fam]
        ratios = [r["ratio"] for r in sel if r["ratio"] is not None]
        span = f"{min(ratios):.4f} - {max(ratios):.4f}" if ratios else "-"
        ok = sum(1 for x in ratios if abs(x - 1) <= 0.03)
        lines.append(f"| {fam} | {len(sel)} | {span} | {ok} |")
    return lines


def transformers_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| model | counted FLOPs | attention counted (dense) | attention executed (CPU flash "
             "blocks) | attention model (visible pairs) | counted, attention as executed | "
             "measured FLOPs | measured/counted | measured/(attention as executed) | attention "
             "modules: counted / measured (measured/counted; own code = the attention call "
             "alone, its projections are segments of their own) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        seg = "-"
        if r["attn_segment_counted"] is not None:
            seg_ratio = _ratio(r["attn_segment_counted"], r["attn_segment_measured"])
            seg = (f"{_n(r['attn_segment_counted'])} / {_n(r['attn_segment_measured'])} "
                   f"({_r(seg_ratio)}, {r.get('attn_segment_scope') or '-'})")
        lines.append(
            f"| {r['model']} | {_n(r['counted'])} | {_n(r['attn_counted'])} | "
            f"{_n(r['attn_executed'])} | {_n(r['attn_model'])} | {_n(r['counted_as_executed'])} | "
            f"{_n(r['measured'])} | {_r(r['ratio'])} | {_r(r['ratio_to_executed'])} | {seg} |")
    return lines


def family_cause(record: Record, causes: Sequence[tuple[str, str]] = CAUSES,
                 cover: float = 0.995) -> str:
    """A model's gap named per operator family from its family split, largest share first, until
    ``cover`` of the gap is named.

    Args:
        record: a stored record of the ``families`` group.
        causes: (regex, cause) pairs for the operator keys of :data:`TYPE_CAUSES`.
        cover: the share of the gap to name.

    Returns:
        ``"GELU 25.200 (91.5 % of the gap): erf's evaluation ...; ..."``.
    """
    out, named = [], 0.0
    for r in family_rows(record):
        if named >= cover or r["share"] is None or r["share"] <= 0:
            break
        named += r["share"]
        why = (OWN_CAUSES.get(r["type"]) or (cause_of(TYPE_CAUSES[r["type"]], causes)
                                             if r["type"] in TYPE_CAUSES else ""))
        out.append(f"{r['type']} {_r(r['ratio'])} ({r['share']:.1%} of the gap)"
                   + (f": {why}" if why else ""))
    return "per operator family (executed instructions of each module type's own code, table "\
           "above): " + "; ".join(out)


def deviations(zoo: Sequence[dict[str, Any]], ops: Sequence[dict[str, Any]],
               causes: Sequence[tuple[str, str]] = CAUSES,
               threshold: float = DEVIATION,
               families: Sequence[Record] = ()) -> list[str]:
    """Every row beyond ``threshold`` with its cause (one bullet each).

    Args:
        zoo: zoo rows.
        ops: operator rows.
        causes: (regex, cause) pairs.
        threshold: relative deviation.
        families: records of the ``families`` group: a zoo model with one gets its cause from
            its family split (:func:`family_cause`).

    Returns:
        Markdown bullets.
    """
    split = {rec["source"]: rec for rec in families
             if rec.get("result") and rec.get("module_types")}
    out = []
    for r in zoo:
        if r["ratio"] is not None and abs(r["ratio"] - 1) > threshold:
            cause = (family_cause(split[r["source"]], causes) if r["source"] in split
                     else cause_of(r["family"], causes))
            out.append(f"- {r['model']} ({r['input']}): {r['ratio']:.4f} - {cause}")
    for r in ops:
        key = f"{r['family']}/{r['op']}"
        if r["ratio"] is None or abs(r["ratio"] - 1) > threshold:
            if r["ratio"] is None and not r["measured"]:
                continue
            ratio = "measured without a count" if r["ratio"] is None else f"{r['ratio']:.4f}"
            out.append(f"- `{r['op']}` {r['size']} ({r['family']}): {ratio} - "
                       f"{cause_of(key, causes)}")
    return out


def write_csv(path: Path, zoo: Sequence[dict[str, Any]], ops: Sequence[dict[str, Any]],
              tfm: Sequence[dict[str, Any]]) -> None:
    """One row per zoo model, operator workload and transformer run.

    Args:
        path: the CSV file.
        zoo: zoo rows.
        ops: operator rows.
        tfm: transformer rows.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "name", "family", "size", "counted_flops", "measured_flops", "ratio",
                    "attention_counted", "attention_executed", "attention_model"])
        for r in zoo:
            w.writerow(["zoo", r["model"], r["family"], r["input"], r["counted"] or "",
                        r["measured"] or "", _r(r["ratio"]) if r["ratio"] else "", "", "", ""])
        for r in ops:
            w.writerow(["op", r["op"], r["family"], r["size"], r["counted"], r["measured"],
                        _r(r["ratio"]) if r["ratio"] else "", "", "", ""])
        for r in tfm:
            w.writerow(["transformer", r["model"], "transformer", r["input"], r["counted"] or "",
                        r["measured"] or "", _r(r["ratio"]) if r["ratio"] else "",
                        r["attn_counted"] or "", r["attn_executed"] or "", r["attn_model"] or ""])


def write_scatter(path: Path, points: Sequence[tuple[str, str, int, int]]) -> str | None:
    """Counted vs measured FLOPs, log-log, y = x, one colour per family.

    Args:
        path: the PNG.
        points: (label, family, counted, measured).

    Returns:
        ``None``, or why no plot was written.
    """
    points = [p for p in points if p[2] and p[3]]
    if not points:
        return "nothing both counted and measured"
    plt = plotting.pyplot()
    if plt is None:
        return plotting.MISSING
    panels = [("models (colour: model family)",
               [p for p in points if not p[1].startswith("op:")]),
              ("operators (colour: operator family)", [p for p in points if p[1].startswith("op:")])]
    panels = [(t, sel) for t, sel in panels if sel]
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 7), squeeze=False)
    cmap = plt.get_cmap("tab20")
    markers = "os^Dv<>P*Xh"
    for ax, (title, sel) in zip(axes[0], panels, strict=True):
        plotting.counted_vs_measured_axes(
            ax, [p[2] for p in sel] + [p[3] for p in sel], title=f"float64: {title}",
            ylabel="measured FLOPs (executed instructions, valgrind)")
        for i, fam in enumerate(sorted({p[1] for p in sel})):
            group = [p for p in sel if p[1] == fam]
            ax.scatter([p[2] for p in group], [p[3] for p in group], s=20, color=cmap(i % 20),
                       marker=markers[(i // 20) % len(markers)], label=fam.removeprefix("op:"),
                       zorder=3)
        ax.legend(fontsize=6, ncol=2, loc="upper left")
    plotting.save(plt, fig, path)
    return None


def page_markdown(root: Path, page: Path, gs: Sequence[Group], *, plot: bool = True) -> str:
    """The generated section: zoo, transformers and operator tables, deviations; writes the CSV
    and the plot beside the runs.

    Args:
        root: the directory holding the groups' directories.
        page: the Markdown page (for relative links).
        gs: the groups.
        plot: write the scatter plot.

    Returns:
        Markdown.
    """
    zoo: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    tfm: list[dict[str, Any]] = []
    fams: list[Record] = []
    for g in gs:
        records = load_runs(root / g.name / "runs")
        if g.kind == "families":
            fams += records
        elif g.kind == "zoo":
            rows = zoo_rows(records)
            done = {r["source"] for r in rows}
            rows += [{"source": s, "model": zoo_label(s), "family": model_family(zoo_label(s)),
                      "input": "x".join(g.inputs) or "1x3x224x224", "counted_macs": None,
                      "counted": None, "measured": None, "ratio": None, "error": None,
                      "pending": True, "gaps": ""} for s in g.sources if s not in done]
            order = {s: i for i, s in enumerate(g.sources)}
            rows.sort(key=lambda r: (order.get(r["source"], len(order)), r["counted"] or 0))
            zoo += rows
        elif g.kind == "ops":
            ops += op_rows(records)
        else:
            order = {s: i for i, s in enumerate(g.sources)}
            tfm += sorted(transformer_rows(records),
                          key=lambda r: min((i for s, i in order.items()
                                             if s.endswith(":" + r["model"])), default=99))
    rel = Path(_relative(root, page.parent))
    csv_path = root / "all_results.csv"
    plot_path = root / "counted_vs_measured_all.png"
    write_csv(csv_path, zoo, ops, tfm)
    problem = None
    if plot:
        pts = [(r["model"], r["family"], r["counted"], r["measured"]) for r in zoo if r["ratio"]]
        pts += [(r["model"], "transformer", r["counted"], r["measured"]) for r in tfm
                if r["ratio"]]
        pts += [(r["op"], f"op:{r['family']}", r["counted"], r["measured"]) for r in ops
                if r["ratio"]]
        problem = write_scatter(plot_path, pts)
    ok = [r for r in zoo if r["ratio"] is not None]
    pending = sum(1 for r in zoo if r.get("pending"))
    within = sum(1 for r in ok if abs(r["ratio"] - 1) <= 0.03)
    lines = ["", f"Generated by `{COMMAND}` from every `runs/` directory under "
             f"`{rel.as_posix()}/` ({len(zoo)} zoo rows, {len(tfm)} transformer runs, "
             f"{len(ops)} operator workloads).", ""]
    if ok:
        lo, hi = min(r["ratio"] for r in ok), max(r["ratio"] for r in ok)
        split = {rec["source"] for rec in fams if rec.get("module_types")}
        beyond = [r for r in ok if abs(r["ratio"] - 1) > 0.03]
        named = sum(1 for r in beyond if r["source"] in split
                    or cause_of(r["family"]) != NOT_EXPLAINED)
        lines += [f"Zoo: {len(ok)} models measured, measured/counted {lo:.4f} to {hi:.4f}; "
                  f"{within} within 3 %, {named} of the other {len(beyond)} with the cause of "
                  f"their gap named per operator family; {pending} not measured yet.", ""]
    lines += ["### Zoo", ""] + zoo_markdown(zoo) + [""]
    if families_markdown(fams):
        lines += ["#### Per operator family", ""] + families_markdown(fams)
    lines += ["### Transformers", ""] + transformers_markdown(tfm) + [""]
    lines += ["### Operator families", ""] + family_summary(ops) + [""] + ops_markdown(ops) + [""]
    if plot and problem is None:
        lines += [f"![counted vs measured FLOPs, log-log, y = x, one colour per family]"
                  f"({(rel / plot_path.name).as_posix()})", ""]
    lines += [f"Raw numbers: [{(rel / csv_path.name).as_posix()}]"
              f"({(rel / csv_path.name).as_posix()}).", ""]
    lines += [f"### Every deviation above {DEVIATION:.0%}", ""]
    lines += deviations(zoo, ops, families=fams) or ["- none"]
    lines.append("")
    return "\n".join(lines)


def _relative(target: Path, base: Path) -> str:
    import os

    return Path(os.path.relpath(target.resolve(), base.resolve())).as_posix()


def write_page(root: Path, page: Path, gs: Sequence[Group] | None = None, *,
               plot: bool = True) -> None:
    """Rewrite the generated section of ``page`` (and the CSV and plot under ``root``).

    Args:
        root: ``docs/validation``.
        page: ``docs/validation.md``.
        gs: the groups (default :func:`groups`).
        plot: write the plot.
    """
    text = page_markdown(root, page, groups() if gs is None else gs, plot=plot)
    if page.exists() and MARK_BEGIN in page.read_text():
        before, rest = page.read_text().split(MARK_BEGIN, 1)
        page.write_text(before + f"{MARK_BEGIN}\n{text}\n{MARK_END}" + rest.split(MARK_END, 1)[1])
    else:
        update_markdown(page, text, "Validation: counted vs measured FLOPs")
        content = page.read_text().replace(
            "<!-- flopscope-validate:begin (generated; edit outside these markers) -->\n" + text
            + "\n<!-- flopscope-validate:end -->", f"{MARK_BEGIN}\n{text}\n{MARK_END}")
        page.write_text(content)


def attention_figures(source: str, dtype: str = "float64") -> dict[str, int]:
    """Counted / executed / model attention FLOPs of one forward of a SOURCE (in this process).

    Args:
        source: the SOURCE.
        dtype: the dtype.

    Returns:
        ``{"counted", "executed", "model"}`` FLOPs of the attention operators.
    """
    import torch

    import flopscope
    from flopscope import sources
    from flopscope.llm import AttentionFigures

    torch.manual_seed(0)
    loaded = sources.load_model(source, dtype=dtype)
    model = loaded.model.eval()
    figures = AttentionFigures()
    with torch.no_grad(), flopscope.Counter(model, observers=[figures]):
        model(*loaded.args, **loaded.kwargs)
    t = figures.total()
    return {"counted": int(t.counted.flops), "executed": int(t.executed.flops),
            "model": int(t.model.flops)}


def module_ops(source: str, dtype: str = "float64",
               inputs: Sequence[str] = ()) -> dict[str, Any]:
    """Each module's type and the FLOPs counted in its own code, per operator (shape only).

    Args:
        source: the SOURCE.
        dtype: the dtype.
        inputs: ``--input`` shapes (empty: the source's own).

    Returns:
        ``{"module_types": {path: type name}, "module_ops": {path: {op: FLOPs}}}``.
    """
    import flopscope
    from flopscope import sources

    loaded = sources.load_model(source, inputs=[sources.parse_input(s) for s in inputs] or None,
                                dtype=dtype, shape_only=True)
    model = loaded.model.eval()
    report = flopscope.count(model, flopscope.Inputs(*loaded.args, **loaded.kwargs), warn=False)
    ops: dict[str, dict[str, int]] = {}
    for (path, op), stats in report.by_module_and_op().items():
        if stats.cost.flops:
            ops.setdefault(path, {})[op] = int(stats.cost.flops)
    return {"module_types": {p: type(m).__name__ for p, m in model.named_modules()},
            "module_ops": ops}


def run_groups(root: Path, gs: Sequence[Group], *, dtype: str = "float64",
               backend: str = "auto", progress: Callable[[str], None] | None = None) -> None:
    """Measure every group's missing workloads (resumable), storing attention figures.

    Args:
        root: ``docs/validation``.
        gs: the groups.
        dtype: the dtype.
        backend: the backend name.
        progress: stage messages.
    """
    from benchmarks.validation import run_file
    from flopscope.measure import MeasureRequest

    for g in gs:
        if not g.sources:
            continue
        depth = dict(g.depth)
        requests = [MeasureRequest(s, inputs=g.inputs, dtype=dtype, depth=depth.get(s, 1))
                    for s in g.sources]
        out = root / g.name
        records = run(requests, out, backend=backend, progress=progress)
        if g.kind == "families":
            for rec in records:
                if rec.get("result") and "module_types" not in rec:
                    rec.update(module_ops(rec["source"], dtype, g.inputs))
                    run_file(out, rec["source"]).write_text(json.dumps(rec, indent=1))
        if g.kind != "transformers":
            continue
        for rec in records:
            if rec.get("result") and "attention" not in rec:
                rec["attention"] = attention_figures(rec["source"], dtype)
                run_file(out, rec["source"]).write_text(json.dumps(rec, indent=1))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="docs/validation", help="directory of the groups")
    p.add_argument("--markdown", default="docs/validation.md", help="the page")
    p.add_argument("--run", action="store_true",
                   help="measure what is missing first (valgrind: hours for the whole zoo)")
    p.add_argument("--groups", nargs="+", default=None,
                   help="with --run: only these groups (zoo64 zoo224 ops transformers)")
    p.add_argument("--backend", default="auto", help="auto, perf, papi or valgrind")
    p.add_argument("--no-plot", action="store_true", help="skip the plot")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run (optionally) and write the page.

    Args:
        argv: the arguments.

    Returns:
        0.
    """
    args = _parser().parse_args(argv)
    start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    root = Path(args.root)
    gs = groups()
    if args.run:
        chosen = [g for g in gs if args.groups is None or g.name in args.groups]
        run_groups(root, chosen, backend=args.backend, progress=say)
    write_page(root, Path(args.markdown), gs, plot=not args.no_plot)
    say(f"wrote {args.markdown}, {root / 'all_results.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
