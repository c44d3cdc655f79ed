"""The `pairs` family: every pair of values of two factors a kernel's code branches on
meets in some case (an all-pairs covering array, built greedily and deterministically).

The rest of the matrix is written by hand, edge by edge; the interactions between its
families are where a kernel's special paths hide. Before this family no decode row saw
stale cache slots, no decode case had two sequences and no F16 prefill ran on two
threads: a decode path written for "one row sees everything" passed every case, and
symmetric int8 (no zero points) ran in two cases, one sequence each. The twelve
factors' pairs take 14 cases here. (sdpa_probe/pairwise.py reads the factors back from
any case, to tell which pairs a set of cases misses.)"""

from __future__ import annotations

import itertools

from ..case import Case

FACTORS: dict[str, tuple] = {
    "path": ("decode", "prefill"),          # q_len 1 or 5
    "dtype": ("f32", "f16", "bf16", "i8"),
    "group": ("gqa", "mha", "mqa"),         # 8 heads over 2, 4 over 4, 4 over 1
    "threads": (1, 2),
    "batch": (1, 2),
    "stale": (False, True),                 # causal, the cache 20 slots longer (NaN there)
    "mask": (False, True),                  # a random additive mask
    "strided": (False, True),               # one of STRIDED instead of plain bshd
    "head_dim": (64, 20),                   # a multiple of 16, or a tail of 4
    "logits": (False, True),                # q and k x10
    "query_f32": (False, True),             # an F32 query over a low-precision cache
    "zero_points": (True, False),           # int8 without them: symmetric, zero_point NULL
}
# the strided rows take these in turn (6 of 14 rows: the first six, the most hostile)
STRIDED = ("reversed", "dmajor", "fenced", "vdmajor", "offset", "padded", "bhsd", "qfused")
HEADS = {"gqa": (8, 2), "mha": (4, 4), "mqa": (4, 1)}
KV_LEN = 77


def valid(row: dict) -> bool:
    """Whether a (partial) row can be a case: an F32 query needs another cache dtype,
    and only int8 goes without zero points."""
    dtype = row.get("dtype")
    return not ((row.get("query_f32") and dtype == "f32")
                or (row.get("zero_points") is False and dtype not in (None, "i8")))


def _covers(row: dict, pair: tuple) -> bool:
    return all(row.get(k) == v for k, v in pair)


def all_pairs() -> set[tuple]:
    """Every valid pair of values of two factors, as ((factor, value), (factor, value))."""
    return {tuple(sorted(((a, va), (b, vb))))
            for a, b in itertools.combinations(FACTORS, 2)
            for va in FACTORS[a] for vb in FACTORS[b] if valid({a: va, b: vb})}


def covering_rows() -> list[dict]:
    """Rows of factor values, each pair of values of two factors in at least one: each
    row starts from the first pair not yet covered and takes, factor by factor, the
    value that covers most pairs still open (ties: the first value)."""
    names = list(FACTORS)
    todo = all_pairs()
    rows = []
    while todo:
        row = dict(min(todo, key=repr))
        for k in names:
            if k in row:
                continue
            options = [v for v in FACTORS[k] if valid(dict(row, **{k: v}))]
            row[k] = max(options, key=lambda v: sum(_covers(dict(row, **{k: v}), p)
                                                    for p in todo))
        todo = {p for p in todo if not _covers(row, p)}
        rows.append({k: row[k] for k in names})
    return rows


def pairs() -> list[Case]:
    """The family's cases, one a covering row; the strided rows take STRIDED in turn."""
    out = []
    strided = itertools.cycle(STRIDED)
    for row in covering_rows():
        q_len = 1 if row["path"] == "decode" else 5
        n_heads, n_kv_heads = HEADS[row["group"]]
        out.append(Case(
            "pairs", batch=row["batch"], n_heads=n_heads, n_kv_heads=n_kv_heads, q_len=q_len,
            kv_len=KV_LEN, head_dim=row["head_dim"], dtype=row["dtype"],
            causal=row["stale"], start_pos=KV_LEN - 20 - q_len if row["stale"] else 0,
            mask="random" if row["mask"] else "none",
            layout=next(strided) if row["strided"] else "bshd",
            magnitude=10.0 if row["logits"] else 1.0,
            q_dtype="f32" if row["query_f32"] else "", n_threads=row["threads"],
            quant="asym" if row["zero_points"] else "sym"))
    return out
