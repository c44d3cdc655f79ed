"""The default suite's families, one function each, in the suite's order: the matrix of
edges known to matter, each case with a comment saying what it catches."""

from __future__ import annotations

from ..case import Case
from .calls import (
    concurrent_callers,
    long_contexts,
    many_threads,
    refused_calls,
    reuse,
    small_stack,
    threads,
)
from .crossings import crossings
from .layouts import far_offsets, fenced_buffers, mixed_layouts, reversed_strides, strided_layouts
from .masking import causal_offsets, fully_masked_rows, masks, nan_inputs, windows_rings_sinks
from .numerics import float_query, int8_zero_rows, logits, storage_dtypes, symmetric_int8
from .pairs import pairs
from .shapes import (
    batched_decode,
    decode_block_edges,
    decode_odd_shapes,
    decode_static_cache,
    gqa,
    head_dims,
    prefill,
)

# (the order is the suite's: case ids are keys, the order is what `probe check` lists)
DEFAULT_FAMILIES = (
    gqa, decode_block_edges, decode_static_cache, batched_decode, decode_odd_shapes, prefill,
    head_dims, causal_offsets, masks, fully_masked_rows, nan_inputs, windows_rings_sinks,
    logits, storage_dtypes, int8_zero_rows, float_query, symmetric_int8,
    strided_layouts, far_offsets, mixed_layouts, reversed_strides, fenced_buffers,
    threads, reuse, many_threads, concurrent_callers, small_stack, long_contexts,
    pairs, crossings, refused_calls,
)


def default_cases() -> list[Case]:
    """The default suite: every family's cases, in DEFAULT_FAMILIES' order."""
    return [c for family in DEFAULT_FAMILIES for c in family()]
