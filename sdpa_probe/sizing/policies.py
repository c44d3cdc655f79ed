"""Sizing policies: the rules runtimes use (or propose) for a ring / sink cache's slot
count, by name, and this tool's own rules beside them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import ProbeError
from .cache_workload import CacheWorkload, closed_form_minimum
from .simulator import Simulator


@dataclasses.dataclass(frozen=True)
class Policy:
    """A sizing rule: slots as a function of (window, sink, max chunk, max context)."""

    name: str
    fn: Callable[[int, int, int, int | None], int] | None  # None: the simulated minimum
    source: str


def _cap(n: int, context: int | None) -> int:
    return n if context is None else min(n, context)


POLICIES: dict[str, Policy] = {}


def register_policy(name: str, fn: Callable[[int, int, int, int | None], int] | None,
                    source: str) -> Policy:
    POLICIES[name] = Policy(name, fn, source)
    return POLICIES[name]


register_policy("2x-window", lambda w, s, c, n: s + 2 * w,
                "ExecuTorch 1.5.1: a ring of twice the window (sinks pinned before it)")
register_policy("window+chunk", lambda w, s, c, n: w + c,
                "ExecuTorch PR 22358's ring rule, uncapped: window + max chunk")
register_policy("window+chunk-capped", lambda w, s, c, n: _cap(w + c, n),
                "ExecuTorch PR 22358's _get_ring_cache_size: min(context, window + max chunk)")
register_policy("sink+window+chunk", lambda w, s, c, n: s + w + c,
                "ExecuTorch PR 22358's attention-sink rule (uncapped): sink + window + max chunk")
register_policy("sink+window+chunk-capped", lambda w, s, c, n: _cap(s + w + c, n),
                "ExecuTorch PR 22358's sink rule capped: min(context, sink + window + max chunk)")
register_policy("closed-form", lambda w, s, c, n: closed_form_minimum(w, s, c, n),
                "this tool's rule: min(context, sink + window + max chunk - 1)")
register_policy("simulated-minimum", None, "the smallest size the simulation finds exact")


def policy_size(policy: Policy, wl: CacheWorkload, sim: Simulator | None = None) -> int:
    if policy.fn is None:
        if sim is None:
            raise ProbeError(f"policy {policy.name} needs the simulation")
        return sim.minimum()
    return int(policy.fn(wl.window, wl.sink, wl.chunk, wl.context))


def resolve_policies(names: list[str] | None) -> list[Policy]:
    if not names:
        return list(POLICIES.values())
    out = []
    for n in names:
        if n not in POLICIES:
            raise ProbeError(f"unknown policy {n!r}; known: {', '.join(POLICIES)}")
        out.append(POLICIES[n])
    return out
