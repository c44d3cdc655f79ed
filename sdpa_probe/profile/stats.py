"""Robust summaries of step-time samples."""

from __future__ import annotations

import numpy as np


def median(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.median(x)) if x.size else float("nan")


def iqr(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return float("nan")
    q1, q3 = np.percentile(x, [25, 75])
    return float(q3 - q1)


def bootstrap_ratio_ci(a, b, n_boot: int = 4000, conf: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
    """median(a) / median(b) and a percentile bootstrap CI, resampling a and b independently."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    ratio = median(a) / median(b)
    rng = np.random.default_rng(seed)
    ra = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    r = ra / rb
    lo, hi = np.percentile(r, [100 * (1 - conf) / 2, 100 * (1 + conf) / 2])
    return ratio, float(lo), float(hi)


def verdict(lo: float, hi: float) -> str:
    """What the CI of time(a) / time(b) says about b: faster, slower, no significant difference."""
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "no significant difference"


def slope_per_1000(xs, ys) -> float:
    """Least-squares growth of ys per 1000 units of xs (nan with fewer than 2 distinct xs)."""
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.asarray(ys, dtype=np.float64)
    if np.unique(xs).size < 2:
        return float("nan")
    return float(np.polyfit(xs, ys, 1)[0] * 1000.0)
