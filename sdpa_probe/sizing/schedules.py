"""Chunk schedules: the orders of prefill chunks and decode steps that between them
expose any cache too small for a workload."""

from __future__ import annotations

import dataclasses

from .cache_workload import CacheWorkload


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    description: str
    chunks: tuple[int, ...]  # lengths, in arrival order, summing to the horizon


def _fill(total: int, first: tuple[int, ...], step: int) -> tuple[int, ...]:
    """`first` chunks, then `step`-long chunks, cut at `total` positions."""
    out, pos = [], 0
    for c in first:
        c = min(c, total - pos)
        if c > 0:
            out.append(c)
            pos += c
    while pos < total:
        c = min(step, total - pos)
        out.append(c)
        pos += c
    return tuple(out)


def _split(n: int, c: int) -> tuple[int, ...]:
    return tuple(min(c, n - i) for i in range(0, n, c))


EXHAUSTIVE_UP_TO = 128  # chunk limits up to this get every offset and every length
SAMPLED = 64            # above it (unless exhaustive=True): this many of each


def _spread(n: int, k: int, must: set[int]) -> list[int]:
    """All of range(n) when k >= n, else `must` plus evenly spaced values, k or a few more."""
    if k >= n:
        return list(range(n))
    picks = {round(i * (n - 1) / (k - 1)) for i in range(k)} | {v for v in must if 0 <= v < n}
    return sorted(picks)


def adversarial_schedules(wl: CacheWorkload, exhaustive: bool = False) -> list[Schedule]:
    """Chunk schedules that between them expose any too-small cache (docs/cache-sizing.md),
    most damaging first (a size under test stops at its first wrong query):

    * offset-o (o = 0 .. C-1): a first chunk of o tokens, then chunks of C: a full-length
      chunk at every start modulo C, among them the one right after the window fills and
      the one ending at the context limit. Any chunk start s >= S + W - 1 is as bad as any
      other, so these run to S + W + C + 1 positions (one chunk past a full window).
    * fill-p: a prefill of p = S + W - 1 and S + W tokens (chunks of at most C), then chunks
      of C: the first C-chunk arrives exactly when the window has filled;
    * prefill-then-decode: a prefill past S + W tokens in chunks of C, then one token a step;
    * uniform-c (c = C-1 .. 1): chunks of every shorter length, each to S + W + 2c + 2
      positions; c = 1 is pure decode.

    For C > EXHAUSTIVE_UP_TO (and not `exhaustive`) the offsets and the lengths are each
    SAMPLED values (the smallest and largest, the window-fill and context-end offsets, and
    an even spread); the minimum is unaffected (chunks of C at any start past a full window
    already break every too-small cache), the earliest wrong position may come later.
    """
    H, S, W = wl.horizon, wl.sink, wl.window
    C = min(wl.chunk, H)
    H_off = min(H, S + W + C + 1)
    seen: set[tuple[int, ...]] = set()
    out: list[Schedule] = []

    def add(name: str, desc: str, chunks: tuple[int, ...]) -> None:
        if chunks and chunks not in seen:
            seen.add(chunks)
            out.append(Schedule(name, desc, chunks))

    full = exhaustive or C <= EXHAUSTIVE_UP_TO
    offsets = _spread(C, C if full else SAMPLED,
                      set(range(8)) | {(S + W - 1) % C, (S + W) % C, H_off % C, (S + 1) % C})
    lengths = _spread(C, C if full else SAMPLED, set(range(1, 9)) | set(range(C - 8, C)))
    for o in offsets:
        desc = f"chunks of {C}" if o == 0 else f"a first chunk of {o}, then chunks of {C}"
        add(f"offset{o}-c{C}", desc, _fill(H_off, (o,), C))
    for p in (S + W - 1, S + W):
        if 0 < p < H_off:
            add(f"fill{p}-c{C}", f"prefill {p} (chunks <= {C}), then chunks of {C}",
                _fill(H_off, _split(p, C), C))
    p = min(H - 1, -(-(S + W) // C) * C)
    if p > 0:
        add(f"prefill{p}-decode", f"prefill {p} in chunks of {C}, then decode",
            _fill(H, _split(p, C), 1))
    for c in sorted((c for c in lengths if c >= 1), reverse=True):
        add(f"uniform-c{c}", "decode (one token a step)" if c == 1 else f"chunks of {c}",
            _fill(min(H, S + W + 2 * c + 2), (), c))
    return out


def search_schedules(wl: CacheWorkload, schedules: list[Schedule]) -> list[Schedule]:
    """The few schedules the first phase of the minimum search uses (chunks of C at offset 0
    and at the offset whose last chunk ends at the horizon, both fills, prefill-then-decode,
    pure decode). Any size they pass is then re-run with every schedule."""
    H, S, W = wl.horizon, wl.sink, wl.window
    C = min(wl.chunk, H)
    H_off = min(H, S + W + C + 1)
    names = {f"offset0-c{C}", f"offset{H_off % C}-c{C}", f"fill{S + W - 1}-c{C}",
             f"fill{S + W}-c{C}", "uniform-c1"}
    return [sc for sc in schedules if sc.name in names or sc.name.endswith("-decode")]

