"""A screened role's collectives from its reference's runs (:func:`stage_records` for a pipeline
stage, :func:`role_records` for a role without stages; see :mod:`flopscope.plan.screen`).
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from flopscope.cost import Phase
from flopscope.plan.reference import (
    EMBEDDING,
    PIPELINE_MICROBATCHES,
    REFERENCE_LAYERS,
    Reference,
    gather_share,
)
from flopscope.plan.roles import RoleKey
from flopscope.report.records import CommRecord
from flopscope.rules.collectives import BUS_FACTORS

__all__ = ["role_records", "stage_records"]


def _part(module: str, layers: str) -> str:
    if module.startswith(layers + "."):
        return "layer"
    return "embed" if module == EMBEDDING or module.startswith(EMBEDDING + ".") else "rest"


def _records(records: Iterable[CommRecord], layers: str
             ) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    """Collectives summed by (phase, kind, group, part)."""
    out: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    for r in records:
        key = (r.phase.value, r.kind, r.group, _part(r.module, layers))
        calls, payload = out.get(key, (0, 0))
        out[key] = (calls + r.calls, payload + r.payload_bytes)
    return out


def _record(key: RoleKey, phase: str, kind: str, group: str, calls: Fraction, payload: Fraction
            ) -> list[CommRecord]:
    size = key.dp if group == "dp" else key.tp
    n_calls, pay = round(calls), round(payload)
    if n_calls <= 0 or (group == "dp" and key.dp == 1):
        return []
    return [CommRecord("", Phase(phase), kind, size, n_calls, pay,
                       int(pay * BUS_FACTORS[kind](size)), group)]


def role_records(key: RoleKey, ref: Reference, k: int) -> list[CommRecord]:
    """A role without stages' collectives from its runs of 3 and 4 layers (one microbatch)."""
    run_a, run_b = ref.pair()
    a = _records(run_a.report.communication, ref.layers)
    b = _records(run_b.report.communication, ref.layers)
    out: list[CommRecord] = []
    for (phase, kind, group, part) in sorted({*a, *b}):
        ca, pa = a.get((phase, kind, group, part), (0, 0))
        cb, pb = b.get((phase, kind, group, part), (0, 0))
        if part == "layer":  # affine in the layer count (the first and last layers differ)
            first_n = REFERENCE_LAYERS[0]
            ca, pa = ca + (k - first_n) * (cb - ca), pa + (k - first_n) * (pb - pa)
        out += _record(key, phase, kind, group, Fraction(ca), Fraction(pa))
    return out


def stage_records(key: RoleKey, ref: Reference, k: int, first: bool, last: bool, m: int
                   ) -> list[CommRecord]:
    """A pipeline stage's collectives from the reference pipeline's (``M`` =
    :data:`PIPELINE_MICROBATCHES`): a layer's ``D = F2 - F1``; the tensor-parallel ones per
    microbatch (``m / M``), FSDP2's all-gathers as the stage's schedule makes them in each
    phase (:func:`~flopscope.plan.reference.gather_share`) and its reduce-scatters once a
    step; the first stage's outside its layers ``F1 - D``, the last stage's from its runs at
    ``M`` and ``M + 1`` microbatches on their line at ``m``, with ``k - 1`` more layers; the
    hidden states sent and received one each way per microbatch and stage boundary."""
    f1, l1, l2, f2 = (_records(r.report.communication, "") for r in ref.pipeline())
    big_m = PIPELINE_MICROBATCHES
    out: list[CommRecord] = []
    for (phase, kind, group, part) in sorted({*f1, *f2, *l1, *l2}):
        if group == "pp":
            continue
        c1, p1 = f1.get((phase, kind, group, part), (0, 0))
        c2, p2 = f2.get((phase, kind, group, part), (0, 0))
        per = (Fraction(m, big_m) if group != "dp"
               else gather_share(phase, m, key.pp - key.stage) if kind == "all_gather"
               else Fraction(1))
        if last:
            e1, q1 = l1.get((phase, kind, group, part), (0, 0))
            e2, q2 = l2.get((phase, kind, group, part), (0, 0))
            calls = e1 + (m - big_m) * (e2 - e1) + (k - 1) * per * (c2 - c1)
            payload = q1 + (m - big_m) * (q2 - q1) + (k - 1) * per * (p2 - p1)
        else:
            calls, payload = k * per * (c2 - c1), k * per * (p2 - p1)
            if first:  # outside the layers: per microbatch (tensor parallel) or per step
                outside = per if group != "dp" else Fraction(1)
                calls += outside * (c1 - (c2 - c1))
                payload += outside * (p1 - (p2 - p1))
        out += _record(key, phase, kind, group, Fraction(calls), Fraction(payload))
    # the reference pipeline's first stage sends one microbatch's hidden states per send
    sends = [r for r in ref.pipeline()[0].report.communication if r.kind == "send"]
    hidden = m * sum(r.payload_bytes for r in sends) // max(1, sum(r.calls for r in sends))
    for phase, kind, needed in ((Phase.FORWARD, "send", not last), (Phase.BACKWARD, "recv", not last),
                                (Phase.FORWARD, "recv", not first),
                                (Phase.BACKWARD, "send", not first)):
        if needed:
            out.append(CommRecord("", phase, kind, key.pp, m, hidden, hidden, "pp"))
    return out
