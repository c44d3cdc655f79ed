"""KV-cache sizing by simulation: ring and attention-sink caches under chunked prefill.

A runtime with sliding-window attention keeps a ring KV cache; with attention
sinks the first `sink` positions are pinned. This package answers "how many slots
does that cache need so every query still sees every key it should?" by running
the cache, not by reading code:

* Semantics (docs/cache-sizing.md). Window W: a query at position p sees the keys
  at positions (p - W, p] (W keys, itself included). Sinks: positions [0, S) are
  always visible (causally). Visible(p) = {j <= p : p - j < W or j < S}; this is
  ExecuTorch's `delta < window_size` ring mask (and its sink mask).
* A cache of `size` slots keeps sinks at slots [0, S) and the other positions in
  a ring of R = size - S slots: position j >= S lives at slot S + (j - S) % R
  (with S = 0: slot j % size). A chunk of c tokens at positions [s, s + c) is
  written into the cache BEFORE attention runs for it, in position order, so it
  can overwrite keys its own earlier queries still need.
* The mask of a chunk is built from the cache's slot-to-position map: a slot is
  visible to query p iff it holds a position j with j <= p and (p - j < W or
  j < S); every other slot (empty, evicted-to-be, out of window) is -inf. The
  chunk then runs through a real native kernel over the whole cache.
* The oracle is the float64 reference over the full history with the
  sliding-window (+sink) mask. A cache size is *exact* for a workload when every
  query of every adversarial schedule matches the oracle.

Closed form (proved in docs/cache-sizing.md, checked here against the search):

    minimum = min(N, S + W + C - 1)     (N: max context, C: max prefill chunk)

Beside the cache, the arithmetic a quantized SDPA's buffers rest on (ExecuTorch PR
15610): align_up, and every kernel's per-thread scratch under a guarded allocator.

The rooms: cache_workload (what the cache serves, the closed form), schedules,
simulator, policies, memory (a size's bytes at a model's KV shape), report (`probe
sizing`'s verdicts), align, guard (the guarded allocator), scratch, suite (`probe check
--suite cache-sizing`).
"""

from .align import (
    INT64_MAX,
    AlignReport,
    align_grid,
    align_up_exact,
    align_up_wrong_mask,
    check_align_up,
)
from .cache_workload import MAX_HORIZON, CacheWorkload, closed_form_minimum
from .guard import AllocRecord, guard_selftest, guarded
from .memory import KV_DTYPES, MIB, KVShape, mib
from .policies import POLICIES, Policy, policy_size, register_policy, resolve_policies
from .report import VERDICTS, PolicyResult, SizingReport, evaluate, judge, size_caches
from .schedules import (
    EXHAUSTIVE_UP_TO,
    SAMPLED,
    Schedule,
    adversarial_schedules,
    search_schedules,
)
from .scratch import (
    SHAPES,
    WASTE_LIMIT,
    BlockVerdict,
    ScratchReport,
    ScratchShape,
    measure_scratch,
    per_block_dequant_sizing,
)
from .simulator import (
    ATOL,
    RTOL,
    SIM_HEAD_DIM,
    SIM_HEADS,
    SIM_KV_HEADS,
    RingCache,
    ScheduleResult,
    SimResult,
    Simulator,
    reference_outputs,
)
from .suite import SUITE_GRID, SUITE_WORKLOADS, expected_verdict, run_suite, scratch_cases

__all__ = [
    "ATOL", "EXHAUSTIVE_UP_TO", "INT64_MAX", "KV_DTYPES", "MAX_HORIZON", "MIB", "POLICIES",
    "RTOL", "SAMPLED", "SHAPES", "SIM_HEAD_DIM", "SIM_HEADS", "SIM_KV_HEADS", "SUITE_GRID",
    "SUITE_WORKLOADS", "VERDICTS", "WASTE_LIMIT", "AlignReport", "AllocRecord",
    "BlockVerdict", "CacheWorkload", "KVShape", "Policy", "PolicyResult", "RingCache",
    "Schedule", "ScheduleResult", "ScratchReport", "ScratchShape", "SimResult", "Simulator",
    "SizingReport", "adversarial_schedules", "align_grid", "align_up_exact",
    "align_up_wrong_mask", "check_align_up", "closed_form_minimum", "evaluate",
    "expected_verdict", "guard_selftest", "guarded", "judge", "measure_scratch", "mib",
    "per_block_dequant_sizing", "policy_size", "reference_outputs", "register_policy",
    "resolve_policies", "run_suite", "scratch_cases", "search_schedules", "size_caches",
]
