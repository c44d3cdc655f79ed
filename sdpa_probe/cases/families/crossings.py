"""The crossings the rest of the matrix never made (`probe check --coverage` lists them):
empty work under every way of calling, masks on the split-K path and under concurrent
callers. Each case is small: together they cost a few seconds."""

from __future__ import annotations

from ..case import DTYPES, Case

# one of each mask value class: additive, a row hidden, the most negative finite value
# instead of -inf, a window, a wrapped ring, attention sinks
CROSSING_MASKS = ("random", "rows:middle", "rows:negfinite", "window:20", "ring:50",
                  "sink:4:40")


def crossings() -> list[Case]:
    """Empty work x the call, threads x mask, concurrent callers x mask."""
    cs: list[Case] = []
    # empty work (no sequence, no query row, no key) under each way a runtime calls:
    # a kernel that returns early must still leave its caller as it was, on every
    # path (the same buffers again, two callers at once, a small stack)
    calls = ({}, {"reuse": True}, {"callers": 2}, {"stack_kib": 256})
    for i, (empty, call) in enumerate((e, c) for e in ("batch", "q_len", "kv_len")
                                      for c in calls):
        if empty == "kv_len" and not call:
            continue  # (the decode family's kv_len 0 is a plain call)
        shape = {"batch": 1, "q_len": 2, "kv_len": 70} | {empty: 0}
        cs.append(Case("crossings", **shape, dtype=DTYPES[i % 4], n_heads=4, n_kv_heads=2,
                       **call))
    # masks on the split-K path (three threads over one (batch, head) task: its keys are
    # split and the partial states merged; a masked row or block must merge as nothing)
    # and on threads over several tasks
    for m in CROSSING_MASKS:
        cs.append(Case("crossings", q_len=4, kv_len=77, n_heads=1, n_kv_heads=1,
                       n_threads=3, mask=m))
        if m != "random":  # (the threads family has an additive mask over tasks)
            cs.append(Case("crossings", q_len=4, kv_len=77, n_heads=4, n_kv_heads=2,
                           n_threads=2, mask=m))
    # two callers at once, each its own mask: a kernel that keeps a mask's visible
    # ranges or skip table in shared state mixes the callers' rows
    for m in CROSSING_MASKS:
        cs.append(Case("crossings", q_len=3, kv_len=77, n_heads=4, n_kv_heads=2, callers=2,
                       mask=m))
    return cs
