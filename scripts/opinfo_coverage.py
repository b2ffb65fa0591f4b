"""Run PyTorch's OpInfo database under flopscope and list what is not counted.

    python scripts/opinfo_coverage.py                 # no_grad and inference_mode, summary
    python scripts/opinfo_coverage.py --mode no_grad --json /tmp/opinfo_no_grad.json
    python scripts/opinfo_coverage.py --only fft --verbose

Every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` is run on the CPU in
float32 with its first ``--samples`` sample inputs (2 by default) inside a ``flopscope.Counter``,
under ``torch.no_grad()`` and under ``torch.inference_mode()``. For each OpInfo the script records
the ATen operators that ran with no rule (``Report.uncounted``) and any error raised *by flopscope*
(a sample whose plain call also fails is skipped, not blamed on flopscope). The summary gives the
OpInfos fully counted out of those that ran, then every distinct uncounted operator with its call
count and the OpInfos that reached it. The raw results go to ``--json`` (default under /tmp).

``check_opinfo`` is also used by ``tests/coverage/test_opinfo.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import flopscope

MODES = ("no_grad", "inference_mode")


@dataclass
class OpInfoResult:
    """What one OpInfo did under flopscope in one grad mode."""

    name: str  # OpInfo name with its variant, e.g. "fft.fft" or "max_pool2d_with_indices_backward"
    mode: str
    samples: int = 0  # samples that ran
    skipped: int = 0  # samples whose plain call (without flopscope) fails too
    uncounted: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # flopscope failures, one line each

    @property
    def ok(self) -> bool:
        """Every sample ran under flopscope and nothing was uncounted."""
        return not self.uncounted and not self.errors


def op_db() -> list[Any]:
    """PyTorch's OpInfo database (imported lazily: the import takes seconds)."""
    from torch.testing._internal.common_methods_invocations import op_db as db

    return list(db)


def opinfo_name(info: Any) -> str:
    """``name`` or ``name.variant`` for an OpInfo."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else str(info.name)


def _grad_mode(mode: str) -> contextlib.AbstractContextManager[Any]:
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def _samples(info: Any, dtype: torch.dtype, n: int) -> Iterator[Any]:
    it = iter(info.sample_inputs("cpu", dtype, requires_grad=False))
    for _ in range(n):
        try:
            yield next(it)
        except StopIteration:
            return


def _call(info: Any, sample: Any) -> Any:
    return info(sample.input, *sample.args, **sample.kwargs)


def check_opinfo(info: Any, mode: str, *, samples: int = 2,
                 dtype: torch.dtype = torch.float32) -> OpInfoResult:
    """Run the first ``samples`` sample inputs of ``info`` under flopscope in ``mode``.

    Args:
        info: an OpInfo from ``op_db``.
        mode: ``"no_grad"`` or ``"inference_mode"``.
        samples: how many sample inputs to run.
        dtype: the sample dtype (float32 by default); an OpInfo that does not support it on the
            CPU runs no sample.

    Returns:
        The uncounted operators (with call counts) and flopscope errors, summed over samples.
    """
    result = OpInfoResult(opinfo_name(info), mode)
    if dtype not in info.supported_dtypes("cpu"):
        return result
    try:
        inputs = list(_samples(info, dtype, samples))
    except Exception:  # noqa: BLE001 - a broken sample generator is torch's, not ours
        return result
    for sample in inputs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with _grad_mode(mode), flopscope.Counter(warn=False) as counter:
                    _call(info, sample)
            except Exception as exc:  # noqa: BLE001 - classified below
                try:
                    with _grad_mode(mode):
                        _call(info, sample)
                except Exception:  # noqa: BLE001 - fails without flopscope as well
                    result.skipped += 1
                    continue
                last = traceback.extract_tb(exc.__traceback__)[-1]
                result.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]} "
                                     f"({last.filename.rsplit('/', 1)[-1]}:{last.lineno})")
                continue
        result.samples += 1
        for op, calls in counter.report.uncounted.items():
            result.uncounted[op] = result.uncounted.get(op, 0) + calls
    return result


def run(mode: str, *, samples: int, only: str | None = None,
        verbose: bool = False) -> list[OpInfoResult]:
    """:func:`check_opinfo` for every OpInfo (whose name contains ``only``) in ``mode``."""
    results = []
    for info in op_db():
        name = opinfo_name(info)
        if only and only not in name:
            continue
        started = time.perf_counter()
        res = check_opinfo(info, mode, samples=samples)
        results.append(res)
        if verbose:
            status = "ok" if res.ok else f"uncounted={sorted(res.uncounted)} errors={res.errors}"
            print(f"[{mode}] {name} ({time.perf_counter() - started:.2f}s): {status}",
                  file=sys.stderr)
    return results


def summary(results: list[OpInfoResult]) -> str:
    """Counted OpInfos, crashes, and distinct uncounted operators with call counts."""
    ran = [r for r in results if r.samples or r.errors]
    ok = [r for r in ran if r.ok]
    ops: dict[str, tuple[int, list[str]]] = {}
    for r in ran:
        for op, calls in r.uncounted.items():
            total, names = ops.get(op, (0, []))
            ops[op] = (total + calls, [*names, r.name])
    mode = results[0].mode if results else "?"
    lines = [f"## {mode}: {len(ok)}/{len(ran)} OpInfos fully counted "
             f"({len(results) - len(ran)} ran no sample), {len(ops)} distinct operators uncounted, "
             f"{sum(1 for r in ran if r.errors)} OpInfos with flopscope errors"]
    for op, (calls, names) in sorted(ops.items()):
        shown = ", ".join(names[:4]) + (f", ... ({len(names)})" if len(names) > 4 else "")
        lines.append(f"  {op}  calls={calls}  [{shown}]")
    crashed = [r for r in ran if r.errors]
    if crashed:
        lines.append("errors:")
        for r in crashed:
            lines.append(f"  {r.name}: {r.errors[0]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--only", help="run only OpInfos whose name contains this")
    parser.add_argument("--json", default="/tmp/opinfo_coverage.json",
                        help="where the raw per-OpInfo results go")
    parser.add_argument("--verbose", action="store_true")
    ns = parser.parse_args(argv)
    torch.set_num_threads(1)
    raw: dict[str, Any] = {}
    for mode in MODES if ns.mode == "both" else (ns.mode,):
        results = run(mode, samples=ns.samples, only=ns.only, verbose=ns.verbose)
        print(summary(results))
        raw[mode] = [r.__dict__ for r in results]
    with open(ns.json, "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=1)
    print(f"raw results: {ns.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
