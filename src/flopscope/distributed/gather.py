"""Per-rank reports of a real job, gathered to one rank with ``torch.distributed`` itself."""

from __future__ import annotations

from typing import Any

from flopscope.report.report import Report

__all__ = ["gather_reports"]


def gather_reports(report: Report, dst: int = 0, group: Any = None) -> list[Report] | None:
    """Gather every rank's report to rank ``dst`` (a collective: every rank of ``group`` calls it).

    Reports travel as their JSON-ready dicts (``Report.to_dict``) through
    ``torch.distributed.gather_object``.

    Args:
        report: this rank's report.
        dst: the rank that receives them.
        group: the process group (``None``: the default group).

    Returns:
        On ``dst``, the reports in rank order; ``None`` on the other ranks.

    Raises:
        RuntimeError: torch.distributed is not initialized.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("gather_reports() needs an initialized torch.distributed process group")
    received: list[Any] | None = (
        [None] * dist.get_world_size(group) if dist.get_rank(group) == dst else None)
    dist.gather_object(report.to_dict(), received, dst=dst, group=group)
    if received is None:
        return None
    return [Report.from_dict(d) for d in received]
