"""The ranges of the command line's numbers that several commands share, checked
before any work (docs/reliability.md has every command's table)."""

from __future__ import annotations

from .errors import ProbeError

# a seed travels as a signed 64-bit integer (JSON readers; the decode model's seed is
# 64 bits, so a larger one would alias a smaller one)
MAX_SEED = 2**63 - 1
# the native thread pool's limit (SDPA_PROBE_MAX_THREADS)
MAX_THREADS = 64
# a position count (a context, a cache's capacity, tokens): the native API takes int64,
# and nothing near 2^31 positions fits in memory anyway
MAX_POSITIONS = 2**31 - 1


def check_seed(seed: int, option: str = "--seed") -> None:
    if seed < 0:
        raise ProbeError(f"{option} must be >= 0, got {seed}")
    if seed > MAX_SEED:
        raise ProbeError(f"{option} must be at most {MAX_SEED} (2**63 - 1), got {seed}")


def check_threads(threads: int, option: str = "--threads") -> None:
    if not 0 <= threads <= MAX_THREADS:
        raise ProbeError(f"{option} must be between 1 and {MAX_THREADS} (0: all cores), "
                         f"got {threads}")


def check_count(value: int, option: str, lo: int, hi: int, what: str = "") -> None:
    """lo <= value <= hi, else one line naming the option (what: why hi, in brackets)."""
    if value < lo:
        raise ProbeError(f"{option} must be >= {lo}, got {value}")
    if value > hi:
        raise ProbeError(f"{option} must be at most {hi}{f' ({what})' if what else ''}, "
                         f"got {value}")
