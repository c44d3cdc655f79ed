"""Turning a Case into buffers: seeded inputs in their storage dtype, laid out as views
into larger arenas whose slack holds NaN (so an over-read shows), the mask from its
recipe, and an output buffer framed by guard regions and pre-filled with poison (so a
missing or out-of-bounds write shows).

masks.py      the mask a recipe makes
placement.py  where a tensor's elements lie: layouts, slack, misaligned, far and fenced buffers
storage.py    values in their storage dtype (int8 quantisation), stale cache slots
case_data.py  a case's inputs from its seed (materialise)
read_only.py  the buffers a kernel reads, and which of them a call wrote
output.py     the output buffer, its guard regions and poison"""

from __future__ import annotations

from .case_data import KV_SLACK, CaseData, materialise
from .masks import MASKS, NEG_FINITE, make_mask
from .output import GUARD, GUARD_ELEMS, OUT_NP, POISON, OutBuffer, out_buffer
from .placement import (
    ALIGN,
    FAR_STRIDE,
    FENCES,
    HEAD_PAD,
    MASK_PAD,
    far_empty,
    fenced_empty,
    fenced_tensor,
    misaligned_empty,
    tensor_layouts,
)
from .read_only import InputGuard, input_buffers
from .storage import NAN_BITS, STORAGE_NP, quantize_per_token, quantize_symmetric

__all__ = [
    "ALIGN", "FAR_STRIDE", "FENCES", "GUARD", "GUARD_ELEMS", "HEAD_PAD", "KV_SLACK", "MASKS",
    "MASK_PAD", "NAN_BITS", "NEG_FINITE", "OUT_NP", "POISON", "STORAGE_NP", "CaseData",
    "InputGuard", "OutBuffer", "far_empty", "fenced_empty", "fenced_tensor", "input_buffers",
    "make_mask", "materialise", "misaligned_empty", "out_buffer", "quantize_per_token",
    "quantize_symmetric", "tensor_layouts",
]
