"""What a serving plan's times are, in words and JSON: the roofline bound, or the prediction of
the profile's calibration with its source, its error bar, what that error bar was measured on
(:data:`VALIDATED_ON`), and the bound beside (:mod:`flopscope.plan.serve`)."""

from __future__ import annotations

from typing import Any

from flopscope.estimate import Hardware

# flopscope.plan.planner imports flopscope.plan.serve, which imports this: its names are
# imported where they are used

__all__ = ["VALIDATED_ON", "serve_prediction_source", "serve_time_note"]


#: what a serving prediction's error bar was measured on (the calibration's validation)
VALIDATED_ON = (
    "validated on forwards and training steps (torchvision classifiers, BERT-base, GPT-2, a "
    "Llama-style decoder), not on a decode step with a KV cache (its matrix products of a few "
    "rows are among the calibration's microbenchmarks: M = 1-128)")


def serve_prediction_source(hw: Hardware) -> dict[str, Any] | None:
    """Where a serving plan's predicted times come from (``None`` without a calibration):
    :func:`flopscope.plan.planner.prediction_source`'s, what its error bar was measured on
    (:data:`VALIDATED_ON`) and the bound's JSON keys.

    Args:
        hw: the profile.

    Returns:
        JSON-ready data, or ``None``.
    """
    from flopscope.plan.planner import prediction_source

    found = prediction_source(hw)
    if found is None:
        return None
    return {**found, "validated_on": VALIDATED_ON,
            "bound": "beside each row: time_to_first_token_bound_s, latency_per_token_bound_s "
                     "and tokens_per_s_bound (the compute at the roofline bound: the most the "
                     "layout can reach)"}


def serve_time_note(hw: Hardware) -> str:
    """The notes' words for what a serving plan's times are on ``hw``: the bound, or the
    prediction, its source and error bar, what that was measured on, and the bound beside.

    Args:
        hw: the profile.

    Returns:
        The words.
    """
    from flopscope.plan.planner import BOUND_NOTE, error_bar_words

    cal = hw.calibration
    if cal is None:
        return BOUND_NOTE
    kind = ("predictions from a reference calibration" if cal.reference
            else "calibrated predictions")
    return (f"{kind} ({cal.source()}), {error_bar_words(cal, 'error bar ')}, "
            f"{VALIDATED_ON}; beside them the roofline bound's (bound): the most a layout can "
            "reach")
