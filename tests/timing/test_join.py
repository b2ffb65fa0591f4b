"""The join of counted calls to profiler events, on recorded events (no profiler needed): each
call takes its own dispatch's event, never a parent or a child; a call with no event is None."""

from __future__ import annotations

from flopscope.timing.join import REGION, Event, innermost, match, region_events


def _ev(name: str, start: float, end: float, device: float = 0.0, thread: int = 1) -> Event:
    return Event(name, start, end, thread, device)


# what the profiler records for Linear -> ReLU -> Linear under no_grad (as torch 2.14 does):
# aten::linear { aten::t { aten::transpose }, aten::addmm { aten::copy_ } }, aten::relu ...;
# flopscope's mode sees t, addmm, relu, t, addmm (linear is decomposed above it)
EVENTS = [
    _ev("aten::linear", 0, 30), _ev("aten::t", 1, 5), _ev("aten::transpose", 2, 4),
    _ev("aten::addmm", 6, 28), _ev("aten::copy_", 7, 9),
    _ev("aten::relu", 31, 40), _ev("aten::clamp_min", 32, 39),
    _ev("aten::linear", 41, 60), _ev("aten::t", 42, 44), _ev("aten::addmm", 45, 59),
]


def test_each_call_takes_its_own_event() -> None:
    names = ["aten::t", "aten::addmm", "aten::relu", "aten::t", "aten::addmm"]
    assert match(names, EVENTS) == [1, 3, 5, 8, 9]


def test_children_and_parents_are_never_taken() -> None:
    # an addmm nested inside the previous call's event is its child: the call takes the next one
    events = [_ev("aten::mm", 0, 10), _ev("aten::mm", 2, 3), _ev("aten::mm", 11, 12)]
    assert match(["aten::mm", "aten::mm"], events) == [0, 2]


def test_a_call_without_an_event_is_none_and_the_rest_still_match() -> None:
    names = ["aten::t", "aten::nonexistent", "aten::addmm", "aten::relu"]
    assert match(names, EVENTS) == [1, None, 3, 5]


def test_runs_are_split_by_their_region() -> None:
    events = sorted([
        _ev(REGION, 0, 100), _ev("aten::mm", 10, 20), _ev("aten::mm", 30, 40),
        _ev(REGION, 200, 300), _ev("aten::mm", 210, 230),
        _ev("aten::mm", 220, 225, thread=2),  # another thread: not this run's
    ], key=lambda e: e.start_us)
    runs = region_events(events)
    assert [r.start_us for r, _ in runs] == [0, 200]
    assert [[e.start_us for e in inside] for _, inside in runs] == [[10, 30], [210]]
    assert runs[0][0].dur_us == 100


def test_a_backward_on_the_autograd_thread_is_in_the_run() -> None:
    """On CUDA the autograd engine runs the backward on its own thread while the calling thread
    waits (found on an H200: a resnet50 training step's 176 backward calls were unmatched)."""
    events = sorted([
        _ev(REGION, 0, 100), _ev("aten::mm", 1, 10), _ev("aten::ones_like", 11, 12),
        _ev("autograd::engine::evaluate_function: MmBackward0", 15, 35, thread=7),
        _ev("aten::mm", 16, 25, thread=7), _ev("aten::mm", 26, 34, thread=7),
        _ev("aten::add_", 40, 45),  # the optimizer, back on the calling thread
        _ev("aten::mm", 41, 44, thread=9),  # a thread running beside it: not this run's
        _ev("aten::mm", 120, 130, thread=7),  # outside the region
    ], key=lambda e: e.start_us)
    (_, inside), = region_events(events)
    assert [(e.name, e.start_us) for e in inside] == [
        ("aten::mm", 1), ("aten::ones_like", 11),
        ("autograd::engine::evaluate_function: MmBackward0", 15), ("aten::mm", 16),
        ("aten::mm", 26), ("aten::add_", 40)]
    names = ["aten::mm", "aten::ones_like", "aten::mm", "aten::mm", "aten::add_"]
    assert match(names, inside) == [0, 1, 3, 4, 5]


def test_a_call_with_no_event_does_not_take_a_later_one() -> None:
    """autograd detaches a tensor it saves without an event of its own; a detach event later in
    the run (another one's) must not be taken, or every call after it would be out of place."""
    events = [_ev("aten::relu_", 0, 5), _ev("aten::max_pool2d", 6, 10),
              _ev("aten::convolution", 11, 20), _ev("aten::detach", 21, 22)]
    names = ["aten::relu_", "aten::detach", "aten::max_pool2d", "aten::convolution",
             "aten::detach"]
    assert match(names, events) == [0, None, 1, 2, 3]


def test_two_calls_in_a_row_without_events() -> None:
    """The gradient add of autograd's input buffer, then a detach: neither has an event; a later
    add event (another one's) is not taken by the first."""
    events = [_ev("aten::sum", 0, 5), _ev("aten::pow", 6, 8), _ev("aten::mul", 9, 10),
              _ev("aten::add", 11, 12)]
    names = ["aten::sum", "aten::add", "aten::detach", "aten::pow", "aten::mul", "aten::add"]
    assert match(names, events) == [0, None, None, 1, 2, 3]


def test_under_the_counting_mode_the_operators_own_event_is_the_innermost() -> None:
    # what the profiler records for one addmm under a Counter (torch 2.14): the call's event,
    # the Python mode's, and the addmm dispatched again below the mode, with its own children
    events = [_ev("aten::addmm", 0, 100), _ev("PythonDispatchMode", 2, 98),
              _ev("aten::addmm", 40, 90), _ev("aten::copy_", 41, 45),
              _ev("aten::relu", 101, 150), _ev("PythonDispatchMode", 102, 149),
              _ev("aten::relu", 120, 140), _ev("aten::clamp_min", 121, 139)]
    found = match(["aten::addmm", "aten::relu"], events)
    assert found == [0, 4]
    assert [innermost(events, k) for k in found if k is not None] == [2, 6]
    # without a nested event of its name, an event is its own innermost; another thread's is not
    assert innermost(events, 3) == 3
    other = [_ev("aten::mm", 0, 10), _ev("aten::mm", 2, 8, thread=2)]
    assert innermost(other, 0) == 0
