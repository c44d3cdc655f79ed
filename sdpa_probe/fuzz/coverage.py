"""Which pairs of factor values a set of cases met, and which never did: the `pairs`
family's twelve factors (pairwise.py reads them from any case), and the crossings the
fixed matrix was written without: threads x mask, concurrent callers x mask, empty
work x the way the kernel is called, K's layout x V's."""

from __future__ import annotations

import itertools

from ..cases import VALUE_RECIPES, Case
from ..cases.families.pairs import all_pairs
from ..inputs import tensor_layouts
from ..pairwise import factors_of

MASK_KINDS = ("none", "additive", "masked-row", "finite-negative", "window", "ring", "sink")
THREAD_KINDS = ("one", "some", "more-than-tasks")
EMPTY_KINDS = ("no", "batch0", "q0", "kv0")
CALL_KINDS = ("plain", "reuse", "callers", "small-stack")
PLACEMENTS = ("bshd", "bhsd", "padded", "dmajor", "offset", "far", "fenced", "fenced-start",
              "reversed")
CROSSINGS = {  # (factor, factor): the values each takes
    ("threads", "mask"): (THREAD_KINDS, MASK_KINDS),
    ("callers", "mask"): ((1, 2), MASK_KINDS),
    ("empty", "call"): (EMPTY_KINDS, CALL_KINDS),
    ("k_layout", "v_layout"): (PLACEMENTS, PLACEMENTS),
}


def mask_kind(c: Case) -> str:
    m = c.mask
    if m == "none" or m in VALUE_RECIPES:
        return "none"
    if m == "random":
        return "additive"
    if m == "rows:negfinite":
        return "finite-negative"
    if m.startswith("rows:"):
        return "masked-row"
    return m.split(":", 1)[0]


def crossing_factors(c: Case) -> dict:
    tasks = max(1, c.batch * c.n_heads)
    # (n_threads <= 0, the kernel's default: some, as far as the case can tell)
    threads = ("one" if c.n_threads == 1 else "more-than-tasks" if c.n_threads > tasks
               else "some")
    empty = ("batch0" if c.batch == 0 else "q0" if c.q_len == 0 else "kv0" if c.kv_len == 0
             else "no")
    call = ("reuse" if c.reuse else "callers" if c.callers > 1 else
            "small-stack" if c.stack_kib else "plain")
    _, k_layout, v_layout = tensor_layouts(c.layout)
    return {"threads": threads, "mask": mask_kind(c), "callers": min(c.callers, 2),
            "empty": empty, "call": call, "k_layout": k_layout, "v_layout": v_layout}


def coverage(cases: list[Case]) -> list[dict]:
    """A group per crossing, the pairs family's first: its name, how many pairs it has,
    and the pairs met and never met (each 'factor=value x factor=value')."""
    cases = [c for c in cases if not c.invalid]
    have: set = set()
    for c in cases:
        have |= {tuple(sorted(p)) for p in itertools.combinations(factors_of(c).items(), 2)}
    groups = [_group("pairs family factors", all_pairs(), have)]
    for (a, b), (va, vb) in CROSSINGS.items():
        seen = {(f[a], f[b]) for f in map(crossing_factors, cases)}
        want = {((a, x), (b, y)) for x in va for y in vb}
        groups.append(_group(f"{a} x {b}", want,
                             {((a, x), (b, y)) for x, y in seen}))
    return groups


def _words(pair: tuple) -> str:
    return " x ".join(f"{k}={v}" for k, v in pair)


def _group(name: str, want: set, have: set) -> dict:
    met = sorted(want & have, key=repr)
    missing = sorted(want - have, key=repr)
    return {"crossing": name, "pairs": len(want), "met": [_words(p) for p in met],
            "missing": [_words(p) for p in missing]}


def render(groups: list[dict], show: int = 12) -> list[str]:
    """Lines for a terminal: per crossing, met of all, then up to `show` never met."""
    lines = []
    for g in groups:
        lines.append(f"{g['crossing']}: {len(g['met'])} of {g['pairs']} pairs met")
        for p in g["missing"][:show]:
            lines.append(f"  never met: {p}")
        if len(g["missing"]) > show:
            lines.append(f"  ... and {len(g['missing']) - show} more (--json lists them)")
    return lines
