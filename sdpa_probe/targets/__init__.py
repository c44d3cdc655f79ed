"""Other CPUs a kernel is checked on: aarch64 under qemu (NEON, SVE at a fixed vector
length) and Linux devices over ssh (spec.py names them, build.py builds the native
worker for them, arena.py is what the harness and the worker exchange, remote.py runs
it, check.py and judging.py judge what it saw)."""
