"""The simulation: a ring (+sink) cache of a given size run through a real native
kernel under every adversarial chunk schedule, each query's output checked against the
float64 full-history reference; and the search for the smallest exact size."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from .. import native
from ..errors import ProbeError, SdpaUnsupported
from .cache_workload import CacheWorkload
from .schedules import EXHAUSTIVE_UP_TO, Schedule, adversarial_schedules, search_schedules

# the simulation's head shape: small, grouped-query (2 query heads share 1 kv head)
SIM_HEADS, SIM_KV_HEADS, SIM_HEAD_DIM = 2, 1, 16
# a kernel row is wrong when |out - ref| > ATOL + RTOL * |ref| for some element.
# float32 kernels land near 1e-7 here; a missing key moves a row by about
# |v_j - out| / (visible keys), far above this (see docs/cache-sizing.md).
ATOL, RTOL = 2e-5, 1e-4

@dataclasses.dataclass
class ScheduleResult:
    schedule: str
    position: int | None          # first query whose output is wrong
    missing_position: int | None  # first query the slot map shows missing a key
    max_err: float
    wrong_rows: int
    calls: int


@dataclasses.dataclass
class SimResult:
    """One cache size over the adversarial schedules."""

    size: int
    exact: bool
    position: int | None          # earliest wrong query over the schedules
    schedule: str | None          # ... and the schedule it came from
    schedule_description: str | None
    max_err: float                # largest |out - ref| over every query run
    missing_position: int | None  # earliest query missing a key by the slot map
    agree: bool                   # outputs and slot map agree on every schedule
    schedules_run: int
    calls: int
    complete: bool                # every schedule ran (False: stopped at the first wrong one)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _quantize(x: np.ndarray) -> tuple[native.QuantTensor, np.ndarray]:
    """Symmetric per-token int8 (zero point 0); also the real values it stands for."""
    amax = np.abs(x).max(axis=-1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    data = np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8)
    real = data.astype(np.float64) * scale[..., None].astype(np.float64)
    return native.QuantTensor(data, scale, None), real


def reference_outputs(wl: CacheWorkload, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      block: int = 256) -> np.ndarray:
    """float64 [horizon, heads, D]: the full-history sliding-window (+sink) oracle."""
    # deferred: torch takes seconds to import
    import torch

    # deferred: the oracle imports torch
    from ..reference import sdpa_reference

    H = q.shape[1]
    out = np.empty((H,) + q.shape[2:], dtype=np.float64)
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    for a in range(0, H, block):
        b = min(H, a + block)
        vis = wl.visible(np.arange(a, b), np.arange(b))
        mask = torch.from_numpy(np.where(vis, 0.0, -np.inf))
        out[a:b] = sdpa_reference(qt[:, a:b], kt[:, :b], vt[:, :b], mask=mask)[0].numpy()
    return out


class RingCache:
    """The cache under test: `size` slots, sinks pinned, a ring for the rest."""

    def __init__(self, sim: Simulator, size: int):
        self.sim, self.size = sim, size
        self.slot_pos = np.full(size, -1, dtype=np.int64)
        shape = (1, size, SIM_KV_HEADS, SIM_HEAD_DIM)
        if sim.int8:
            self.k = native.QuantTensor(np.zeros(shape, np.int8), np.ones(shape[:3], np.float32))
            self.v = native.QuantTensor(np.zeros(shape, np.int8), np.ones(shape[:3], np.float32))
        else:
            self.k = np.zeros(shape, np.float32)
            self.v = np.zeros(shape, np.float32)
        self._calls: dict[int, tuple] = {}

    def reset(self) -> None:
        self._calls.clear()  # a schedule uses a few chunk lengths; their masks can be large
        self.slot_pos.fill(-1)
        for t in (self.k, self.v):
            arr = t.data if isinstance(t, native.QuantTensor) else t
            arr.fill(0)

    def write(self, s: int, c: int) -> None:
        """Positions [s, s + c) in order: sinks to their own slot, the rest round the ring;
        a chunk longer than the ring keeps only its last R positions (later writes win)."""
        S, size, e = self.sim.wl.sink, self.size, s + c
        if s < S:
            self._copy(s, s, min(e, S, size) - s)
        R = size - S
        p = max(s, S, e - R)
        while R > 0 and p < e:  # at most two contiguous runs of slots
            slot = S + (p - S) % R
            n = min(e - p, S + R - slot)
            self._copy(slot, p, n)
            p += n

    def _copy(self, slot: int, pos: int, n: int) -> None:
        if n <= 0:
            return
        sim = self.sim
        if sim.int8:
            for dst, hist in ((self.k, sim.k_hist), (self.v, sim.v_hist)):
                dst.data[0, slot:slot + n] = hist.data[0, pos:pos + n]
                dst.scale[0, slot:slot + n] = hist.scale[0, pos:pos + n]
        else:
            self.k[0, slot:slot + n] = sim.k[0, pos:pos + n]
            self.v[0, slot:slot + n] = sim.v[0, pos:pos + n]
        self.slot_pos[slot:slot + n] = np.arange(pos, pos + n)

    def _prepared(self, c: int):
        ent = self._calls.get(c)
        if ent is None:
            sim = self.sim
            out = np.zeros((1, c, SIM_HEADS, SIM_HEAD_DIM), np.float32)
            mask = np.zeros((c, self.size), np.float32)
            call = native.prepare(sim.kernel.ffi, sim.q[:, :c], self.k, self.v, out, mask=mask,
                                  n_threads=sim.n_threads)
            ent = self._calls[c] = (call, out, mask)
        return ent

    def visible(self, s: int, c: int) -> np.ndarray:
        """CacheWorkload.visible(arange(s, s + c), slot_pos), faster: slot j is visible to the
        query positions [lo_j, hi_j] (lo = its position, hi = position + W - 1, or no limit
        for a sink; an empty slot to none)."""
        wl, kp = self.sim.wl, self.slot_pos
        big = np.int64(1) << 62
        lo = np.where(kp >= 0, kp, big)
        hi = np.where(kp < wl.sink, big, kp + (wl.window - 1))
        q = np.arange(s, s + c)[:, None]
        return (q >= lo) & (q <= hi)

    def attend(self, s: int, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Run the chunk's queries over the cache; returns (out [c, heads, D], visible)."""
        sim = self.sim
        call, out, mask = self._prepared(c)
        vis = self.visible(s, c)
        mask.fill(-np.inf)
        np.copyto(mask, np.float32(0.0), where=vis)
        call.args.q.data = sim.q_base + s * sim.q.strides[1]
        native.raise_for_status(sim.kernel.forward_args(call.args), sim.kernel.name)
        return out[0], vis


class Simulator:
    """Simulates one workload at any cache size through one kernel."""

    def __init__(self, wl: CacheWorkload, kernel: str | native.Kernel = "flash", *, seed: int = 0,
                 n_threads: int = 1, exhaustive: bool = False,
                 progress: Callable[[str], None] | None = None):
        self.wl = wl.validate()
        # told what runs now (`stage`, then each cache size's schedules): a large window
        # takes minutes
        self.progress = progress or (lambda text: None)
        self.stage = "the float64 reference"
        self.progress(f"{self.stage} over {wl.horizon} positions")
        self.kernel = native.get_kernel(kernel) if isinstance(kernel, str) else kernel
        self.n_threads = n_threads
        H = wl.horizon
        rng = np.random.default_rng(seed)
        # small query scale: near-uniform attention, so a missing key always shows
        self.q = (0.5 * rng.standard_normal((1, H, SIM_HEADS, SIM_HEAD_DIM))).astype(np.float32)
        self.k = rng.standard_normal((1, H, SIM_KV_HEADS, SIM_HEAD_DIM)).astype(np.float32)
        self.v = rng.standard_normal((1, H, SIM_KV_HEADS, SIM_HEAD_DIM)).astype(np.float32)
        self._q_buf = self.kernel.ffi.from_buffer(self.q)
        self.q_base = self.kernel.ffi.cast("char *", self._q_buf)
        self.int8 = not self._accepts_float()
        if self.int8:
            self.k_hist, k_real = _quantize(self.k)
            self.v_hist, v_real = _quantize(self.v)
            self.ref = reference_outputs(wl, self.q, k_real, v_real)
        else:
            self.ref = reference_outputs(wl, self.q, self.k, self.v)
        self.schedules = adversarial_schedules(wl, exhaustive)
        C = min(wl.chunk, wl.horizon)
        self.sampled = not exhaustive and C > EXHAUSTIVE_UP_TO
        self._full: dict[int, SimResult] = {}
        self._pass: dict[int, bool] = {}
        self._stopped: dict[int, SimResult] = {}
        self._minimum: int | None = None
        self.calls = 0

    def _accepts_float(self) -> bool:
        q = np.zeros((1, 1, SIM_HEADS, SIM_HEAD_DIM), np.float32)
        kv = np.zeros((1, 1, SIM_KV_HEADS, SIM_HEAD_DIM), np.float32)
        try:
            self.kernel(q, kv, kv, np.zeros_like(q), n_threads=1)
        except SdpaUnsupported:
            return False
        return True

    def _run_schedule(self, cache: RingCache, sched: Schedule) -> ScheduleResult:
        """One schedule from an empty cache, up to and including its first wrong chunk."""
        wl = self.wl
        cache.reset()
        s, first, missing, max_err, wrong, calls = 0, None, None, 0.0, 0, 0
        for c in sched.chunks:
            cache.write(s, c)
            out, vis = cache.attend(s, c)
            calls += 1
            ref = self.ref[s:s + c]
            err = np.abs(out - ref)
            bad = ~(err <= ATOL + RTOL * np.abs(ref))  # NaN counts as wrong
            row_bad = bad.reshape(c, -1).any(axis=1)
            e = float(err.max())
            max_err = max(max_err, math.inf if math.isnan(e) else e)
            qpos = np.arange(s, s + c)
            row_missing = vis.sum(axis=1) < wl.needed(qpos)
            if missing is None and row_missing.any():
                missing = s + int(np.argmax(row_missing))
            if row_bad.any():
                wrong += int(row_bad.sum())
                first = s + int(np.argmax(row_bad))
                break
            s += c
        self.calls += calls
        return ScheduleResult(sched.name, first, missing, max_err, wrong, calls)

    def run(self, size: int, *, stop_at_wrong: bool = False,
            schedules: list[Schedule] | None = None) -> SimResult:
        """Every adversarial schedule (or the given ones) at this cache size; each schedule
        stops at its first wrong chunk, and with stop_at_wrong the run stops there too."""
        if size < 1:
            raise ProbeError(f"cache size must be >= 1 slot, got {size}")
        custom = schedules is not None
        if not custom and size in self._full:
            return self._full[size]
        if not custom and stop_at_wrong and self._pass.get(size) is False:
            return self._stopped[size]
        # slots at or past the horizon are never written (slot = position there): a cache
        # that large behaves exactly like one of `horizon` slots, whose extra slots are -inf
        sim_size = min(size, self.wl.horizon)
        cache = RingCache(self, sim_size)
        results: list[ScheduleResult] = []
        todo = schedules if custom else self.schedules
        for n, sched in enumerate(todo, 1):
            self.progress(f"{self.stage}: {size} slots, schedule {n}/{len(todo)}")
            r = self._run_schedule(cache, sched)
            results.append(r)
            if stop_at_wrong and r.position is not None:
                break
        by_name = {sc.name: sc for sc in (schedules if custom else self.schedules)}
        wrong = [r for r in results if r.position is not None]
        first = min(wrong, key=lambda r: r.position) if wrong else None
        missing = [r.missing_position for r in results if r.missing_position is not None]
        res = SimResult(
            size=size, exact=not wrong,
            position=first.position if first else None,
            schedule=first.schedule if first else None,
            schedule_description=by_name[first.schedule].description if first else None,
            max_err=max((r.max_err for r in results), default=0.0),
            missing_position=min(missing) if missing else None,
            agree=all(r.position == r.missing_position for r in results),
            schedules_run=len(results), calls=sum(r.calls for r in results),
            complete=len(results) == len(schedules if custom else self.schedules))
        if not custom:
            self._pass[size] = res.exact
            if res.complete:
                self._full[size] = res
            else:
                self._stopped[size] = res
        return res

    def exact(self, size: int) -> bool:
        """Exact under every schedule (stops at the first wrong query)."""
        if size not in self._pass:
            self.run(size, stop_at_wrong=True)
        return self._pass[size]

    def _search(self, lo: int, hi: int, exact: Callable[[int], bool]) -> int:
        """Smallest size in (lo, hi] for which exact() holds, given exact(hi) and not
        exact(lo); exactness is monotone in the size (a larger ring holds a superset of
        positions after every write)."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if exact(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def minimum(self) -> int:
        """The smallest size exact under every schedule. Phase 1 binary-searches with the few
        search schedules (a lower bound: a size they break is broken); phase 2 re-runs that
        size with every schedule and, if some schedule breaks it, searches above it with all
        of them. A cache of `horizon` slots never evicts and must be exact."""
        if self._minimum is not None:
            return self._minimum
        H = self.wl.horizon
        self.stage = "the smallest exact cache"
        quick = search_schedules(self.wl, self.schedules)
        m = self._search(0, H, lambda n: self.run(n, stop_at_wrong=True, schedules=quick).exact)
        if not self.exact(m):
            if not self.exact(H):
                r = self.run(H)
                raise ProbeError(
                    f"{self.kernel.name}: wrong even with a cache of {H} slots (no eviction) "
                    f"at position {r.position}, max error {r.max_err:.3g}; the kernel, not "
                    "the cache, is at fault")
            m = self._search(m, H, self.exact)
        self._minimum = m
        return m
