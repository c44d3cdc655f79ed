"""The case matrix. A case is data: parameters, a seed, a stable id that is also its
pytest id and `-k` filter, a tolerance, FLOP and byte counts. The same objects feed
`probe check`, pytest, golden data and benchmarks.

case.py          the Case dataclass and its id
kernel_blocks.py the built-in kernels' block sizes the lengths are placed around
tolerance.py     how far from the oracle a case may be
invalid_calls.py the calls a kernel must refuse, by name
families/        the default suite's families, one function each
random_slices.py the random suite's slices of the parameter space
suites.py        smoke, default and full; a case found again by its id
words.py         a case's parameters in words, for a failure report"""

from __future__ import annotations

from .case import DTYPES, LAYOUTS, VALUE_RECIPES, ZERO_ROWS_EVERY, ZERO_ROWS_FIRST, Case
from .families import DEFAULT_FAMILIES, default_cases
from .invalid_calls import INVALID_CALLS
from .kernel_blocks import (
    DECODE_BLOCK_BYTES,
    DECODE_KV_BLOCK,
    DECODE_MIN_KEYS,
    KV_BLOCK,
    Q_BLOCK,
    X512_KV_BLOCK,
    decode_kv_block,
)
from .random_slices import (
    RANDOM_CASES,
    RANDOM_HEAD_DIMS,
    RANDOM_LAYOUTS,
    RANDOM_MAX_FLOPS,
    RANDOM_SEED_STRIDE,
    random_case,
    random_cases,
)
from .suites import SUITES, all_cases, find_case, full_cases, smoke_cases, suite
from .tolerance import (
    ACCUM_ATOL,
    BASE_TOL,
    GENERATED_FAMILIES,
    RANDOM_TORCH_MULT,
    SUBNORMAL_ULP,
    TORCH_MULT,
    judged_tolerance,
    tolerance,
    torch_mult,
)
from .words import case_in_words

__all__ = [
    "ACCUM_ATOL", "BASE_TOL", "DECODE_BLOCK_BYTES", "DECODE_KV_BLOCK", "DECODE_MIN_KEYS",
    "DEFAULT_FAMILIES", "DTYPES", "GENERATED_FAMILIES", "INVALID_CALLS", "KV_BLOCK", "LAYOUTS",
    "Q_BLOCK", "RANDOM_CASES", "RANDOM_HEAD_DIMS", "RANDOM_LAYOUTS", "RANDOM_MAX_FLOPS",
    "RANDOM_SEED_STRIDE", "RANDOM_TORCH_MULT", "SUBNORMAL_ULP", "SUITES", "TORCH_MULT",
    "VALUE_RECIPES", "X512_KV_BLOCK", "ZERO_ROWS_EVERY", "ZERO_ROWS_FIRST", "Case",
    "all_cases", "case_in_words", "decode_kv_block", "default_cases", "find_case", "full_cases",
    "judged_tolerance", "random_case", "random_cases", "smoke_cases", "suite", "tolerance",
    "torch_mult",
]
