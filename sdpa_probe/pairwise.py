"""Which pairs of the `pairs` family's factors a set of cases covers: the factor values
any case has, read from its fields, and the valid pairs no case of a set has. (The
family itself, its factors and covering array, is sdpa_probe/cases/families/pairs.py.)"""

from __future__ import annotations

import itertools

from .cases import VALUE_RECIPES, Case
from .cases.families.pairs import all_pairs


def factors_of(c: Case) -> dict:
    """The FACTORS values a case has, read from its fields (any case, not only ours)."""
    group = "mha" if c.group == 1 else "mqa" if c.n_kv_heads == 1 else "gqa"
    return {"path": "decode" if c.q_len == 1 else "prefill", "dtype": c.dtype,
            "group": group, "threads": 2 if c.n_threads > 1 else 1,
            "batch": 2 if c.batch > 1 else 1,
            "stale": c.causal and c.start_pos + c.q_len < c.kv_len,
            "mask": c.mask not in ("none", *VALUE_RECIPES), "strided": c.layout != "bshd",
            "head_dim": 64 if c.head_dim % 16 == 0 else 20,
            "logits": c.magnitude >= 10, "query_f32": bool(c.q_dtype),
            "zero_points": c.quant != "sym"}


def missing_pairs(cases: list[Case]) -> list[tuple]:
    """The valid pairs of all_pairs() that no case of `cases` has, sorted."""
    have = set()
    for c in cases:
        have |= {tuple(sorted(p)) for p in itertools.combinations(factors_of(c).items(), 2)}
    return sorted(all_pairs() - have, key=repr)
