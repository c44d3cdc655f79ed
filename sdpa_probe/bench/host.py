"""What a bench run knows of its machine (from `probe info`, machine.py): the
roofline, the cache sizes, the read benchmark's buffer size and a summary for the
report. Each is None / {} / a default where the machine cannot tell."""

from __future__ import annotations

from .. import machine
from ..build import cpu_model
from ..errors import ProbeError


def roofline() -> dict | None:
    try:
        return machine.roofline()
    except (AttributeError, ProbeError, OSError):
        return None


def cache_sizes() -> dict:
    """machine.cache_sizes(), or {} where it cannot be read."""
    try:
        return machine.cache_sizes()
    except (AttributeError, OSError):
        return {}


def llc_bytes() -> int | None:
    c = cache_sizes()
    return c.get("l3_bytes") or c.get("l2_bytes")


def l2_bytes_for(threads: int) -> int | None:
    """The L2 capacity the threads have between them (one L2 per core assumed)."""
    c = cache_sizes()
    if not c.get("l2_bytes"):
        return None
    return threads * c["l2_bytes"] // max(1, c.get("l2_shared_cpus") or 1)


def read_buffer_bytes() -> int:
    try:
        return int(machine.plan()["dram_buffer_bytes"])
    except (AttributeError, KeyError, OSError):
        return 256 << 20


def machine_summary(res) -> dict:
    out = {"cpu_model": cpu_model(), "compiler": res.cc_version, "flags": list(res.flags),
           "module": res.module_name}
    try:
        m = machine.describe()
        out.update(logical_cores=m.get("logical_cores"), caches=m.get("caches"),
                   isa=[k for k, v in (m.get("isa") or {}).items() if v])
    except (AttributeError, OSError):
        pass
    return out
