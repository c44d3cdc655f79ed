"""The suites `probe check --suite` runs (smoke, default, full), and finding a case again
by its id."""

from __future__ import annotations

import dataclasses

from .case import DTYPES, Case
from .families import default_cases
from .kernel_blocks import KV_BLOCK
from .random_slices import RANDOM_SEED_STRIDE, random_case


def smoke_cases() -> list[Case]:
    """A quick check: the commonest calls, a causal offset, a masked row, each storage dtype."""
    return [
        Case("decode", n_heads=8, n_kv_heads=2, kv_len=129),
        # a runtime's most common call: one decode step over a static cache longer than
        # the step's causal edge (its stale slots NaN)
        Case("decode", kv_len=300, causal=True, start_pos=200, n_heads=8, n_kv_heads=2),
        Case("prefill", q_len=33, kv_len=33, causal=True),
        Case("causal", q_len=5, kv_len=70, causal=True, start_pos=65),
        Case("masked-rows", q_len=4, kv_len=40, mask="rows:first"),
        Case("window", q_len=3, kv_len=130, mask="window:48", causal=True, start_pos=127),
        Case("dtype", kv_len=65, dtype="f16"),
        Case("dtype", kv_len=65, dtype="bf16"),
        Case("dtype", kv_len=65, dtype="i8"),
        Case("layout", q_len=3, kv_len=65, layout="padded"),
    ]


def full_cases() -> list[Case]:
    """The default suite, every head_dim on every dtype, longer contexts and more seeds."""
    cs = default_cases()
    for d in (64, 80, 96, 128, 256, 67):
        for dt in DTYPES:
            cs.append(Case("hdim", head_dim=d, q_len=3, kv_len=KV_BLOCK + 1, dtype=dt,
                           causal=True, start_pos=KV_BLOCK - 2, n_heads=8, n_kv_heads=2))
    for kv in (4097, 8193):
        for dt in ("f32", "f16", "i8"):
            cs.append(Case("long", kv_len=kv, dtype=dt, n_heads=32, n_kv_heads=8, n_threads=2))
    cs.append(Case("long", q_len=130, kv_len=1030, causal=True, start_pos=900, n_heads=8,
                   n_kv_heads=2, n_threads=2))
    for seed in range(1, 4):
        cs.append(Case("ring", q_len=5, kv_len=512, mask="ring:300", seed=seed))
        cs.append(Case("sink", q_len=5, kv_len=512, mask="sink:8:300", seed=seed))
    return cs


SUITES = {"smoke": smoke_cases, "default": default_cases, "full": full_cases}


def suite(name: str) -> list[Case]:
    if name not in SUITES:
        raise KeyError(name)
    cases = SUITES[name]()
    ids = [c.id for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {sorted(dup)}"
    return cases


def all_cases() -> dict[str, Case]:
    return {c.id: c for c in suite("full")}


def find_case(case_id: str, fixed: dict[str, Case] | None = None) -> Case | None:
    """The case an id names: a fixed suite's; one of them with another seed (the id
    ending -s<seed>, as --seed makes it); or a random slice's (its seed names the
    slice and index). None for any other id. fixed: all_cases(), if the caller has it."""
    fixed = all_cases() if fixed is None else fixed
    if case_id in fixed:
        return fixed[case_id]
    base, sep, tail = case_id.rpartition("-s")
    if not (sep and tail.isdigit()):
        return None
    if case_id.startswith("random-"):
        slice_seed, i = divmod(int(tail), RANDOM_SEED_STRIDE)
        c = random_case(slice_seed - 1, i) if slice_seed >= 1 else None
        return c if c is not None and c.id == case_id else None
    return dataclasses.replace(fixed[base], seed=int(tail)) if base in fixed else None
