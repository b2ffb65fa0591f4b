"""Peak memory: flopscope's tracker against torch.profiler on the same real CPU run.

For each model and workload (a no-grad forward in eval mode; a steady-state training step with
SGD (momentum 0.9) and with AdamW), flopscope's ``peak_memory`` is compared with the peak that
``torch.profiler`` (``profile_memory=True``) sees while the same workload runs again outside
flopscope: the profiler's allocation and free events in time order give the peak *above* what
was live when profiling started; what was live then (parameters, buffers, inputs, optimizer
state, counted storage by storage) is added to get the absolute peak. The training step is
measured the way ``peak_memory`` defines it: one warm-up step, ``zero_grad(set_to_none=True)``,
then forward, ``default_loss(output).backward()``, ``step()``.

``python -m benchmarks.memory_validation [--out docs/memory] [--models resnet18,...]`` writes
``memory_validation.json`` (cases already in it are kept, not measured again) and
``memory_validation.png``, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import flopscope.estimate as fe


def _models(batch: int) -> dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]]:
    def tv(name: str) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
        def build() -> tuple[nn.Module, tuple[Any, ...]]:
            import torchvision

            return getattr(torchvision.models, name)(), (torch.randn(batch, 3, 224, 224),)
        return build

    def bert() -> tuple[nn.Module, tuple[Any, ...]]:
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(attn_implementation="sdpa"))  # BERT-base: 12 x 768
        return model, (torch.randint(0, 30522, (batch, 128)),)

    def llama() -> tuple[nn.Module, tuple[Any, ...]]:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                             attn_implementation="sdpa")
        return LlamaForCausalLM(config), (torch.randint(0, 32000, (batch, 128)),)

    return {"resnet18": tv("resnet18"), "resnet50": tv("resnet50"), "vit_b_16": tv("vit_b_16"),
            "bert-base": bert, "tiny-llama": llama}


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def _profiled_peak(fn: Callable[[], Any]) -> int:
    """Peak of allocated minus freed bytes, in time order, while ``fn`` runs: the profiler's
    allocation events (every CPU allocation through c10's allocator, kernel scratch included),
    read from its event tree."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    del out
    events: list[tuple[int, int]] = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        todo.extend(node.children)
    events.sort(key=lambda x: x[0])
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def _optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3)


def measure(name: str, build: Callable[[], tuple[nn.Module, tuple[Any, ...]]],
            workload: str) -> dict[str, Any]:
    """One comparison row.

    Args:
        name: the model's name.
        build: returns (model, inputs).
        workload: ``"inference"``, ``"train-sgd"`` or ``"train-adamw"``.

    Returns:
        flopscope's and the profiler's peaks (bytes), the deviation, and where the peak was.
    """
    torch.manual_seed(0)
    model, inputs = build()
    start = time.perf_counter()
    if workload == "inference":
        model.eval()
        _, mem = fe.peak_memory(model, *inputs)
        seconds = time.perf_counter() - start
        baseline = _storage_bytes([*model.parameters(), *model.buffers(), *inputs])

        def run() -> Any:
            with torch.no_grad():
                return model(*inputs)
    else:
        opt_name = workload.split("-", 1)[1]
        _, mem = fe.peak_memory(model, *inputs, train=True,
                                optimizer=lambda p: _optimizer(opt_name, p))
        seconds = time.perf_counter() - start
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = _optimizer(opt_name, params)

        def step() -> None:
            fe.default_loss(model(*inputs)).backward()
            opt.step()

        step()  # warm-up: optimizer state
        opt.zero_grad(set_to_none=True)
        state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        baseline = _storage_bytes([*model.parameters(), *model.buffers(), *inputs, *state])

        def run() -> Any:
            step()
            return None
    delta = _profiled_peak(run)
    measured = baseline + delta
    ours_delta = mem.peak_bytes - sum(mem.at_peak.get(c, 0) for c in (
        "parameters", "buffers", "inputs")) - (mem.at_peak.get("optimizer_state", 0)
                                               if workload != "inference" else 0)
    return {
        "model": name, "workload": workload, "flopscope_peak": mem.peak_bytes,
        "profiler_peak": measured, "deviation": mem.peak_bytes / measured - 1,
        "baseline": baseline, "profiler_delta": delta, "flopscope_delta_approx": ours_delta,
        "peak_module": mem.peak_module, "peak_phase": mem.peak_phase, "peak_op": mem.peak_op,
        "at_peak": mem.at_peak, "flopscope_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="docs/memory")
    parser.add_argument("--models", default="resnet18,resnet50,vit_b_16,bert-base,tiny-llama")
    parser.add_argument("--workloads", default="inference,train-sgd,train-adamw")
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)
    builders = _models(args.batch)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "memory_validation.json"
    rows: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    done = {(r["model"], r["workload"]) for r in rows}
    for name in args.models.split(","):
        for workload in args.workloads.split(","):
            if (name, workload) in done:
                continue
            row = measure(name, builders[name], workload)
            rows.append(row)
            path.write_text(json.dumps(rows, indent=1))
            print(f"{name:11s} {workload:12s} flopscope {row['flopscope_peak'] / 2**20:9.1f} MiB"
                  f"  profiler {row['profiler_peak'] / 2**20:9.1f} MiB  "
                  f"{100 * row['deviation']:+6.1f}%  peak in {row['peak_phase']} "
                  f"'{row['peak_module']}' {row['peak_op']}", flush=True)
    print(markdown(rows))
    plot(rows, out / "memory_validation.png")
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Two panels: flopscope's peak against the profiler's (log-log, y = x dashed, one marker
    per workload), and each case's deviation in percent with the issue's +-10% band."""
    from benchmarks.plotting import MISSING, counted_vs_measured_axes, pyplot, save

    plt = pyplot()
    if plt is None:
        raise SystemExit(MISSING)
    fig, (ax, dev) = plt.subplots(1, 2, figsize=(11, 5), dpi=110,
                                  gridspec_kw={"width_ratios": [1, 1.2]})
    mib = [v / 2**20 for r in rows for v in (r["flopscope_peak"], r["profiler_peak"])]
    counted_vs_measured_axes(ax, mib, title="peak memory: flopscope against torch.profiler",
                             xlabel="flopscope peak (MiB)", ylabel="torch.profiler peak (MiB)")
    markers = {"inference": "o", "train-sgd": "s", "train-adamw": "^"}
    for workload, marker in markers.items():
        mine = [r for r in rows if r["workload"] == workload]
        ax.scatter([r["flopscope_peak"] / 2**20 for r in mine],
                   [r["profiler_peak"] / 2**20 for r in mine], marker=marker, label=workload)
    ax.legend(fontsize=8)
    names = [f"{r['model']} {r['workload']}" for r in rows]
    deviations = [100 * r["deviation"] for r in rows]
    dev.axvspan(-10, 10, color="0.92", label="within 10%")
    dev.barh(range(len(rows)), deviations, color=["tab:blue" if d <= 0 else "tab:orange"
                                                  for d in deviations])
    dev.axvline(0, color="0.3", linewidth=0.8)
    dev.set_yticks(range(len(rows)), names, fontsize=7)
    dev.invert_yaxis()
    dev.set_xlim(-12, 12)
    dev.set_xlabel("flopscope / torch.profiler - 1 (%)")
    dev.set_title("deviation per case (negative: flopscope below)", fontsize=9)
    dev.legend(fontsize=8, loc="lower right")
    save(plt, fig, path)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown table."""
    lines = ["| model | workload | flopscope (MiB) | torch.profiler (MiB) | deviation | peak at |",
             "| :--- | :--- | ---: | ---: | ---: | :--- |"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['workload']} | {r['flopscope_peak'] / 2**20:,.1f} | "
            f"{r['profiler_peak'] / 2**20:,.1f} | {100 * r['deviation']:+.1f}% | "
            f"{r['peak_phase']} `{r['peak_module'] or '(root)'}` {r['peak_op']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
