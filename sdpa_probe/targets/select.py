"""--target on the command line: every backend asked for on every target given, and
each target's worker built (or reached, over ssh) before any case runs, so that a
missing tool, a build error or an unreachable device is one line and exit 2."""

from __future__ import annotations

from ..backends.registry import BackendSpec
from ..errors import ProbeError
from .check import TargetBackend
from .spec import parse_targets, why_unusable


def on_targets(specs: list[BackendSpec], values: list[str] | None) -> list[BackendSpec]:
    """Each spec on each target (in that order); the specs as they are without --target."""
    if not values:
        return specs
    targets = parse_targets(values)
    for t in targets:
        why = why_unusable(t)
        if why:
            raise ProbeError(why)
    out = [s.on(t) for s in specs for t in targets]
    for spec in out:
        if spec.target:
            try:
                TargetBackend(spec.name).build()
            except ConnectionError as exc:
                raise ProbeError(str(exc)) from None
    return out
