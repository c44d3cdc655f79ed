"""Whether the machine was busy while we measured: other processes' CPU time and the
hypervisor's steal (from /proc/stat), and the spread between rounds that should agree.
A roofline measured busy is not this machine's figure (machine.roofline)."""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_FRACTION = 0.1  # others (or the hypervisor) took this much of the CPUs: "busy"
# The rounds' best DRAM read figures this far apart (over the higher): something else
# read memory during one of them, which no CPU counter of ours need show
SPREAD_LIMIT = 0.2
SPREAD_KEYS = ("read_bw_gbs_1t", "read_bw_gbs_all")
NOW_SECONDS = 0.5  # how long busy_now() watches


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, steal) clock ticks of all CPUs from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        v = [int(x) for x in fields[1:]]
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu" or len(v) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return user + nice + system + irq + softirq, steal


def round_spread(details: dict) -> dict:
    """Per DRAM read figure whose rounds' bests differ by more than SPREAD_LIMIT: the
    spread, a fraction of the best round."""
    spread = {}
    for k in SPREAD_KEYS:
        rounds = (details.get(k) or {}).get("round_bests") or []
        if len(rounds) > 1 and max(rounds) > 0:
            s = (max(rounds) - min(rounds)) / max(rounds)
            if s > SPREAD_LIMIT:
                spread[k] = round(s, 3)
    return spread


class LoadMonitor:
    """How much CPU others used (and the hypervisor stole) while we measured."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()
        self.ticks0 = _cpu_ticks()

    @classmethod
    def now(cls) -> dict:
        """The load over the next NOW_SECONDS, this process idle: is it worth measuring?"""
        monitor = cls()
        time.sleep(NOW_SECONDS)
        return monitor.result()

    def result(self, details: dict | None = None) -> dict:
        """The load since this monitor started; with a measurement's `details`, its
        rounds' spread counts too."""
        wall = time.monotonic() - self.t0
        mine = time.process_time() - self.cpu0
        ticks = _cpu_ticks()
        spread = round_spread(details or {})
        if self.ticks0 is None or ticks is None or wall <= 0:
            return {"other_cpu_fraction": None, "steal_fraction": None, "round_spread": spread,
                    "busy": bool(spread)}
        try:
            hz = os.sysconf("SC_CLK_TCK")
        except (ValueError, OSError):
            hz = 100
        capacity = wall * (os.cpu_count() or 1)
        busy = (ticks[0] - self.ticks0[0]) / hz
        steal = (ticks[1] - self.ticks0[1]) / hz
        other = max(0.0, busy - mine) / capacity
        stolen = max(0.0, steal) / capacity
        return {"other_cpu_fraction": round(other, 3), "steal_fraction": round(stolen, 3),
                "round_spread": spread,
                "busy": other + stolen > BUSY_FRACTION or bool(spread)}


def describe(load: dict) -> str:
    """The load in words: what made it busy."""
    parts = []
    other, steal = load.get("other_cpu_fraction"), load.get("steal_fraction")
    if other:
        parts.append(f"{other:.0%} of the CPUs used by other processes")
    if steal:
        parts.append(f"{steal:.0%} stolen by the hypervisor")
    for k, s in (load.get("round_spread") or {}).items():
        parts.append(f"{k} {s:.0%} apart between rounds")
    for k, b in (load.get("below_best") or {}).items():
        parts.append(f"{k} {b['fraction']:.0%} of the best measured here")
    return ", ".join(parts) or "no detail"
