"""The bench run: on each shape, the kernels, their peers and the same-round baselines
measured in interleaved rounds (timing.measure), then one JSON document of results
and notes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from .. import TOOL, machine, native
from ..backends import REGISTERED, Unsupported, executorch_version, is_kernel_file, parse
from ..caller_state import Guard
from ..errors import ProbeError, SdpaInvalid, SdpaUnsupported
from ..id_filter import compile_filter, words
from ..limits import check_threads
from ..party import NativeParty, Party
from ..trial_call import LEFT_CHANGED, trial_call
from . import host, timing
from .allocs import count_allocs, thread_start_notes
from .baselines import (
    DRAM_READ,
    F32_REFERENCE,
    FMA_PEAK,
    SLOW_CORE,
    FmaParty,
    ReadParty,
    f32_reference,
)
from .figures import (
    core_lengths,
    core_limit,
    core_party_name,
    roofline_figures,
    same_run_fma,
    same_run_read,
)
from .goals import measured_goals
from .inputs import cold_sets, make_inputs, rotation_note
from .kernels import kernels_for, resolve_kernels, takes
from .parties import make_party
from .shapes import DTYPES, Shape, select_shapes

SCHEMA = 1
MAX_MIN_TIME = 60.0  # seconds a party's batch of calls may take, each round
TRIAL_CRASH = "crashed in a trial call"  # first_call's reason when the child died
TRIAL_FAILED = "failed a trial call"  # ... when the call returned, its process changed

Progress = Callable[[str], None]


@dataclasses.dataclass
class _Session:
    """A run's options and what it gathers from shape to shape."""

    threads: int
    cold: bool
    rounds: int
    min_time: float
    say: Progress
    chosen: list[native.Kernel] | None  # --kernel, resolved (None: each dtype's default)
    native_peers: dict[str, native.Kernel]  # the peers that are native kernels, by name
    peers: list[str]
    roof: dict | None
    notes: list[str]
    llc: int | None = None
    l2: int | None = None
    avail: int | None = None
    crashed: list[str] = dataclasses.field(default_factory=list)  # "shape: kernel" (exit 1)
    failed: list[str] = dataclasses.field(default_factory=list)   # "shape: kernel" (exit 1)
    left_changed: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    fma: FmaParty | None = None
    read: ReadParty | None = None


def first_call(party: NativeParty, left: dict[str, list[str]]) -> str | None:
    """Run a party's kernel once: None if it ran, else why it cannot be timed. A user
    kernel's first call is tried in a child process first: a crash there costs the child.
    What the call left changed in its caller is put back and said in `left`."""
    if party.kernel.user and party.kernel.build is not None:
        died = trial_call(party.kernel.build, dataclasses.asdict(party.shape), party.threads)
        if died and died.startswith(LEFT_CHANGED):  # (it returned: not a crash)
            return f"{TRIAL_FAILED} ({died})"
        if died:
            return f"{TRIAL_CRASH} ({died})"
    guard = Guard(left)  # (read here, after the kernel's build)
    try:
        party.run(1)
    except SdpaUnsupported:
        return "returned SDPA_UNSUPPORTED"
    except SdpaInvalid as exc:
        return "returned " + str(exc).split(": ", 1)[-1]
    finally:
        guard.put_back(party.name)
    return None


def run_bench(shape: str, kernels: Sequence[str] = (), peers: Sequence[str] = ("torch",),
              dtypes: Sequence[str] = (), threads: int = 0, cold: bool = False,
              rounds: int = 7, min_time: float = 0.05, progress: Progress | None = None,
              allocs: bool = True, goals: bool = False,
              select: Sequence[str] = ()) -> dict:
    """`probe bench` from its options: the shapes a spec selects (presets, groups, custom
    names; only `dtypes` if given) checked against the kernels, then run(). goals: the
    document also holds the project's own speed goals this run measured ("targets").
    select: -k expressions over the shapes' names (id_filter)."""
    check_threads(threads)
    if not (math.isfinite(min_time) and min_time <= MAX_MIN_TIME):
        raise ProbeError(f"--min-time must be at most {MAX_MIN_TIME:g} seconds (a batch of "
                         f"calls a round), got {min_time:g}")
    for d in dtypes:
        if d not in DTYPES:
            raise ProbeError(f"unknown dtype {d!r}; known: {', '.join(DTYPES)}")
    shapes = filter_shapes(select_shapes(shape, list(dtypes) or None), select)
    _check_kernels_take(kernels, shapes)
    doc = run(shapes, kernels=list(kernels) or None, peers=peers, threads=threads, cold=cold,
              rounds=rounds, min_time=min_time, progress=progress, allocs=allocs)
    if goals:
        doc["targets"] = measured_goals(doc)
    return doc


def filter_shapes(shapes: list[Shape], select: Sequence[str]) -> list[Shape]:
    """The shapes whose names match the -k expressions; none is a usage error (with a
    word for the older -k KERNEL)."""
    match = compile_filter(list(select))
    if match is None:
        return shapes
    kept = [s for s in shapes if match(s.name)]
    if not kept:
        said = [w for e in select for w in words(e)]
        kernel = [w for w in said if w in native.builtin_kernels() or is_kernel_file(w)]
        hint = (f"; -k selects shapes by name, a kernel is --kernel {','.join(kernel)}"
                if kernel else "")
        raise ProbeError(f"no shape matches -k {' or '.join(map(repr, select))}{hint}")
    return kept


def _check_kernels_take(kernels: Sequence[str], shapes: list[Shape]) -> None:
    """Registered kernels say which dtypes they take: a run that could time nothing is a
    usage error, not an empty table (a kernel file answers by its status instead)."""
    if not kernels or any(is_kernel_file(k) for k in kernels):  # (a file: by its status)
        return
    ks = resolve_kernels(kernels)
    if not any(kernels_for(s, ks) for s in shapes):
        taken = "; ".join(
            f"{k.name} takes " + ", ".join(d for d in DTYPES if takes(
                k, dataclasses.replace(shapes[0], dtype=d))) for k in ks)
        asked = ", ".join(sorted({s.dtype for s in shapes}))
        raise ProbeError(f"no shape asked for ({asked}) is one the kernels take: {taken}")


def run(shapes: Sequence[Shape], kernels: Sequence[str] | None = None,
        peers: Sequence[str] = ("torch",), threads: int | None = None, cold: bool = False,
        rounds: int = 7, min_time: float = 0.05, progress: Progress | None = None,
        roofline: dict | None | bool = True, allocs: bool = False) -> dict:
    """Benchmark every (kernel, shape) against the peers; returns the JSON document.
    Kernels and peers other than torch / executorch are registered kernel names or
    .c / .cpp / .so files implementing sdpa_forward (a native peer is timed like a kernel).
    allocs: also count each party's heap allocations per call (alloc_count, a worker)."""
    import torch  # deferred: torch takes seconds to import

    chosen, native_peers, peers, spec_of, notes = _resolve(kernels, peers)
    if threads is None or threads <= 0:
        threads = int(native.native_lib()[1].sdpa_probe_default_threads())
    roof = host.roofline() if roofline is True else (roofline or None)
    s = _Session(threads, cold, rounds, min_time, progress or (lambda _m: None), chosen,
                 native_peers, peers, roof, notes + _roofline_notes(roof),
                 llc=host.llc_bytes(), l2=host.l2_bytes_for(threads),
                 avail=machine.mem_available())
    monitor = machine.LoadMonitor()  # others' CPU use and the hypervisor's steal, for a note
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    results: list[dict] = []
    s.fma = FmaParty(s.threads)
    try:
        for shape in shapes:
            results += _bench_shape(s, shape)
    finally:
        torch.set_num_threads(saved_threads)
        if s.read is not None:
            s.read.close()
    load = monitor.result()
    s.notes.extend(f"{name} left its caller changed ({'; '.join(what)}): put back after each "
                   "of its batches, so that the parties after it ran as they should (probe "
                   "check fails such a kernel)" for name, what in s.left_changed.items())
    if allocs and results:
        s.say("counting heap allocations per call")
        why = count_allocs(results, spec_of, s.threads)
        if why:
            s.notes.append(why)
        s.notes.extend(thread_start_notes(results))
    s.notes.extend(_end_notes(results, load))
    return _document(s, results, load, torch.__version__)


def _resolve(kernels: Sequence[str] | None, peers: Sequence[str]
             ) -> tuple[list[native.Kernel] | None, dict[str, native.Kernel], list[str],
                        dict[str, str], list[str]]:
    """The kernels asked for, resolved (None: each dtype's default); the peers that are
    native kernels, by name; every peer's name; what a worker process loads each native
    kernel by (a user kernel's name is not its file); notes (a peer not installed)."""
    kernels = list(kernels or [])
    registered = [p for p in peers if parse(p, what="peer").kind == "registered"]
    native_specs = [p for p in peers if p not in registered]
    resolved = resolve_kernels(kernels + native_specs)
    chosen, native_peers = resolved[:len(kernels)] or None, resolved[len(kernels):]
    spec_of = {k.name: spec for k, spec in zip(resolved, kernels + native_specs, strict=True)}
    names = registered + [k.name for k in native_peers]
    notes: list[str] = []
    for p in registered:
        why = parse(p).why_unavailable()
        if why:
            notes.append(f"{why}: skipped")
            names.remove(p)
    return chosen, {k.name: k for k in native_peers}, names, spec_of, notes


def _roofline_notes(roof: dict | None) -> list[str]:
    if roof is None:
        return ["no roofline (probe info): dram_pct and roofline_pct are null"]
    if (roof.get("load") or {}).get("busy"):
        return ["the roofline was measured while the machine was busy, so the % figures "
                "are against low ceilings; probe info --refresh re-measures"]
    return []


def _bench_shape(s: _Session, shape: Shape) -> list[dict]:
    """One shape's results: a dict per kernel that took it, its peers' figures inside."""
    ks = kernels_for(shape, s.chosen)
    if not ks:
        s.notes.append(f"{shape.name}: no selected kernel takes {shape.dtype}")
        return []
    n_sets = cold_sets(shape, s.llc, s.avail) if s.cold else 1
    s.say(f"{shape.name}: {', '.join([k.name for k in ks] + s.peers)}"
          + (f" ({n_sets} input sets, {n_sets * shape.bytes / 2**20:,.0f} MiB)"
             if s.cold else ""))
    short = rotation_note(shape, n_sets, s.llc) if s.cold else None
    if short:
        s.notes.append(short)
    try:
        sets = make_inputs(shape, n_sets)
    except MemoryError as exc:
        raise ProbeError(f"shape {shape.name} does not fit in memory: {exc}") from None
    parties, ks = _kernel_parties(s, shape, ks, sets)
    if not ks:
        return []
    # F16 / BF16 / int8: `flash` on the same shape in F32, timed in the same rounds, so
    # "how much faster than F32" is a side-by-side ratio like the peers' ones
    # F32 inputs (the reference; torch's for int8) rotate through as many sets as
    # their own bytes need
    f32_sets = (cold_sets(dataclasses.replace(shape, dtype="f32"), s.llc, s.avail)
                if s.cold else 1)
    ref = f32_reference(shape, s.threads, f32_sets)
    if ref is not None:
        parties.append(ref)
    # decode: each kernel also at two L2-resident context lengths, for its limit
    lengths = core_lengths(shape, s.l2)
    parties += _core_parties(s, shape, ks, lengths)
    if shape.kind == "decode":  # memory-bound: the bandwidth of these very rounds
        if s.read is None:
            s.read = ReadParty(s.threads, host.read_buffer_bytes())
        parties.append(s.read)
    parties.append(s.fma)  # and the core's FMA rate of these very rounds
    names = [k.name for k in ks]
    peer_parties, peer_skips = _peer_parties(s, shape, names, sets, f32_sets)
    samples = timing.measure(parties + peer_parties, rounds=s.rounds, min_time=s.min_time,
                             left=s.left_changed)
    stats = {name: timing.summarize(x) for name, x in samples.items()}
    peer_stats = _peer_stats(s, shape, stats, ref)
    return [_result(s, shape, stats, n, n_sets, lengths, peer_stats, peer_skips)
            for n in names]


def _tried(s: _Session, shape: Shape, party: NativeParty) -> str | None:
    """first_call, a crash in it recorded for the command's exit status."""
    why = first_call(party, s.left_changed)
    if why and why.startswith(TRIAL_CRASH):
        s.crashed.append(f"{shape.name}: {party.kernel.name}")
    elif why and why.startswith(TRIAL_FAILED):
        s.failed.append(f"{shape.name}: {party.kernel.name}")
    return why


def _kernel_parties(s: _Session, shape: Shape, ks: list[native.Kernel], sets: list
                    ) -> tuple[list[Party], list[native.Kernel]]:
    """The kernels' parties, and the kernels that took the shape (a user kernel says by
    its status whether it does: one that does not is left out with a note)."""
    parties: list[Party] = []
    for k in ks:
        party = make_party(k, shape, sets, s.threads)
        why = _tried(s, shape, party)
        if why:
            s.notes.append(f"{shape.name}: {k.name} {why}: skipped")
        else:
            parties.append(party)
    return parties, [k for k in ks if any(p.name == k.name for p in parties)]


def _core_parties(s: _Session, shape: Shape, ks: list[native.Kernel],
                  lengths: tuple[int, int] | None) -> list[Party]:
    """Each kernel on the shape cut to the L2-resident context lengths."""
    parties: list[Party] = []
    for k in ks:
        for kv in lengths or ():
            short = dataclasses.replace(shape, kv_len=kv)
            party = make_party(k, short, make_inputs(short, 1), s.threads)
            party.name = core_party_name(k.name, kv)
            parties.append(party)
    return parties


def _peer_parties(s: _Session, shape: Shape, names: list[str], sets: list, f32_sets: int
                  ) -> tuple[list[Party], dict[str, str]]:
    """The peers' parties on a shape, and why each peer left out was (peer -> reason)."""
    parties: list[Party] = []
    skips: dict[str, str] = {}
    for p in s.peers:
        kernel = s.native_peers.get(p)
        if kernel is not None:
            why = ("it is a kernel of this run" if p in names
                   else None if takes(kernel, shape) else f"no {shape.dtype} path")
        else:
            why = None
        if why:
            skips[p] = why
            continue
        # a peer that reads an int8 shape as float32 rotates through as many sets as F32 needs
        as_f32 = kernel is None and getattr(REGISTERED.get(p), "TIMES_INT8_AS_F32", False)
        try:
            party = make_party(kernel or p, shape,
                               sets[:f32_sets] if as_f32 and shape.dtype == "i8" else sets,
                               s.threads)
        except Unsupported as exc:
            skips[p] = str(exc)
            continue
        why = _tried(s, shape, party) if kernel is not None else None
        if why:
            skips[p] = why
        else:
            parties.append(party)
    return parties, skips


def _peer_stats(s: _Session, shape: Shape, stats: dict, ref: Party | None) -> dict[str, dict]:
    """Each timed peer's statistics and figures (the F32 reference's on its own shape)."""
    out = {p: stats[p] | roofline_figures(shape, stats[p], s.roof, s.threads)
           for p in s.peers if p in stats}
    if ref is not None:
        out[F32_REFERENCE] = (stats[F32_REFERENCE]
                              | roofline_figures(ref.shape, stats[F32_REFERENCE], s.roof,
                                                 s.threads))
    return out


def _result(s: _Session, shape: Shape, stats: dict, name: str, n_sets: int,
            lengths: tuple[int, int] | None, peer_stats: dict, peer_skips: dict) -> dict:
    """One kernel's result on a shape: its figures, its limit, its ratios to the peers."""
    st = stats[name]
    same_bw = (s.read.nbytes / (stats[DRAM_READ]["median_us"] * 1e-6) / 1e9
               if DRAM_READ in stats else None)
    same_fma = s.fma.flops / (stats[FMA_PEAK]["median_us"] * 1e-6) / 1e9
    core = {"core_us": None, "core_kv": None, "limit": None}
    if lengths:
        core_us, limit = core_limit(st["median_us"], shape.kv_len, lengths,
                                    *(stats[core_party_name(name, kv)]["median_us"]
                                      for kv in lengths))
        core = {"core_us": round(core_us, 2), "core_kv": list(lengths), "limit": limit}
    return {
        "kernel": name, "shape": shape.name, **shape.as_dict(),
        "median_us": round(st["median_us"], 2), "iqr_us": round(st["iqr_us"], 2),
        "noisy": timing.is_noisy(st),
        "min_us": round(st["min_us"], 2), "samples": st["samples"],
        "bytes": shape.bytes, "kv_bytes": shape.kv_bytes, "flops": shape.flops,
        "input_sets": n_sets,  # cold: the copies rotated through (warm: 1)
        **roofline_figures(shape, st, s.roof, s.threads),
        **same_run_read(shape, st, same_bw),
        **same_run_fma(same_fma, s.roof, s.threads),
        **core,
        "ratio": {p: round(ps["median_us"] / st["median_us"], 3)
                  for p, ps in peer_stats.items()},
        "allocs": None,  # heap allocations per call (filled in at the end)
        "peers": {p: {k: (round(v, 2) if isinstance(v, float) else v)
                      for k, v in ps.items()} | {"noisy": timing.is_noisy(ps), "allocs": None}
                  for p, ps in peer_stats.items()},
        "peer_skipped": peer_skips,
    }


def _end_notes(results: list[dict], load: dict) -> list[str]:
    """What the figures of the whole run are to be read with: a busy machine, a slowed
    core, noisy medians."""
    notes = []
    if load["busy"]:
        notes.append(f"other processes or the hypervisor took "
                     f"{load['other_cpu_fraction'] + load['steal_fraction']:.0%} of the CPUs "
                     "during these rounds: times may be high and ratios skewed")
    slow = sorted({r["shape"] for r in results if r["fma_pct_same_run"] is not None
                   and r["fma_pct_same_run"] < 100 * SLOW_CORE})
    if slow:
        low = min(r["fma_pct_same_run"] for r in results if r["shape"] in slow)
        notes.append(f"the core ran slower than when probe info measured it (F32 FMA in the same "
                     f"rounds down to {low:.0f}% of its peak): times bound by the core are high, "
                     f"and their ratios to memory-bound parties low, for {', '.join(slow)}")
    noisy = [f"{r['shape']} {r['kernel']}" for r in results if r["noisy"]]
    noisy += sorted({f"{r['shape']} {p}" for r in results for p, ps in r["peers"].items()
                     if ps["noisy"]})
    if noisy:
        notes.append(f"noisy (IQR over {timing.NOISY_IQR:.0%} of the median; more --rounds or a "
                     f"quieter machine): {', '.join(noisy)}")
    return notes


def _document(s: _Session, results: list[dict], load: dict, torch_version: str) -> dict:
    roof = s.roof
    return {
        "schema": SCHEMA,
        "tool": dict(TOOL),
        "mode": "cold" if s.cold else "warm",
        "threads": s.threads,
        "rounds": s.rounds,
        "min_batch_seconds": s.min_time,
        "machine": host.machine_summary(native.native_lib()[2]),
        "roofline": None if roof is None else {
            k: roof.get(k) for k in ("read_bw_gbs_1t", "read_bw_gbs_all", "l2_read_bw_gbs",
                                     "fma_gflops_1t", "fma_gflops_all",
                                     *(k for k in roof if k.startswith("cvt_")),
                                     "measured_at", "load")},
        "versions": {"torch": torch_version, "executorch": executorch_version(),
                     "numpy": np.__version__},
        "peers": s.peers,
        "load": load,
        "notes": s.notes,
        "crashed": s.crashed,
        "failed": s.failed,
        # kernels asked for (--kernel) that no shape timed: each declined or crashed on all
        "untimed": [k.name for k in s.chosen or ()
                    if not any(r["kernel"] == k.name for r in results)],
        "results": results,
    }
