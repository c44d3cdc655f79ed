"""Heap allocations per call of a bench run's parties, counted in a worker process
(alloc_count), and the notes they call for."""

from __future__ import annotations

from .. import alloc_count
from .baselines import F32_REFERENCE


def count_allocs(results: list[dict], spec_of: dict, threads: int) -> str | None:
    """Each result's heap allocations per call, its kernel's and its peers' (not the F32
    reference: that is `flash`), counted in a worker (alloc_count): result["allocs"] and
    result["peers"][p]["allocs"]. Returns why nothing was counted, or None."""
    jobs: list[dict] = []
    where: list[list[dict]] = []
    index: dict[tuple[str, str], int] = {}
    for r in results:
        for name, into in [(r["kernel"], r)] + [(p, ps) for p, ps in r["peers"].items()
                                                  if p != F32_REFERENCE]:
            key = (r["shape"], spec_of.get(name, name))
            if key not in index:
                index[key] = len(jobs)
                jobs.append({"shape": key[0], "party": key[1]})
                where.append([])
            where[index[key]].append(into)
    counts, why = alloc_count.count(jobs, threads)
    for c, intos in zip(counts, where, strict=True):
        for into in intos:
            into["allocs"] = c
    return why


def thread_start_notes(results: list[dict]) -> list[str]:
    """A note per party that starts threads on every call (alloc_count's `threads`): a
    pool kept between calls costs nothing per call; a thread started and joined costs
    some 8 µs here (docs/performance.md), and a decode step makes the call per layer."""
    seen: dict[str, tuple[float, str]] = {}
    for r in results:
        for name, c in [(r["kernel"], r.get("allocs"))] + [
                (p, ps.get("allocs")) for p, ps in r["peers"].items()]:
            n = (c or {}).get("threads") or 0
            if n >= 0.5 and n > seen.get(name, (0, ""))[0]:
                seen[name] = (n, r["shape"])
    return [f"{name} starts {n:g} threads on every call (e.g. {shape}): a thread pool kept "
            "between calls would not" for name, (n, shape) in seen.items()]

