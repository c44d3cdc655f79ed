"""Interleaved timing: every party is warmed up, then measured in rounds; each round
runs a batch of calls of every party in turn (the order rotating), so a burst of
other work on a shared machine lands on all of them. Medians, IQRs, noisy marks."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..caller_state import Guard
from .parties import Party

SLOW_CALL_S = 1.0        # a party slower than this per call gets MIN_ROUNDS samples
MIN_ROUNDS = 3


def summarize(seconds: Sequence[float]) -> dict:
    a = np.asarray(seconds, dtype=np.float64) * 1e6
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return {"median_us": float(q50), "iqr_us": float(q75 - q25), "min_us": float(a.min()),
            "samples": int(a.size)}


# A median whose interquartile range is more than this fraction of it is marked
# noisy: the rounds disagreed (a neighbour came and went), so its ratios are
# uncertain by about as much.
NOISY_IQR = 0.10


def is_noisy(stats: dict) -> bool:
    return stats["iqr_us"] > NOISY_IQR * stats["median_us"]


def measure(parties: Sequence[Party], rounds: int = 7, min_time: float = 0.05,
            max_batch: int = 2000, left: dict[str, list[str]] | None = None
            ) -> dict[str, list[float]]:
    """Interleaved timing: warm-up, then `rounds` rounds of one batch per party. A party
    that leaves its caller changed (a pinned thread, FTZ on, OMP_NUM_THREADS set: what
    `probe check` fails) would time every party after it in that state: it is put back
    after each of its batches, and said in `left` (party name -> the changes)."""
    guard = Guard(left)
    est = {}
    for p in parties:
        p.run(1)  # warm-up: first-touch, thread pool start, lazy init
        est[p.name] = min(p.run(2))
        guard.put_back(p.name)
    batch = {p.name: int(min(max_batch, max(1, math.ceil(min_time / max(est[p.name], 1e-7)))))
             for p in parties}
    samples: dict[str, list[float]] = {p.name: [] for p in parties}
    slow = {p.name for p in parties if est[p.name] > SLOW_CALL_S}
    for r in range(rounds):
        k = r % len(parties)
        for p in list(parties[k:]) + list(parties[:k]):  # rotate who goes first
            if p.name in slow and r >= MIN_ROUNDS:
                continue
            samples[p.name].extend(p.run(batch[p.name]))
            guard.put_back(p.name)
    return samples
