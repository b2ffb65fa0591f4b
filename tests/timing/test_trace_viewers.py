"""flopscope's traces read back by the tools users open them with: Holistic Trace Analysis (its
data frame and call graph) and Perfetto's trace processor (its SQL tables). Each reader must see
every counted call and module span of the report, each call with the report's module, FLOPs,
bytes and roofline bound, the module spans nested as the modules are, each call inside its
module's span, and nothing rejected. Each test skips, saying why, where its reader is missing."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flopscope.cli import main

_OPS, _MODULES = "operators (counted calls)", "modules"  # the two tracks' thread names


@dataclass(frozen=True)
class Profiled:
    """A CLI run's report and its two traces."""

    report: dict[str, Any]
    measured: Path
    estimated: Path


@dataclass(frozen=True)
class Event:
    """One complete event as a reader returns it (times in nanoseconds)."""

    track: str
    name: str
    ts: int
    dur: int
    depth: int
    parent: str | None
    module: str
    call: int
    flops: int
    bytes: int
    bound_us: float


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Profiled:
    folder = tmp_path_factory.mktemp("traces")
    out = {k: folder / f"{k}.json" for k in ("report", "measured", "estimated")}
    assert main(["profile", "torchvision:resnet18", "--input", "1x3x32x32", "--warmup", "1",
                 "--repeat", "1", "--hardware", "xeon-8480", "--format", "json",
                 "--output", str(out["report"]), "--trace", str(out["measured"]),
                 "--estimated-trace", str(out["estimated"])]) == 0
    return Profiled(json.loads(out["report"].read_text()), out["measured"], out["estimated"])


def _parent_path(path: str) -> str:
    """The span a module's span sits in: its parent module's ("layer1.0.conv1" -> "layer1.0";
    a top-level module's parent is the model, "(root)")."""
    return path.rsplit(".", 1)[0] if "." in path else "(root)"


def _check_measured(events: list[Event], report: dict[str, Any]) -> None:
    """What every reader must see in the measured trace, against the report's own numbers."""
    ops = [e for e in events if e.track == _OPS]
    spans = [e for e in events if e.track == _MODULES]
    # one event per counted call, per (module, operator) as the report's records count them,
    # with the records' FLOPs and bytes (read + written)
    records = report["records"]
    key = lambda r: (r["module"] or "(root)", r["op"])  # noqa: E731
    assert Counter((e.module, e.name) for e in ops) == Counter(
        {key(r): r["calls"] for r in records})
    for field, of in (("flops", lambda r: r["flops"]),
                      ("bytes", lambda r: r["bytes_read"] + r["bytes_written"])):
        got: Counter[tuple[str, str]] = Counter()
        for e in ops:
            got[(e.module, e.name)] += getattr(e, field)
        assert got == Counter({key(r): of(r) for r in records if of(r)}), field
    # per operator, the measured time and the roofline bound the report shows (the trace's
    # times are whole nanoseconds: at most half a nanosecond off per call)
    for op, row in report["measured"]["by_op"].items():
        mine = [e for e in ops if e.name == op]
        assert sum(e.dur for e in mine) == pytest.approx(row["seconds"] * 1e9,
                                                         abs=len(mine))
        assert sum(e.bound_us for e in mine) == pytest.approx(row["bound_s"] * 1e6, rel=1e-9)
    # one span per module call, nested as the modules are
    assert Counter(e.name for e in spans) == Counter(
        {m["path"] or "(root)": m["calls"] for m in report["modules"]})
    for e in spans:
        depth = 0 if e.name == "(root)" else e.name.count(".") + 1
        assert (e.depth, e.parent) == (depth, None if depth == 0 else _parent_path(e.name)), e
    # each operator call inside a span of its module, and no call inside another
    for e in ops:
        assert any(s.name == e.module and s.ts <= e.ts and e.ts + e.dur <= s.ts + s.dur
                   for s in spans), e
        assert (e.depth, e.parent) == (0, None), e


def _check_estimated(events: list[Event], profiled: Profiled, *, nesting: bool = True) -> None:
    """The estimated trace: the calls in their order, each as long as its bound, end to end,
    none inside another (unless ``nesting`` is off); left out only the calls that take no
    nanosecond (counted)."""
    written = json.loads(profiled.estimated.read_text())
    calls = sum(r["calls"] for r in profiled.report["records"])
    assert all(e.track == _OPS for e in events)
    assert len(events) + written["flopscope"]["zero_time_calls"] == calls
    assert 0 < len(events) < calls  # resnet18's views and allocations take no time
    assert [e.call for e in events] == sorted({e.call for e in events})
    measured = {e["args"]["call"]: e for e in json.loads(profiled.measured.read_text())[
        "traceEvents"] if e.get("tid") == 1 and e["ph"] == "X"}
    for e in events:  # the same call as in the measured trace
        m = measured[e.call]
        assert (e.name, e.module, e.flops) == (m["name"], m["args"]["module"], m["args"]["flops"])
    assert events[0].ts == 0
    for a, b in zip(events, events[1:], strict=False):
        assert b.ts == a.ts + a.dur  # laid end to end, to the nanosecond
    for e in events:
        assert e.dur >= 1 and e.dur == pytest.approx(e.bound_us * 1e3, abs=1)
        assert not nesting or (e.depth, e.parent) == (0, None), e


# ------------------------------------------------------------------ Holistic Trace Analysis


def _hta_events(path: Path, folder: Path) -> tuple[list[Event], dict[str, Any]]:
    """The trace as HTA parses it (its parser and call graph), and its metadata."""
    from hta.common.call_stack import CallGraph
    from hta.common.trace import Trace
    from hta.configs.default_values import AttributeSpec, ValueType, YamlVersion
    from hta.configs.parser_config import ParserConfig

    folder.mkdir()
    shutil.copy(path, folder / "rank-0.json")
    config = ParserConfig.get_default_cfg()
    version = YamlVersion(1, 0, 0)
    config.add_args([AttributeSpec("fs_module", "module", ValueType.String, "", version),
                     AttributeSpec("fs_call", "call", ValueType.Int, -1, version),
                     AttributeSpec("fs_flops", "flops", ValueType.Int, 0, version),
                     AttributeSpec("fs_bound_us", "bound_us", ValueType.Float, 0.0, version)])
    trace = Trace(trace_dir=str(folder), parser_config=config)
    trace.parse_traces()
    CallGraph(trace)  # adds each event's depth and parent to the frame
    frame = trace.get_trace(0)
    names = trace.symbol_table.sym_table
    tracks = {1: _OPS, 2: _MODULES}
    by_index = {i: names[n] for i, n in zip(frame.index, frame["name"], strict=True)}
    events = [Event(track=tracks[int(row.tid)], name=names[row.name],
                    ts=round(row.ts * 1e3), dur=round(row.dur * 1e3), depth=int(row.depth),
                    parent=by_index.get(int(row.parent)) if row.parent >= 0 else None,
                    module=row.fs_module, call=int(row.fs_call), flops=int(row.fs_flops),
                    bytes=max(int(row.bytes), 0),
                    bound_us=float(row.fs_bound_us))
              for row in frame.itertuples()]
    return sorted(events, key=lambda e: (e.track, e.ts)), trace.meta_data[0]


@pytest.fixture
def hta_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTA reads the traces as written. By default HTA 0.5 rounds every fractional
    microsecond time (start up, end down, for torch.profiler's nanosecond traces), which gives an
    event shorter than a microsecond a negative duration and the wrong parent in its call graph;
    its own switch turns that off."""
    pytest.importorskip("hta", reason="Holistic Trace Analysis is not installed "
                        "(pip install 'flopscope[trace]')")
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")


_HTA_PANDAS_NOTICE = "ignore:The inplace keyword"  # HTA 0.5's own use of pandas, not ours


@pytest.mark.usefixtures("hta_exact")
@pytest.mark.filterwarnings(_HTA_PANDAS_NOTICE)
def test_hta_reads_the_measured_trace(profiled: Profiled, tmp_path: Path) -> None:
    events, meta = _hta_events(profiled.measured, tmp_path / "measured")
    _check_measured(events, profiled.report)
    assert meta["distributedInfo"] == {"backend": "none", "rank": 0, "world_size": 1}


@pytest.mark.usefixtures("hta_exact")
@pytest.mark.filterwarnings(_HTA_PANDAS_NOTICE)
def test_hta_reads_the_estimated_trace(profiled: Profiled, tmp_path: Path) -> None:
    events, _ = _hta_events(profiled.estimated, tmp_path / "estimated")
    # HTA's call graph takes a call's end as ts + dur in floating point: where one call ends
    # exactly as the next starts the sum can land past the next start (1.3 + 0.229 > 1.529 in
    # binary floating point) and the next call becomes its child. Perfetto reads whole nanoseconds and
    # keeps them side by side (checked below).
    _check_estimated(events, profiled, nesting=False)


# ------------------------------------------------------------------ Perfetto's trace processor


def _trace_processor_binary() -> str:
    """``trace_processor_shell``: $FLOPSCOPE_TRACE_PROCESSOR, else on the PATH; skips the test
    when neither is there."""
    pytest.importorskip("perfetto.trace_processor",
                        reason="the perfetto package is not installed (pip install 'flopscope[trace]')")
    binary = os.environ.get("FLOPSCOPE_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
    if not binary or not os.access(binary, os.X_OK):
        pytest.skip("Perfetto's trace_processor_shell not found: set FLOPSCOPE_TRACE_PROCESSOR to "
                    "it (bash scripts/build_trace_processor.sh builds it from source)")
    return binary


_SLICES = """
select s.id, s.ts, s.dur, s.depth, s.name, p.name as parent, t.name as track,
       extract_arg(s.arg_set_id, 'args.module') as op_module,
       extract_arg(s.arg_set_id, 'args.call') as call_index,
       extract_arg(s.arg_set_id, 'args.flops') as flops,
       extract_arg(s.arg_set_id, 'args.bytes') as bytes,
       extract_arg(s.arg_set_id, 'args.bound_us') as bound_us
from slice s
join thread_track tt on s.track_id = tt.id
join thread t using (utid)
left join slice p on s.parent_id = p.id
order by t.name, s.ts
"""

_PROBLEMS = "select name, idx, severity, value from stats where value > 0 and " \
            "severity in ('error', 'data_loss')"


def _perfetto_events(path: Path, binary: str) -> tuple[list[Event], list[Any], str]:
    """The trace as Perfetto's trace processor reads it: its slices, the problems it recorded
    (the stats it counts as errors or data loss) and the process's name."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    with TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=binary)) as tp:
        rows = list(tp.query(_SLICES))
        problems = [(r.name, r.idx, r.severity, r.value) for r in tp.query(_PROBLEMS)]
        process = [r.name for r in tp.query(
            "select distinct p.name from thread join process p using (upid) "
            f"where thread.name = '{_OPS}'")]
    events = [Event(track=r.track, name=r.name, ts=int(r.ts), dur=int(r.dur),
                    depth=int(r.depth), parent=r.parent, module=r.op_module,
                    call=-1 if r.call_index is None else int(r.call_index),
                    flops=int(r.flops or 0), bytes=int(r.bytes or 0),
                    bound_us=float(r.bound_us or 0.0)) for r in rows]
    return events, problems, process[0] if process else ""


def test_perfetto_reads_the_measured_trace(profiled: Profiled) -> None:
    events, problems, process = _perfetto_events(profiled.measured, _trace_processor_binary())
    assert problems == []
    assert process == "flopscope: measured"
    _check_measured(events, profiled.report)


def test_perfetto_reads_the_estimated_trace(profiled: Profiled) -> None:
    events, problems, process = _perfetto_events(profiled.estimated, _trace_processor_binary())
    assert problems == []
    assert process == "flopscope: roofline on xeon-8480 (lower bound)"
    _check_estimated(events, profiled)
