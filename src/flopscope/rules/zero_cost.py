"""Operators that do no floating-point arithmetic: 0 FLOPs, 0 MACs.

They still move memory: ``bytes_read``/``bytes_written`` count their tensor inputs and outputs,
except for views (an output that aliases an input), which move nothing.
"""

from __future__ import annotations

from flopscope.cost import Cost, OpCall
from flopscope.rules.registry import rule

# Views and metadata changes: the output shares the input's storage.
VIEWS = [
    "view", "reshape", "expand", "expand_as", "permute",
    "transpose", "t", "squeeze", "unsqueeze",
    "slice", "select", "as_strided", "alias", "detach", "split",
    "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk", "unsafe_chunk",
    "unbind", "narrow", "unfold", "diagonal", "view_as_real", "view_as_complex", "lift_fresh",
    "_conj", "conj", "resolve_conj", "resolve_neg", "_neg_view", "movedim", "flatten",
    "unflatten", "view_as", "real", "imag", "swapaxes", "swapdims", "tensor_split", "hsplit",
    "vsplit", "dsplit", "_nested_view_from_buffer", "alias_copy", "view_copy", "t_copy",
    "permute_copy", "transpose_copy", "expand_copy", "slice_copy", "select_copy",
    "unsqueeze_copy", "squeeze_copy", "split_copy", "split_with_sizes_copy", "unbind_copy",
    "as_strided_copy", "detach_copy", "_reshape_copy", "diagonal_copy",
    "values", "_nested_get_values", "_nested_view_from_jagged", "_nested_get_offsets",
    "_nested_get_lengths", "_nested_get_ragged_idx", "_nested_get_min_seqlen",
    "_nested_get_max_seqlen", "_nested_tensor_size", "_nested_tensor_strides",
    "_nested_tensor_storage_offsets",
]
# Copies, layout and dtype changes: bytes move, no arithmetic.
COPIES = [
    "clone", "copy_", "copy", "_to_copy", "to", "contiguous", "lift_fresh_copy", "lift",
    "_copy_from", "_copy_from_and_resize", "pin_memory", "_pin_memory", "to_mkldnn",
    "to_dense", "_to_dense", "mkldnn_reorder_conv2d_weight", "_nested_tensor_from_tensor_list",
    "_nested_from_padded", "_nested_from_padded_and_nested_example", "to_padded_tensor",
    "_nested_tensor_from_mask", "_pack_padded_sequence", "_foreach_copy_", "_foreach_copy",
]
# Indexing, gathering, concatenation, padding, reordering: data movement only.
INDEXING = [
    "index", "_unsafe_index", "index_select", "gather", "take", "masked_select", "scatter",
    "scatter_", "index_fill", "index_fill_", "masked_scatter", "masked_scatter_", "cat", "stack",
    "hstack", "vstack", "repeat", "repeat_interleave", "tile", "roll", "flip", "fliplr", "flipud",
    "rot90", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "_pad_circular", "pad",
    "tril", "tril_", "triu", "triu_", "nonzero", "nonzero_static", "argwhere", "sort", "argsort",
    "topk", "kthvalue", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
    "bucketize", "searchsorted", "one_hot", "select_backward", "slice_backward",
    "index_select_backward", "diagonal_backward", "masked_scatter_backward", "as_strided_scatter", "slice_scatter",
    "select_scatter", "diagonal_scatter", "put", "put_", "col2im", "im2col",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
    "block_diag", "diag", "diag_embed", "embedding_renorm_",
]
# Creation, filling and random numbers: no arithmetic on data.
CREATION = [
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill", "fill_", "zero_", "arange", "linspace", "logspace", "scalar_tensor", "eye",
    "tril_indices", "triu_indices", "rand", "randn", "randint", "randperm", "rand_like",
    "randn_like", "randint_like", "normal", "normal_", "uniform_", "bernoulli", "bernoulli_",
    "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "multinomial",
    "_efficientzerotensor", "resize_", "resize_as_", "set_", "empty_permuted",
]
# Bookkeeping with no data at all.
META = [
    "_local_scalar_dense", "item", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_same_size", "record_stream", "_has_compatible_shallow_copy_type", "is_nonzero", "equal",
    "_version", "_print", "_resize_output_", "_check_is_size", "result_type",
]
# Assertions and checks: torch._check_tensor_all (_is_all_true), torch._assert_async, the
# exported forms of asserts and size constraints, metadata checks (see `assertion` below).
ASSERTIONS = [
    "_is_all_true", "_is_any_true", "_assert_async", "_assert_scalar", "_functional_assert_async",
    "_functional_assert_scalar", "_assert_tensor_metadata", "_make_dep_token",
    "sym_constrain_range", "sym_constrain_range_for_size", "_functional_sym_constrain_range",
    "_functional_sym_constrain_range_for_size",
]

# Profiler ranges (optimizers wrap their step in one).
PROFILER = ["profiler::_record_function_enter", "profiler::_record_function_enter_new",
            "profiler::_record_function_exit"]

ZERO_FLOP_OPS = [f"aten::{name}" for name in VIEWS + COPIES + INDEXING + CREATION + META] + PROFILER


@rule(*ZERO_FLOP_OPS)
def zero_flop(call: OpCall) -> Cost:
    """No arithmetic: views, copies and dtype casts, indexing/gather/cat/pad, tensor creation and
    random-number filling, bookkeeping: 0 FLOPs. Bytes of inputs and outputs are counted (0 for
    views)."""
    return call.cost()


@rule(*(f"aten::{name}" for name in ASSERTIONS))
def assertion(call: OpCall) -> Cost:
    """Assertions and checks: ``_is_all_true`` / ``_is_any_true`` (``torch._check_tensor_all``,
    which transformers' ``torch_compilable_check`` calls), ``_assert_async``, ``_assert_scalar``
    and their functional forms, size constraints, ``_assert_tensor_metadata``: 0 FLOPs, by
    decision. They verify the program and compute nothing the model returns; an ``all``/``any``
    written by the model itself is a reduction and counted as one, the same reduction made to
    decide whether to raise is not. Bytes of inputs and outputs are counted. A shape-only count
    has no values to check: there an assertion on values is taken to hold (the real run raises
    where it fails)."""
    return call.cost()


# In-place metadata changes: the tensor's sizes/strides change, its data neither moves nor is
# written (their schemas mark the argument as written, so they are not views by schema).
METADATA_IN_PLACE = ["transpose_", "t_", "squeeze_", "unsqueeze_", "as_strided_", "detach_",
                     "swapdims_", "swapaxes_"]


@rule(*(f"aten::{name}" for name in METADATA_IN_PLACE))
def metadata_in_place(call: OpCall) -> Cost:
    """An in-place change of a tensor's metadata (``as_strided_``, ``transpose_``, ``squeeze_``,
    ``detach_``, ...): no data is read or written, 0 FLOPs and 0 bytes, like a view."""
    return Cost()


@rule("aten::_unsafe_view", "aten::_reshape_alias")
def unsafe_view(call: OpCall) -> Cost:
    """A view whose schema does not say so (``_unsafe_view`` reshapes a fresh result without a
    copy; ``_reshape_alias`` aliases its input): 0 FLOPs and 0 bytes, like every view."""
    return Cost()

