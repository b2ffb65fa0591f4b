"""The input grammar: shapes, dtypes, example tensors; messages name the thing parsed."""

from __future__ import annotations

import pytest
import torch

from flopscope.errors import SourceError
from flopscope.sources import InputSpec, make_inputs, parse_dtype, parse_input
from flopscope.sources._inputs import cast_floating, describe, rebatch


def test_parse_input_shape_and_dtype() -> None:
    assert parse_input("1x3x224x224") == InputSpec((1, 3, 224, 224), torch.float32)
    assert parse_input(" 2X128:INT64 ") == InputSpec((2, 128), torch.int64)
    assert parse_input("8:bf16").dtype is torch.bfloat16


def test_input_spec_prints_back_in_the_grammar() -> None:
    assert str(InputSpec((1, 3, 8, 8))) == "1x3x8x8"
    assert str(parse_input("1x128:long")) == "1x128:int64"


@pytest.mark.parametrize(("text", "expected"), [
    ("1x3xfoo", r"malformed input shape '1x3xfoo'"),
    ("", r"malformed input shape ''"),
    ("1x0x3", r"every dimension must be at least 1"),
    ("1x3:float13", r"unknown dtype .float13.*did you mean .*float16"),
])
def test_parse_input_errors_name_no_flag(text: str, expected: str) -> None:
    with pytest.raises(SourceError, match=expected) as info:
        parse_input(text)
    assert "--" not in str(info.value)


def test_parse_input_names_the_flag_when_asked() -> None:
    with pytest.raises(SourceError, match=r"malformed --input 'x'"):
        parse_input("x", what="--input")


def test_parse_dtype() -> None:
    assert parse_dtype("double") is torch.float64
    assert parse_dtype(torch.float16, floating=True) is torch.float16
    with pytest.raises(SourceError, match=r"must be a floating-point type.*not int64"):
        parse_dtype("int64", floating=True)
    with pytest.raises(SourceError, match=r"unknown dtype 'flaot32'.*did you mean float32"):
        parse_dtype("flaot32")


def test_make_inputs_batch_and_dtype() -> None:
    x, ids = make_inputs([parse_input("1x3x4x4"), parse_input("1x5:int64")], batch=3,
                         dtype=torch.float64)
    assert x.shape == (3, 3, 4, 4) and x.dtype is torch.float64
    assert ids.shape == (3, 5) and ids.dtype is torch.int64 and not ids.any()  # valid indices


def test_rebatch_repeats_or_cuts_rows() -> None:
    x = torch.arange(2.0).reshape(2, 1)
    assert rebatch(x, 5).flatten().tolist() == [0, 1, 0, 1, 0]
    assert rebatch(x, 1).flatten().tolist() == [0]
    assert rebatch(3, 4) == 3 and rebatch(torch.tensor(1.0), 4).shape == ()


def test_cast_floating_leaves_integers() -> None:
    value = (torch.zeros(2), [torch.zeros(1, dtype=torch.int64)], {"m": torch.ones(1)}, "s")
    out = cast_floating(value, torch.float64)
    assert out[0].dtype is torch.float64 and out[1][0].dtype is torch.int64
    assert out[2]["m"].dtype is torch.float64 and out[3] == "s"


def test_describe() -> None:
    assert describe(torch.zeros(1, 2, dtype=torch.float16)) == "1x2:float16"
    assert describe(False) == "False" and describe(object()) == "object"
