"""sdpa_probe: a profiler and correctness harness for CPU scaled-dot-product attention kernels."""

__version__ = "0.1.0"

# What every report this tool writes says of its writer (and how an output path that
# already holds one is told from a file of the user's: cli/output.py)
TOOL = {"name": "sdpa_probe", "version": __version__}
