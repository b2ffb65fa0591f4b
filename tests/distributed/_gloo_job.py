"""A real 2-process job on the CPU (gloo, loopback): each rank shards the tiny Llama with a layout,
counts itself with ``count_rank`` and the reports are gathered to rank 0 with ``gather_reports``.

Run: ``python -m tests.distributed._gloo_job OUT.json PORT`` (writes, for each layout of
:data:`LAYOUTS`, the list of the ranks' report dicts).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

#: the layouts the job runs, as keyword arguments of Layout (world size 2)
LAYOUTS: list[dict[str, Any]] = [{"tp": 2}, {"fsdp": 2}, {"pp": 2}]
WORLD = 2


def run_ranks(rank: int, out: str, port: int, reports: Callable[[int], Iterator[Any]]) -> None:
    """One rank of a real gloo job of WORLD ranks on loopback: each report ``reports(rank)``
    yields is gathered to rank 0 with ``gather_reports`` as it comes, and rank 0 writes the
    gathered lists (report dicts) to ``out`` as JSON."""
    import torch.distributed as dist

    from flopscope.distributed import gather_reports

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        gathered = [gather_reports(report) for report in reports(rank)]
        if rank == 0:
            with open(out, "w") as f:
                json.dump([[r.to_dict() for r in ranks] for ranks in gathered], f)
    finally:
        dist.destroy_process_group()


def _layout_reports(rank: int) -> Iterator[Any]:
    """The tiny Llama under each layout of :data:`LAYOUTS`, counted on this rank."""
    from tests.distributed._models import tiny_llama

    from flopscope.distributed import Layout, apply_layout, count_rank
    from flopscope.distributed.simulate import count_stage

    for kw in LAYOUTS:
        layout = Layout(WORLD, rank=rank, **kw)
        model, args, kwargs = tiny_llama("cpu")
        if layout.pp > 1:  # 2 microbatches, 1F1B
            yield count_stage(model, kwargs["input_ids"], layout, backward=True, warn=False)
        else:
            apply_layout(model, layout, layout.mesh())
            yield count_rank(model, args, kwargs, backward=True, warn=False)


def _rank(rank: int, out: str, port: int) -> None:
    run_ranks(rank, out, port, _layout_reports)


def main() -> None:
    """Spawn the two ranks."""
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD)


if __name__ == "__main__":
    main()
