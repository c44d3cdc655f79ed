"""Power-of-two alignment: the native `sdpa_probe_align_up(x, a)` against exact integer
arithmetic over a grid of x and power-of-two a, and the expression ExecuTorch PR 15610
shipped, `(x + a - 1) & -(a - 1)`, shown wrong: -(a - 1) is odd, so the mask keeps bit 0
and the result is the right one plus 1 for every even x (a >= 2), and 0 for a = 1.
Never below x for a >= 2 (no overrun), but not a multiple of a."""

from __future__ import annotations

import dataclasses

from .. import native

INT64_MAX = (1 << 63) - 1


def align_up_exact(x: int, a: int) -> int:
    """The smallest multiple of a that is >= x."""
    return -(-x // a) * a


def _i64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def align_up_wrong_mask(x: int, a: int) -> int:
    """The expression with the wrong mask: (x + a - 1) & -(a - 1), in int64."""
    return _i64(_i64(x + a - 1) & _i64(-(a - 1)))


def align_grid() -> tuple[list[int], list[int]]:
    xs = list(range(0, 1025))
    for k in range(10, 63):
        xs += [(1 << k) - 1, 1 << k, (1 << k) + 1]
    xs += [INT64_MAX - (1 << 20), INT64_MAX - 1, INT64_MAX]
    aligns = [1 << k for k in range(0, 21)] + [1 << 40, 1 << 62]
    return sorted(set(xs)), aligns


@dataclasses.dataclass
class AlignReport:
    checked: int
    mismatches: list[tuple[int, int, int, int]]   # (x, a, native, expected)
    rejects_ok: bool                               # -1 for bad a, negative x, overflow
    reject_failures: list[tuple[int, int, int]]
    wrong_mask: list[dict]                         # per alignment: how often the mask is wrong

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.rejects_ok


def _wrong_mask_by_alignment(xs: list[int], aligns: list[int]) -> list[dict]:
    out = []
    small = [x for x in xs if x <= 1 << 40]
    for a in aligns[:13]:
        wrong = [x for x in small if align_up_wrong_mask(x, a) != align_up_exact(x, a)]
        below = [x for x in wrong if align_up_wrong_mask(x, a) < x]
        ex = wrong[0] if wrong else None
        out.append({"align": a, "checked": len(small), "wrong": len(wrong),
                    "smaller_than_x": len(below),
                    "example": None if ex is None else
                    {"x": ex, "wrong_mask": align_up_wrong_mask(ex, a),
                     "exact": align_up_exact(ex, a)}})
    return out


def check_align_up() -> AlignReport:
    _, lib, _ = native.native_lib()
    xs, aligns = align_grid()
    mismatches, checked = [], 0
    for a in aligns:
        for x in xs:
            want = align_up_exact(x, a) if x <= INT64_MAX - (a - 1) else -1
            got = int(lib.sdpa_probe_align_up(x, a))
            checked += 1
            if got != want:
                mismatches.append((x, a, got, want))
    bad = [(5, 0), (5, -4), (5, 3), (5, 6), (5, 24), (5, 48), (5, 96), (-1, 8),
           (-(1 << 40), 64), (INT64_MAX, 2), (INT64_MAX - 6, 8)]
    reject_failures = [(x, a, int(lib.sdpa_probe_align_up(x, a))) for x, a in bad
                       if int(lib.sdpa_probe_align_up(x, a)) != -1]
    return AlignReport(checked, mismatches, not reject_failures, reject_failures,
                       _wrong_mask_by_alignment(xs, aligns))
