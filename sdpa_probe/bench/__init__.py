"""Kernel-level benchmarks (`probe bench`): native kernels against torch's and
ExecuTorch's SDPA, measured side by side in one process.

Every party (a native kernel, torch, ExecuTorch) is warmed up, then measured in
rounds: each round runs a batch of calls of every party in turn (the order
rotating), so a burst of other work on a shared machine lands on all of them.
Native kernels are timed call by call in a C loop (sdpa_probe_bench_loop, no
Python overhead per call); peers are timed call by call from Python, as their
users call them. Reported: median and IQR per call, bytes and FLOPs per call,
GB/s, % of the DRAM read bandwidth and % of the roofline bound that `probe info`
measured, and ratio = peer median / kernel median (> 1: the kernel is faster).

Warm (default): every call reuses the same buffers, so inputs smaller than the
last-level cache are read from cache. Cold (--cold): calls rotate through
copies of the inputs totalling at least four times the last-level cache.

The rooms: shapes (names, presets, groups), inputs (input sets, cold rotation),
kernels (which native kernels), parties (make_party: the backends' timers), baselines
(what is timed beside them in the same rounds), timing (interleaved rounds),
figures (GB/s, roofline, core limit), runner (the run and its JSON document),
allocs (heap allocations per call), goals (the project's own speed goals), host
(what the run knows of the machine).
"""

# (tests/test_alloc_count.py reads the thread notes by their old name)
from .allocs import thread_start_notes as _thread_start_notes  # noqa: F401
from .baselines import DRAM_READ, F32_REFERENCE, FMA_PEAK, SLOW_CORE, f32_reference
from .figures import CORE_LIMIT_SLACK, core_lengths, core_limit, ratio_columns
from .goals import check_targets, measured_goals
from .inputs import COLD_FACTOR, COLD_MEM_SHARE, Inputs, cold_sets, make_inputs, rotation_note
from .kernels import kernels_for, resolve_kernels, takes
from .parties import make_party
from .runner import SCHEMA, TRIAL_CRASH, run, run_bench
from .shapes import DTYPES, GROUPS, PRESETS, Shape, parse_shape, select_shapes
from .timing import NOISY_IQR, is_noisy, measure, summarize

__all__ = [
    "CORE_LIMIT_SLACK", "COLD_FACTOR", "COLD_MEM_SHARE", "DRAM_READ", "DTYPES", "F32_REFERENCE",
    "FMA_PEAK", "GROUPS", "NOISY_IQR", "PRESETS", "SCHEMA", "SLOW_CORE", "TRIAL_CRASH",
    "Inputs", "Shape", "check_targets", "cold_sets", "core_lengths", "core_limit",
    "f32_reference", "is_noisy", "kernels_for", "make_inputs", "make_party", "measure",
    "measured_goals", "parse_shape", "ratio_columns", "resolve_kernels", "rotation_note", "run",
    "run_bench", "select_shapes", "summarize", "takes",
]
