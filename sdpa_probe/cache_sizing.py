"""KV-cache sizing by simulation: ring and attention-sink caches under chunked prefill.

A runtime with sliding-window attention keeps a ring KV cache; with attention
sinks the first `sink` positions are pinned. This module answers "how many slots
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
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from . import native
from .errors import ProbeError, SdpaUnsupported

# the simulation's head shape: small, grouped-query (2 query heads share 1 kv head)
SIM_HEADS, SIM_KV_HEADS, SIM_HEAD_DIM = 2, 1, 16
# a kernel row is wrong when |out - ref| > ATOL + RTOL * |ref| for some element.
# float32 kernels land near 1e-7 here; a missing key moves a row by about
# |v_j - out| / (visible keys), far above this (see docs/cache-sizing.md).
ATOL, RTOL = 2e-5, 1e-4
MAX_HORIZON = 1 << 16

MIB = float(1 << 20)


# ---- workload ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Workload:
    """Sliding window W, pinned sinks S, largest prefill chunk C, max context N (None: no
    limit)."""

    window: int
    chunk: int
    sink: int = 0
    context: int | None = None

    def validate(self) -> Workload:
        if self.window < 1:
            raise ProbeError(f"--window must be >= 1, got {self.window}")
        if self.chunk < 1:
            raise ProbeError(f"--chunk must be >= 1, got {self.chunk}")
        if self.sink < 0:
            raise ProbeError(f"--sink must be >= 0, got {self.sink}")
        if self.context is not None and self.context < 1:
            raise ProbeError(f"--context must be >= 1, got {self.context}")
        if self.horizon > MAX_HORIZON:
            raise ProbeError(f"workload needs {self.horizon} simulated positions; the limit is "
                             f"{MAX_HORIZON} (sink + window + 2 x chunk)")
        return self

    @property
    def horizon(self) -> int:
        """Positions simulated. Beyond S + W + 2C + 2 every chunk start s has s >= S + W - 1
        and the ring has wrapped, so the slot map seen by a chunk is a translate of one already
        simulated: nothing new can go wrong (docs/cache-sizing.md)."""
        h = self.sink + self.window + 2 * self.chunk + 2
        return h if self.context is None else min(h, self.context)

    @property
    def id(self) -> str:
        head = f"sink{self.sink}" if self.sink else "ring"
        tail = f"-n{self.context}" if self.context is not None else ""
        return f"{head}-w{self.window}-c{self.chunk}{tail}"

    def describe(self) -> str:
        sinks = f"{self.sink} sinks" if self.sink else "no sinks"
        ctx = f"context {self.context}" if self.context is not None else "context unbounded"
        return f"window {self.window}, chunk {self.chunk}, {sinks}, {ctx}"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def visible(self, qpos: np.ndarray, kpos: np.ndarray) -> np.ndarray:
        """[len(qpos), len(kpos)] bool: key position kpos visible to query qpos (kpos < 0 is an
        empty slot)."""
        delta = qpos[:, None] - kpos[None, :]
        return (kpos[None, :] >= 0) & (delta >= 0) & ((delta < self.window) |
                                                      (kpos[None, :] < self.sink))

    def needed(self, qpos: np.ndarray) -> np.ndarray:
        """How many keys query qpos sees with the full history."""
        return np.where(qpos - self.window + 1 <= self.sink, qpos + 1, self.sink + self.window)


def closed_form_minimum(window: int, sink: int, chunk: int, context: int | None) -> int:
    """The smallest exact cache: min(N, S + W + C - 1)."""
    m = sink + window + chunk - 1
    return m if context is None else min(context, m)


# ---- schedules ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    description: str
    chunks: tuple[int, ...]  # lengths, in arrival order, summing to the horizon


def _fill(total: int, first: tuple[int, ...], step: int) -> tuple[int, ...]:
    """`first` chunks, then `step`-long chunks, cut at `total` positions."""
    out, pos = [], 0
    for c in first:
        c = min(c, total - pos)
        if c > 0:
            out.append(c)
            pos += c
    while pos < total:
        c = min(step, total - pos)
        out.append(c)
        pos += c
    return tuple(out)


def _split(n: int, c: int) -> tuple[int, ...]:
    return tuple(min(c, n - i) for i in range(0, n, c))


EXHAUSTIVE_UP_TO = 128  # chunk limits up to this get every offset and every length
SAMPLED = 64            # above it (unless exhaustive=True): this many of each


def _spread(n: int, k: int, must: set[int]) -> list[int]:
    """All of range(n) when k >= n, else `must` plus evenly spaced values, k or a few more."""
    if k >= n:
        return list(range(n))
    picks = {round(i * (n - 1) / (k - 1)) for i in range(k)} | {v for v in must if 0 <= v < n}
    return sorted(picks)


def adversarial_schedules(wl: Workload, exhaustive: bool = False) -> list[Schedule]:
    """Chunk schedules that between them expose any too-small cache (docs/cache-sizing.md),
    most damaging first (a size under test stops at its first wrong query):

    * offset-o (o = 0 .. C-1): a first chunk of o tokens, then chunks of C: a full-length
      chunk at every start modulo C, among them the one right after the window fills and
      the one ending at the context limit. Any chunk start s >= S + W - 1 is as bad as any
      other, so these run to S + W + C + 1 positions (one chunk past a full window).
    * fill-p: a prefill of p = S + W - 1 and S + W tokens (chunks of at most C), then chunks
      of C: the first C-chunk arrives exactly when the window has filled;
    * prefill-then-decode: a prefill past S + W tokens in chunks of C, then one token a step;
    * uniform-c (c = C-1 .. 1): chunks of every shorter length, each to S + W + 2c + 2
      positions; c = 1 is pure decode.

    For C > EXHAUSTIVE_UP_TO (and not `exhaustive`) the offsets and the lengths are each
    SAMPLED values (the smallest and largest, the window-fill and context-end offsets, and
    an even spread); the minimum is unaffected (chunks of C at any start past a full window
    already break every too-small cache), the earliest wrong position may come later.
    """
    H, S, W = wl.horizon, wl.sink, wl.window
    C = min(wl.chunk, H)
    H_off = min(H, S + W + C + 1)
    seen: set[tuple[int, ...]] = set()
    out: list[Schedule] = []

    def add(name: str, desc: str, chunks: tuple[int, ...]) -> None:
        if chunks and chunks not in seen:
            seen.add(chunks)
            out.append(Schedule(name, desc, chunks))

    full = exhaustive or C <= EXHAUSTIVE_UP_TO
    offsets = _spread(C, C if full else SAMPLED,
                      set(range(8)) | {(S + W - 1) % C, (S + W) % C, H_off % C, (S + 1) % C})
    lengths = _spread(C, C if full else SAMPLED, set(range(1, 9)) | set(range(C - 8, C)))
    for o in offsets:
        desc = f"chunks of {C}" if o == 0 else f"a first chunk of {o}, then chunks of {C}"
        add(f"offset{o}-c{C}", desc, _fill(H_off, (o,), C))
    for p in (S + W - 1, S + W):
        if 0 < p < H_off:
            add(f"fill{p}-c{C}", f"prefill {p} (chunks <= {C}), then chunks of {C}",
                _fill(H_off, _split(p, C), C))
    p = min(H - 1, -(-(S + W) // C) * C)
    if p > 0:
        add(f"prefill{p}-decode", f"prefill {p} in chunks of {C}, then decode",
            _fill(H, _split(p, C), 1))
    for c in sorted((c for c in lengths if c >= 1), reverse=True):
        add(f"uniform-c{c}", "decode (one token a step)" if c == 1 else f"chunks of {c}",
            _fill(min(H, S + W + 2 * c + 2), (), c))
    return out


def search_schedules(wl: Workload, schedules: list[Schedule]) -> list[Schedule]:
    """The few schedules the first phase of the minimum search uses (chunks of C at offset 0
    and at the offset whose last chunk ends at the horizon, both fills, prefill-then-decode,
    pure decode). Any size they pass is then re-run with every schedule."""
    H, S, W = wl.horizon, wl.sink, wl.window
    C = min(wl.chunk, H)
    H_off = min(H, S + W + C + 1)
    names = {f"offset0-c{C}", f"offset{H_off % C}-c{C}", f"fill{S + W - 1}-c{C}",
             f"fill{S + W}-c{C}", "uniform-c1"}
    return [sc for sc in schedules if sc.name in names or sc.name.endswith("-decode")]


# ---- the simulation ----------------------------------------------------------

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


def reference_outputs(wl: Workload, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      block: int = 256) -> np.ndarray:
    """float64 [horizon, heads, D]: the full-history sliding-window (+sink) oracle."""
    import torch

    from .reference import sdpa_reference

    H = q.shape[1]
    out = np.empty((H,) + q.shape[2:], dtype=np.float64)
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q, k, v))
    for a in range(0, H, block):
        b = min(H, a + block)
        vis = wl.visible(np.arange(a, b), np.arange(b))
        mask = torch.from_numpy(np.where(vis, 0.0, -np.inf))
        out[a:b] = sdpa_reference(qt[:, a:b], kt[:, :b], vt[:, :b], mask=mask)[0].numpy()
    return out


class _Cache:
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
        """Workload.visible(arange(s, s + c), slot_pos), faster: slot j is visible to the
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

    def __init__(self, wl: Workload, kernel: str | native.Kernel = "flash", *, seed: int = 0,
                 n_threads: int = 1, exhaustive: bool = False):
        self.wl = wl.validate()
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

    def _run_schedule(self, cache: _Cache, sched: Schedule) -> ScheduleResult:
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
        cache = _Cache(self, sim_size)
        results: list[ScheduleResult] = []
        for sched in schedules if custom else self.schedules:
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


# ---- policies ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Policy:
    """A sizing rule: slots as a function of (window, sink, max chunk, max context)."""

    name: str
    fn: Callable[[int, int, int, int | None], int] | None  # None: the simulated minimum
    source: str


def _cap(n: int, context: int | None) -> int:
    return n if context is None else min(n, context)


POLICIES: dict[str, Policy] = {}


def register_policy(name: str, fn: Callable[[int, int, int, int | None], int] | None,
                    source: str) -> Policy:
    POLICIES[name] = Policy(name, fn, source)
    return POLICIES[name]


register_policy("2x-window", lambda w, s, c, n: s + 2 * w,
                "ExecuTorch 1.5.1: a ring of twice the window (sinks pinned before it)")
register_policy("window+chunk", lambda w, s, c, n: w + c,
                "seed 003's ring rule, uncapped: window + max chunk")
register_policy("window+chunk-capped", lambda w, s, c, n: _cap(w + c, n),
                "seed 003's _get_ring_cache_size: min(context, window + max chunk)")
register_policy("sink+window+chunk", lambda w, s, c, n: s + w + c,
                "seed 003's attention-sink rule (uncapped): sink + window + max chunk")
register_policy("sink+window+chunk-capped", lambda w, s, c, n: _cap(s + w + c, n),
                "seed 003's sink rule capped: min(context, sink + window + max chunk)")
register_policy("closed-form", lambda w, s, c, n: closed_form_minimum(w, s, c, n),
                "this tool's rule: min(context, sink + window + max chunk - 1)")
register_policy("simulated-minimum", None, "the smallest size the simulation finds exact")


def policy_size(policy: Policy, wl: Workload, sim: Simulator | None = None) -> int:
    if policy.fn is None:
        if sim is None:
            raise ProbeError(f"policy {policy.name} needs the simulation")
        return sim.minimum()
    return int(policy.fn(wl.window, wl.sink, wl.chunk, wl.context))


# ---- memory ------------------------------------------------------------------

KV_DTYPES = {"f32": 4, "f16": 2, "bf16": 2, "i8": 1, "int8": 1}  # (i8 as everywhere else)


@dataclasses.dataclass(frozen=True)
class KVShape:
    """The model whose cache is being sized (memory only; the simulation uses a small
    head shape, since which keys a query sees does not depend on it)."""

    layers: int = 16
    kv_heads: int = 8
    head_dim: int = 64
    dtype: str = "f16"

    def validate(self) -> KVShape:
        if self.layers < 1 or self.kv_heads < 1 or self.head_dim < 1:
            raise ProbeError("--layers, --kv-heads and --head-dim must be >= 1")
        if self.dtype not in KV_DTYPES:
            raise ProbeError(f"--dtype must be one of f32, f16, bf16, i8 (or int8), "
                             f"got {self.dtype!r}")
        return self

    @property
    def bytes_per_slot(self) -> int:
        """K and V of one position in every layer (int8: plus a float32 scale and an int8
        zero point per token and head)."""
        int8 = self.dtype in ("i8", "int8")
        per_head = self.head_dim * KV_DTYPES[self.dtype] + (5 if int8 else 0)
        return 2 * self.layers * self.kv_heads * per_head

    def describe(self) -> str:
        return (f"{self.layers} layers x {self.kv_heads} kv heads x {self.head_dim} head dim, "
                f"{self.dtype}")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["bytes_per_slot"] = self.bytes_per_slot
        return d


def mib(nbytes: float) -> float:
    return nbytes / MIB


# ---- verdicts ----------------------------------------------------------------

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


def judge(size: int, res: SimResult, minimum: int, wl: Workload, shape: KVShape,
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
    workload: Workload
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


def resolve_policies(names: list[str] | None) -> list[Policy]:
    if not names:
        return list(POLICIES.values())
    out = []
    for n in names:
        if n not in POLICIES:
            raise ProbeError(f"unknown policy {n!r}; known: {', '.join(POLICIES)}")
        out.append(POLICIES[n])
    return out


def evaluate(wl: Workload, policies: list[str] | None = None, *, kernel: str = "flash",
             kv_shape: KVShape | None = None, seed: int = 0, exhaustive: bool = False,
             sim: Simulator | None = None) -> SizingReport:
    """Every policy's size, the simulated minimum, and a verdict for each."""
    t0 = time.perf_counter()
    shape = (kv_shape or KVShape()).validate()
    chosen = resolve_policies(policies)
    sim = sim or Simulator(wl, kernel, seed=seed, exhaustive=exhaustive)
    minimum = sim.minimum()
    results = []
    for pol in chosen:
        size = policy_size(pol, wl, sim)
        if size < 1:
            raise ProbeError(f"policy {pol.name} picks {size} slots")
        results.append(judge(size, sim.run(size), minimum, wl, shape, pol))
    return SizingReport(wl, sim.kernel.name, shape, minimum,
                        closed_form_minimum(wl.window, wl.sink, wl.chunk, wl.context), results,
                        wl.horizon, len(sim.schedules), sim.calls, time.perf_counter() - t0,
                        sim.sampled)


# ---- the suite (probe check --suite cache-sizing) -------------------------------------

SUITE_WORKLOADS = (Workload(16, 24), Workload(16, 24, sink=4), Workload(16, 24, sink=4, context=40))
# (window, sink, chunk, context) whose simulated minimum must equal the closed form
SUITE_GRID = tuple((w, s, c, n) for w in (1, 3, 8) for s in (0, 2) for c in (1, 4, 9)
                   for n in ((None, 12) if c == 9 else (None,)))


def expected_verdict(size: int, wl: Workload) -> str:
    """What the closed form predicts for a cache of `size` slots."""
    cf = closed_form_minimum(wl.window, wl.sink, wl.chunk, wl.context)
    if size < cf:
        return "undersized"
    if wl.context is not None and size > wl.context:
        return "exceeds-full-context"
    return "exact" if size == cf else "oversized"


def _suite_case(case: str, ok: bool, reason: str, err: float | None, t0: float) -> dict:
    return {"case": case, "status": "pass" if ok else "fail", "reason": reason,
            "max_abs_err": err, "seconds": time.perf_counter() - t0}


def _workload_cases(wl: Workload, kernel_name: str) -> list[dict]:
    cases = []
    t0 = time.perf_counter()
    sim = Simulator(wl, kernel_name)
    cf = closed_form_minimum(wl.window, wl.sink, wl.chunk, wl.context)
    m = sim.minimum()
    res = sim.run(m)
    cases.append(_suite_case(
        f"{wl.id}-minimum", m == cf and res.exact,
        f"simulated minimum {m} slots, closed form min(N, S + W + C - 1) = {cf}",
        res.max_err, t0))
    sizes: dict[int, list[str]] = {}
    for pol in POLICIES.values():
        sizes.setdefault(policy_size(pol, wl, sim), []).append(pol.name)
    sizes.setdefault(m - 1, []).append("minimum - 1")
    if wl.context is None:
        sizes.setdefault(wl.horizon, []).append("no eviction (a slot per simulated position)")
    else:
        sizes.setdefault(wl.context, []).append("full-context cache")
    shape = KVShape()
    for size in sorted(sizes):
        t0 = time.perf_counter()
        if size < 1:
            continue
        r = sim.run(size)
        got = judge(size, r, m, wl, shape, Policy("/".join(sizes[size]), None, "")).verdict
        want = expected_verdict(size, wl)
        ok = got == want and r.agree
        reason = f"{', '.join(sizes[size])}: {got}"
        if not r.exact:
            reason += (f" (wrong at position {r.position} under {r.schedule}; the slot map "
                       f"first misses a key at {r.missing_position})")
        if got != want:
            reason += f"; the closed form predicts {want}"
        if not r.agree:
            reason += "; outputs and slot map disagree"
        cases.append(_suite_case(f"{wl.id}-size{size}", ok, reason, r.max_err, t0))
    return cases


def _grid_case(kernel_name: str) -> dict:
    t0 = time.perf_counter()
    bad, err = [], 0.0
    for w, s, c, n in SUITE_GRID:
        wl = Workload(w, c, sink=s, context=n)
        sim = Simulator(wl, kernel_name)
        m = sim.minimum()
        cf = closed_form_minimum(w, s, c, n)
        below = sim.run(m - 1) if m > 1 else None
        err = max(err, sim.run(m).max_err)
        if m != cf or (below is not None and (below.exact or not below.agree)):
            bad.append(f"{wl.id}: simulated {m}, closed form {cf}")
    reason = (f"{len(SUITE_GRID)} (window, sink, chunk, context) workloads: simulated minimum "
              "== min(N, S + W + C - 1), and one slot less is wrong" if not bad
              else "; ".join(bad))
    return _suite_case("closed-form-grid", not bad, reason, err, t0)


def run_suite(kernel_name: str = "flash") -> list[dict]:
    """`probe check --suite cache-sizing`: ring and sink caches sized by simulation through
    `kernel_name`, the closed form over a grid, then seed 000's arithmetic (align_up, every
    kernel's per-thread scratch under the guarded allocator)."""
    from . import scratch_sizing

    cases: list[dict] = []
    for wl in SUITE_WORKLOADS:
        cases += _workload_cases(wl, kernel_name)
    cases.append(_grid_case(kernel_name))
    cases += scratch_sizing.run_suite()
    return cases
