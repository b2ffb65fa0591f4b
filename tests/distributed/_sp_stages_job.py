"""A real 4-process gloo job on the CPU: the tiny Llama's training loss under PP 2 x TP 2 with and
without sequence parallelism (the stage boundary then carries sequence shards), through torch's
pipeline schedule, written by the last stage's first rank.

Run: ``python -m tests.distributed._sp_stages_job OUT.json PORT``.
"""

from __future__ import annotations

import json
import os
import sys

WORLD = 4


def _losses(rank: int, sequence_parallel: bool) -> float | None:
    """The step's cross-entropy (mean over 2 microbatches) on the last stage, ``None`` elsewhere."""
    import torch
    from tests.distributed._models import tiny_llama
    from torch.distributed import pipelining

    from flopscope.distributed import Layout, apply_layout
    from flopscope.distributed.pipeline import DecoderStage
    from flopscope.execution.training import causal_lm_loss

    layout = Layout(WORLD, tp=2, pp=2, rank=rank, sequence_parallel=sequence_parallel)
    model, _, kwargs = tiny_llama("cpu")
    ids = torch.randint(0, 512, kwargs["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    stage = DecoderStage(model, layout.stage, layout.pp, layout.sequence_shards)
    mesh = layout.mesh()
    apply_layout(stage, layout, mesh)
    mb, seq = ids.shape[0] // 2, ids.shape[1]
    hidden = (mb, seq // layout.sequence_shards, int(model.config.hidden_size))
    last = layout.stage == layout.pp - 1
    example_in = torch.empty(mb, seq, dtype=ids.dtype) if layout.stage == 0 else torch.empty(
        hidden, requires_grad=True)
    example_out = torch.empty(mb, seq, int(model.config.vocab_size), requires_grad=True) \
        if last else torch.empty(hidden, requires_grad=True)
    pipe = pipelining.PipelineStage(stage, layout.stage, layout.pp, torch.device("cpu"),
                                    input_args=(example_in,), output_args=(example_out,),
                                    group=mesh["pp"].get_group())
    sched = pipelining.ScheduleGPipe(pipe, n_microbatches=2, loss_fn=causal_lm_loss)
    losses: list[torch.Tensor] = []
    if layout.stage == 0:
        sched.step(ids)
    else:
        sched.step(target=ids, losses=losses)
    return float(sum(float(x.detach()) for x in losses) / 2) if last else None


def _rank(rank: int, out: str, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        found = {str(sp): _losses(rank, sp) for sp in (False, True)}
        if rank == WORLD // 2:  # the last stage's first tensor-parallel rank
            with open(out, "w") as f:
                json.dump(found, f)
    finally:
        dist.destroy_process_group()


def main() -> None:
    """Spawn the four ranks."""
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD)


if __name__ == "__main__":
    main()
