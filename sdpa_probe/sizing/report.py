"""`probe sizing`: every policy's cache size judged against the simulated minimum
(undersized, exact, oversized, larger than a full-context cache), with its memory."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from .. import native
from ..errors import ProbeError
from ..limits import check_seed
from .cache_workload import CacheWorkload, closed_form_minimum
from .memory import KVShape, mib
from .policies import Policy, policy_size, resolve_policies
from .simulator import ATOL, RTOL, SIM_HEAD_DIM, SIM_HEADS, SIM_KV_HEADS, SimResult, Simulator

VERDICTS = ("undersized", "exact", "oversized", "exceeds-full-context")


@dataclasses.dataclass
class PolicyResult:
    name: str
    source: str
    size: int
    verdict: str                 # one of VERDICTS
    detail: str                  # the human sentence
    bytes: int
    position: int | None = None  # undersized: first wrong query position
    max_err: float | None = None
    schedule: str | None = None  # undersized: the schedule showing it
    schedule_description: str | None = None
    slots_over: int | None = None  # oversized / exceeds: size - minimum
    bytes_over: int | None = None

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mib"] = mib(self.bytes)
        if self.bytes_over is not None:
            d["mib_over"] = mib(self.bytes_over)
        return d


def judge(size: int, res: SimResult, minimum: int, wl: CacheWorkload, shape: KVShape,
          policy: Policy) -> PolicyResult:
    bps = shape.bytes_per_slot
    base = dict(name=policy.name, source=policy.source, size=size, bytes=size * bps,
                max_err=res.max_err)
    if not res.exact:
        return PolicyResult(verdict="undersized", position=res.position, schedule=res.schedule,
                            schedule_description=res.schedule_description,
                            detail=f"undersized: wrong outputs at position {res.position}, "
                                   f"max error {res.max_err:.3g}", **base)
    over = size - minimum
    if wl.context is not None and size > wl.context:
        return PolicyResult(verdict="exceeds-full-context", slots_over=over, bytes_over=over * bps,
                            detail=f"larger than a full-context cache ({size} > {wl.context} "
                                   f"slots; {over} over the minimum, {mib(over * bps):.2f} MiB)",
                            **base)
    if over == 0:
        return PolicyResult(verdict="exact", slots_over=0, bytes_over=0, detail="exact", **base)
    if over < 0:  # cannot happen: the minimum is the smallest exact size the search found
        raise ProbeError(f"internal: {policy.name} is exact at {size} slots, below the "
                         f"simulated minimum {minimum}")
    return PolicyResult(verdict="oversized", slots_over=over, bytes_over=over * bps,
                        detail=f"oversized by {over} slot{'s' if over != 1 else ''} "
                               f"({mib(over * bps):.2f} MiB at this model's KV shape)", **base)


@dataclasses.dataclass
class SizingReport:
    workload: CacheWorkload
    kernel: str
    kv_shape: KVShape
    minimum: int
    closed_form: int
    policies: list[PolicyResult]
    horizon: int
    schedules: int
    calls: int
    seconds: float
    sampled: bool = False  # offsets and lengths sampled (C > EXHAUSTIVE_UP_TO)

    def as_dict(self) -> dict:
        full = self.workload.context
        return {
            "workload": self.workload.as_dict(),
            "kernel": self.kernel,
            "semantics": "query p sees keys (p - window, p] plus sinks [0, sink); a chunk is "
                         "written before it attends",
            "minimum": self.minimum,
            "closed_form": self.closed_form,
            "closed_form_rule": "min(context, sink + window + chunk - 1)",
            "closed_form_agrees": self.minimum == self.closed_form,
            "full_context": full,
            "full_context_bytes": None if full is None else full * self.kv_shape.bytes_per_slot,
            "minimum_bytes": self.minimum * self.kv_shape.bytes_per_slot,
            "kv_shape": self.kv_shape.as_dict(),
            "policies": [p.as_dict() for p in self.policies],
            "simulation": {"horizon": self.horizon, "schedules": self.schedules,
                           "kernel_calls": self.calls, "seconds": self.seconds,
                           "sampled": self.sampled,
                           "heads": SIM_HEADS, "kv_heads": SIM_KV_HEADS,
                           "head_dim": SIM_HEAD_DIM, "atol": ATOL, "rtol": RTOL},
        }


def evaluate(wl: CacheWorkload, policies: list[str] | None = None, *,
             kernel: str | native.Kernel = "flash",
             kv_shape: KVShape | None = None, seed: int = 0, exhaustive: bool = False,
             sim: Simulator | None = None,
             progress: Callable[[str], None] | None = None) -> SizingReport:
    """Every policy's size, the simulated minimum, and a verdict for each (`progress` is
    told what runs now)."""
    t0 = time.perf_counter()
    shape = (kv_shape or KVShape()).validate()
    chosen = resolve_policies(policies)
    sim = sim or Simulator(wl, kernel, seed=seed, exhaustive=exhaustive, progress=progress)
    minimum = sim.minimum()
    results = []
    for n, pol in enumerate(chosen, 1):
        sim.stage = f"policy {pol.name} ({n}/{len(chosen)})"
        size = policy_size(pol, wl, sim)
        if size < 1:
            raise ProbeError(f"policy {pol.name} picks {size} slots")
        results.append(judge(size, sim.run(size), minimum, wl, shape, pol))
    return SizingReport(wl, sim.kernel.name, shape, minimum,
                        closed_form_minimum(wl.window, wl.sink, wl.chunk, wl.context), results,
                        wl.horizon, len(sim.schedules), sim.calls, time.perf_counter() - t0,
                        sim.sampled)



def size_caches(window: int, chunk: int, sink: int = 0, context: int | None = None,
                policies: list[str] | None = None, *, kernel: str = "flash", layers: int = 16,
                kv_heads: int = 8, head_dim: int = 64, dtype: str = "f16", seed: int = 0,
                exhaustive: bool = False,
                progress: Callable[[str], None] | None = None) -> SizingReport:
    """`probe sizing`: the workload and the model's KV shape checked, then every policy
    (None: all of them) judged by simulation through `kernel`."""
    check_seed(seed)
    wl = CacheWorkload(window=window, chunk=chunk, sink=sink, context=context).validate()
    shape = KVShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype).validate()
    kern = native.get_kernel(kernel)  # (an unknown name fails before any input is made)
    # unknown policy names fail before the simulation starts (evaluate resolves them first)
    return evaluate(wl, policies, kernel=kern, kv_shape=shape, seed=seed, exhaustive=exhaustive,
                    progress=progress)
