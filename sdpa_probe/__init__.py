"""sdpa_probe: a profiler and correctness harness for CPU scaled-dot-product attention kernels."""

__version__ = "0.1.0"
