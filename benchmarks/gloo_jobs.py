"""Real multi-process training jobs on this CPU (gloo, loopback) for the communication
validation (``benchmarks/comm_validation.py``): a small Llama-style model trained with AdamW in
one layout, each rank's step time and peak memory measured.

A job spawns ``world`` processes (``torch.multiprocessing``, spawn; a file store, no port), one
intra-op thread each. Every rank builds the same model (``flopscope.sources.load_model`` of
``hf:llama`` with the config below, real weights, float32, seed 0), shards it with
:func:`flopscope.distributed.apply_layout` (the planner's layouts: tensor parallelism's standard
Llama plan, FSDP2 on every decoder layer and the root), or splits it into 1F1B pipeline stages
(:class:`flopscope.distributed.pipeline.DecoderStage`, torch's ``PipelineStage`` and
``Schedule1F1B``), activation checkpointing with transformers' own switch (non-reentrant). The
loss is the planner's: a causal LM's cross-entropy (:func:`flopscope.execution.training
.causal_lm_loss`), on the vocabulary shards under ``loss_parallel()`` in tensor-parallel layouts
without stages (the planner's default loss parallelism). Each step: a barrier, forward and
backward (timed: what the planner's step time models), then AdamW's step and ``zero_grad``
(timed apart: compared with the planned step's optimizer update, ``StepTime.optimizer``; its
minor page faults counted, ``optimizer_faults``).

Peak memory per rank, measured independently of flopscope: ``torch.profiler`` with
``profile_memory=True`` over one more step (forward, backward, optimizer), whose allocation
events carry PyTorch's CPU allocator's running total of the bytes allocated since profiling
began (net of their frees); its maximum, plus the bytes live when the step starts (the rank's
parameter shards, AdamW's moments and step counters, buffers and its token ids, each storage
once), is the rank's peak. (Checked on an MLP's training step against torch's own memory
timeline, ``MemoryProfileTimeline``: the same peak to the byte; the timeline itself is not used
because building it fails on some of these runs with a "version mismatch" assertion.)
Allocations inside the gloo library itself (its own socket buffers) are not PyTorch tensors
and are not in it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

CONFIG: dict[str, Any] = dict(vocab_size=4096, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
"""The model: 4 layers, hidden 256, 8 heads (4 KV heads), MLP 512, vocabulary 4096."""
SEQ = 256


@dataclass(frozen=True)
class Job:
    """One layout of a real job."""

    name: str
    world: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    microbatches: int
    checkpoint: bool
    sequence_parallel: bool = False
    ddp: bool = False  # torch's DistributedDataParallel (whole replicas) instead of FSDP2
    zero1: bool = False  # with ddp: torch's ZeroRedundancyOptimizer (AdamW's state sharded)
    keep: bool = False  # FSDP2's reshard_after_forward=False (the planner's zero2, Z2)

    @property
    def global_batch(self) -> int:
        """Sequences per step."""
        return self.dp * self.micro_batch * self.microbatches

    @property
    def label(self) -> str:
        """The planner's label of this layout (``Choice.label``)."""
        return (f"TP{self.tp} PP{self.pp} {'DDP' if self.ddp else 'DP'}{self.dp}"
                + (" Z1" if self.zero1 else "") + (" Z2" if self.keep else "")
                + (" SP" if self.sequence_parallel else "")
                + f" mb{self.micro_batch}x{self.microbatches}"
                + (" ckpt" if self.checkpoint else ""))


JOBS = [
    Job("FSDP 2", 2, 1, 1, 2, 1, 1, False),
    Job("TP 2", 2, 2, 1, 1, 2, 1, False),
    Job("FSDP 2, checkpointing", 2, 1, 1, 2, 1, 1, True),
    Job("TP 2, checkpointing", 2, 2, 1, 1, 2, 1, True),
    Job("PP 2", 2, 1, 2, 1, 1, 2, False),
    Job("PP 2, checkpointing", 2, 1, 2, 1, 1, 2, True),
    Job("FSDP 4", 4, 1, 1, 4, 1, 1, False),
    Job("FSDP 4, checkpointing", 4, 1, 1, 4, 1, 1, True),
    Job("TP 2 x DP 2", 4, 2, 1, 2, 2, 1, False),
    Job("TP 2 x DP 2, checkpointing", 4, 2, 1, 2, 2, 1, True),
    Job("PP 2 x DP 2", 4, 1, 2, 2, 1, 2, False),
    Job("PP 2 x DP 2, checkpointing", 4, 1, 2, 2, 1, 2, True),
    # sequence parallelism (the planner searches it: --sequence-parallel search)
    Job("TP 2, SP", 2, 2, 1, 1, 2, 1, False, True),
    Job("TP 2, SP, checkpointing", 2, 2, 1, 1, 2, 1, True, True),
    Job("TP 2 x DP 2, SP", 4, 2, 1, 2, 2, 1, False, True),
    # DDP (the planner's --data-parallel ddp, simulated as FSDP2's hybrid sharding with shards
    # of one; here torch's own DistributedDataParallel, default buckets)
    Job("DDP 2", 2, 1, 1, 2, 1, 1, False, ddp=True),
    Job("DDP 2, checkpointing", 2, 1, 1, 2, 1, 1, True, ddp=True),
    Job("DDP 4", 4, 1, 1, 4, 1, 1, False, ddp=True),
    # ZeRO-1 (the planner's --data-parallel zero1): DDP with torch's ZeroRedundancyOptimizer
    Job("DDP 2, ZeRO-1", 2, 1, 1, 2, 1, 1, False, ddp=True, zero1=True),
    Job("DDP 4, ZeRO-1", 4, 1, 1, 4, 1, 1, False, ddp=True, zero1=True),
    # FSDP2 keeping each layer's gathered parameters from forward to backward (the planner's
    # --data-parallel zero2)
    Job("FSDP 2, kept", 2, 1, 1, 2, 1, 1, False, keep=True),
    Job("FSDP 2, kept, checkpointing", 2, 1, 1, 2, 1, 1, True, keep=True),
    Job("FSDP 4, kept", 4, 1, 1, 4, 1, 1, False, keep=True),
]


def _live_bytes(*groups: Any) -> int:
    seen: dict[int, int] = {}
    for group in groups:
        for t in group:
            if isinstance(t, torch.Tensor):
                local = t.to_local() if hasattr(t, "to_local") else t
                s = local.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _optimizer_tensors(opt: torch.optim.Optimizer) -> list[Any]:
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer: this rank's shard's AdamW
    return [v for state in inner.state.values() for v in state.values()]


def _allocator_peak(prof: Any) -> int:
    """The most bytes the profiled step had allocated beyond what was live when it started:
    the largest ``total_allocated`` of the profiler's allocation events (PyTorch's CPU
    allocator reports its running total of the blocks allocated since profiling began, and
    their frees, to the profiler)."""
    from torch._C._profiler import _EventType
    from torch.profiler._utils import traverse_dfs

    tree = prof.profiler.kineto_results.experimental_event_tree()
    return max((int(n.extra_fields.total_allocated) for n in traverse_dfs(tree)
                if n.tag == _EventType.Allocation), default=0)


def _rank(rank: int, job: Job, store: str, out: str, steps: int, warmup: int) -> None:
    import resource

    import torch.distributed as dist

    from flopscope import sources
    from flopscope.distributed import Layout, apply_layout
    from flopscope.execution.training import causal_lm_loss

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=job.world, timeout=datetime.timedelta(seconds=300))
    try:
        loaded = sources.load_model("hf:llama", batch=job.global_batch, seq_len=SEQ,
                                    config=CONFIG, dtype="float32")
        model = loaded.model
        model.train()
        ids = loaded.inputs.kwargs.get("input_ids", loaded.inputs.args[0] if loaded.inputs.args
                                       else None)
        assert isinstance(ids, torch.Tensor)
        if job.checkpoint:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        # the planner's training step: cross-entropy as transformers computes it, on the
        # vocabulary shards (loss parallelism) in tensor-parallel layouts without stages
        parallel_loss = job.tp > 1 and job.pp == 1
        layout = Layout(job.world, tp=job.tp, fsdp=job.dp, pp=job.pp, rank=rank,
                        loss_parallel=parallel_loss, sequence_parallel=job.sequence_parallel,
                        keep_gathered=job.keep)
        mesh = layout.mesh()
        dp_rank = mesh["dp"].get_local_rank() if job.dp > 1 else 0
        per = job.micro_batch * job.microbatches
        local = ids[dp_rank * per:(dp_rank + 1) * per].contiguous()
        if job.ddp:
            from torch.nn.parallel import DistributedDataParallel

            module = model = DistributedDataParallel(model)  # type: ignore[assignment]

            def fwd_bwd() -> None:
                causal_lm_loss(model(input_ids=local).logits, local).backward()
        elif job.pp == 1:
            apply_layout(model, layout, mesh)
            module: torch.nn.Module = model

            from torch.distributed.tensor.parallel import loss_parallel

            def fwd_bwd() -> None:
                with loss_parallel() if parallel_loss else contextlib.nullcontext():
                    causal_lm_loss(model(input_ids=local).logits, local).backward()
        else:
            from torch.distributed import pipelining

            from flopscope.distributed.pipeline import DecoderStage

            config = model.config
            stage = DecoderStage(model, layout.stage, job.pp)
            apply_layout(stage, layout, mesh)
            module = stage
            mb = job.micro_batch
            hidden = (mb, SEQ, int(config.hidden_size))
            last = layout.stage == job.pp - 1
            example_in = (torch.empty(mb, SEQ, dtype=ids.dtype) if layout.stage == 0
                          else torch.empty(hidden, requires_grad=True))
            example_out = torch.empty((mb, SEQ, int(config.vocab_size)) if last else hidden,
                                      requires_grad=True)
            pipe = pipelining.PipelineStage(stage, layout.stage, job.pp, torch.device("cpu"),
                                            input_args=(example_in,),
                                            output_args=(example_out,),
                                            group=mesh["pp"].get_group())
            sched = pipelining.Schedule1F1B(pipe, n_microbatches=job.microbatches,
                                            loss_fn=causal_lm_loss)

            def fwd_bwd() -> None:
                if layout.stage == 0:
                    sched.step(local)
                elif last:
                    sched.step(target=local)
                else:
                    sched.step()
        opt: Any = torch.optim.AdamW(module.parameters(), lr=1e-5)
        if job.zero1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(module.parameters(), optimizer_class=torch.optim.AdamW,
                                          lr=1e-5)
        times: list[tuple[float, float]] = []
        faults: list[int] = []  # minor page faults of each optimizer step (this process's)
        for i in range(warmup + steps):
            dist.barrier()
            t0 = time.perf_counter()
            fwd_bwd()
            t1 = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            opt.step()
            opt.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            if i >= warmup:
                times.append((t1 - t0, t2 - t1))
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        dist.barrier()
        start = _live_bytes(module.parameters(), module.buffers(), _optimizer_tensors(opt),
                            [local])
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fwd_bwd()
            opt.step()
            opt.zero_grad(set_to_none=True)
        result = {"rank": rank, "stage": layout.stage, "times": times,
                  "optimizer_faults": faults,
                  "live_at_start": start, "peak_delta": _allocator_peak(prof)}
        gathered: list[Any] = [None] * job.world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def run_job(job: Job, *, steps: int = 5, warmup: int = 2, timeout_s: float = 600
            ) -> dict[str, Any]:
    """Run ``job`` on ``job.world`` local gloo processes.

    Returns:
        Per step, the slowest rank's forward + backward and optimizer times; their medians and
        spread; per rank the peak memory (the module docstring); the load average.
    """
    from torch.multiprocessing.spawn import start_processes

    with tempfile.TemporaryDirectory(prefix="flopscope-job-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        load = os.getloadavg()[0]
        begin = time.perf_counter()
        context = start_processes(_rank, args=(job, store, out, steps, warmup),
                                  nprocs=job.world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{job.name}: not done in {timeout_s} s")
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
        ranks = json.loads(Path(out).read_text())
    fwd_bwd = [max(r["times"][i][0] for r in ranks) for i in range(steps)]
    optim = [max(r["times"][i][1] for r in ranks) for i in range(steps)]
    return {
        "job": asdict(job), "label": job.label, "load_before": load,
        "load_after": os.getloadavg()[0], "wall_s": time.perf_counter() - begin,
        "fwd_bwd_s": fwd_bwd, "optimizer_s": optim,
        "fwd_bwd_median_s": statistics.median(fwd_bwd),
        "fwd_bwd_spread_s": max(fwd_bwd) - min(fwd_bwd),
        "optimizer_median_s": statistics.median(optim),
        # the most minor page faults a rank took in its optimizer step, per step
        "optimizer_faults": [max(r["optimizer_faults"][i] for r in ranks) for i in range(steps)],
        "peak_bytes": {str(r["rank"]): r["live_at_start"] + r["peak_delta"] for r in ranks},
        "live_at_start_bytes": {str(r["rank"]): r["live_at_start"] for r in ranks},
        "stage_of_rank": {str(r["rank"]): r["stage"] for r in ranks},
    }
