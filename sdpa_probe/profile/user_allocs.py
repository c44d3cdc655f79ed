"""Heap allocations of a user kernel in a profile's attention slot, counted as `probe
bench` counts them (alloc_count: a worker process with a counting malloc preloaded).

The profile's own per-op counter sees the native library's allocator alone; a user
kernel calls malloc / new, which only a process-wide counter sees. Each user kernel is
counted per call at the bench shape of the model's attention (its heads, KV heads, head
dim and cache dtype, the context + 1 keys of a decode step), and the per-call figure
times the op's calls per step is added to its `sdpa` op and to the step's total."""

from __future__ import annotations

from collections.abc import Callable

from .. import alloc_count
from .attention import Attention
from .settings import Settings

ATTENTION_OP = "sdpa"  # the attention slot's op in the kernel graph (graph.py)


def bench_shape(s: Settings, context: int) -> str:
    """The `probe bench` shape of one decode step's attention call at this context."""
    sh = s.shape
    return f"decode-h{sh.heads}kv{sh.kv_heads}d{sh.head_dim}-kv{context + 1}-{s.cache}"


def count(s: Settings, atts: list[Attention], summaries: dict, threads: int,
          note: Callable[[str], None]) -> None:
    """Each user kernel's allocations per call, into its summaries ((label, context) ->
    summary): `sdpa`'s allocs_per_step / alloc_bytes_per_step and the step's, plus
    "user_allocs" (the per-call count, or why there is none)."""
    users = [a for a in atts if a.user is not None]
    keys = [(a, ctx) for a in users for (label, ctx) in summaries if label == a.label]
    if not keys:
        return
    note(f"heap allocations per call of {', '.join(sorted({a.user.name for a in users}))}: "
         "counted in a worker with a counting malloc")
    jobs = [{"shape": bench_shape(s, ctx), "party": str(a.user.path)} for a, ctx in keys]
    counts, why = alloc_count.count(jobs, threads)
    for (a, ctx), c in zip(keys, counts, strict=True):
        _add(summaries[(a.label, ctx)], c, why)


def _add(sm: dict, per_call: dict | None, why: str | None) -> None:
    if per_call is None or "error" in per_call:
        sm["user_allocs"] = {"error": why or (per_call or {}).get("error", "not counted")}
        return
    sm["user_allocs"] = per_call
    for op in sm["ops"]:
        if op["name"] == ATTENTION_OP:
            allocs, nbytes = per_call["allocs"] * op["calls"], per_call["bytes"] * op["calls"]
            op["allocs_per_step"] += allocs
            op["alloc_bytes_per_step"] += nbytes
            sm["allocs_per_step"] += allocs
            sm["alloc_bytes_per_step"] += nbytes
