"""What a plan's times are, in words and JSON, written once for training and serving plans: the
roofline bound, or the prediction of the profile's calibration with its source, its error bar
(and, for serving, what that error bar was measured on: :func:`validated_on`, with the decode
validation's figures for the calibration's device kind), and the bound beside it."""

from __future__ import annotations

from typing import Any

from flopscope.estimate import Calibration, Hardware
from flopscope.estimate.decode_validation import serving_validated_on

__all__ = ["BOUND_NOTE", "compute_note", "error_bar_words", "prediction_source", "table_line",
           "time_model", "validated_on"]

BOUND_NOTE = "roofline lower bounds (every call at peak rate or bandwidth)"
"""The notes' words for a time at the roofline bound."""


def validated_on(cal: Calibration) -> str:
    """What a serving prediction's error bar was measured on: forwards and training steps,
    and prefill and decode steps measured on a device of the calibration's kind (the figures
    and date of ``benchmarks/decode_validation.py``'s shipped run), or that a decode step on
    that kind (a GPU) is not validated (:func:`flopscope.estimate.decode_validation
    .serving_validated_on`)."""
    return serving_validated_on(cal.device)


_BOUND_KEYS = {
    False: "beside each layout: bound_time_s (compute at the roofline bound) and mfu_bound (the "
           "most the layout can reach)",
    True: "beside each row: time_to_first_token_bound_s, latency_per_token_bound_s and "
          "tokens_per_s_bound (the compute at the roofline bound: the most the layout can "
          "reach)"}

_TABLE_COLUMNS = {False: ("step, MFU", "step (bound), MFU (bound)"),
                  True: ("1st token, per token, tok/s", "per token (bound), tok/s/GPU (bound)")}


def time_model(hw: Hardware) -> str:
    """What a plan's times are on ``hw``: ``"prediction"`` (with a calibration block) or
    ``"roofline lower bound"``."""
    return "prediction" if hw.calibration is not None else "roofline lower bound"


def error_bar_words(cal: Calibration, prefix: str = "") -> str:
    """A calibration's whole-model error bar in words (``prefix`` before the figure), or that
    it has none."""
    total = cal.error_bars.get("total")
    if total is None:
        return "no error bar (not validated)"
    return (f"{prefix}+-{100 * total:.0f}% (90th percentile of |predicted / measured - 1| over "
            "its validation's models)")


def prediction_source(hw: Hardware, serve: bool = False) -> dict[str, Any] | None:
    """Where a plan's predicted times come from (``None`` without a calibration): the one
    label (:meth:`~flopscope.estimate.Calibration.source`), whether it is a reference (not
    calibrated on this GPU), its error bars (90th percentile of ``|predicted / measured - 1|``
    per family and over whole models, ``"total"``), the bound's JSON keys and, for a serving
    plan, what the error bar was measured on (:func:`validated_on`)."""
    cal = hw.calibration
    if cal is None:
        return None
    found = {"source": cal.source(), "reference": bool(cal.reference),
             "error_bars": dict(cal.error_bars), "bound": _BOUND_KEYS[serve]}
    return {**found, "validated_on": validated_on(cal)} if serve else found


def compute_note(hw: Hardware, serve: bool = False) -> str:
    """The notes' words for what a step's compute is on ``hw``: the bound, or the prediction,
    its source and error bar (for serving, what that was measured on), and the bound beside."""
    cal = hw.calibration
    if cal is None:
        return BOUND_NOTE
    kind = ("predictions from a reference calibration" if cal.reference
            else "calibrated predictions")
    beside = (f", {validated_on(cal)}; beside them the roofline bound's (bound)" if serve
              else "; beside them the roofline bound's step and MFU (bound)")
    return (f"{kind} ({cal.source()}), {error_bar_words(cal, 'error bar ')}{beside}: the most "
            "a layout can reach")


def table_line(hw: Hardware, serve: bool = False) -> list[str]:
    """The line under a plan's table where its times are predictions (none for the bound):
    from what, the error bar (for serving, what it was measured on), and the bound's
    columns."""
    cal = hw.calibration
    if cal is None:
        return []
    times, columns = _TABLE_COLUMNS[serve]
    reference = "from a reference calibration " if cal.reference else ""
    validated = f", {validated_on(cal)}" if serve else ""
    return [f"{times}: predicted {reference}({cal.source()}), {error_bar_words(cal)}"
            f"{validated}; {columns}: the compute at the roofline bound, the most a layout can "
            "reach"]
