"""What machine this is, and its measured roofline.

`describe()` reads the CPU model, ISA flags, core count and cache sizes from
/proc and /sys, and the compiler and flags from the native build. `roofline()`
returns the measured ceilings later commands report against: streaming read
bandwidth from DRAM (one thread and all threads), read bandwidth from an
L2-resident buffer (one thread), and peak F32 FMA throughput (one thread and
all threads). The micro-benchmarks live in native/src/microbench.c; their
results are cached as JSON in the build cache, keyed by CPU model and the
native module name, so only the first call (or `refresh=True`) measures.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from . import build, native
from .errors import ProbeError
from .host_load import LoadMonitor
from .sandbox import meminfo

MiB = 1 << 20
GB = 1e9  # bandwidths are GB/s and GFLOP/s in powers of ten

# Measurement plan. One repetition is timed as a whole (one parallel_for over
# the pool) after an untimed warm-up; the roofline keeps the best repetition of
# all rounds.
DRAM_MIN_BYTES = 256 * MiB  # at least this, and at least 4x the L3
DRAM_MAX_BYTES = 2048 * MiB
DRAM_PASSES = 1
DRAM_REPS = 8
L2_FALLBACK_BYTES = 128 * 1024  # half of L2 when sysfs knows it
L2_REPS = 20  # each repetition reads the buffer 64 MiB worth of times
FMA_ITERS_PER_THREAD = 1 << 20  # x chains x lanes x 2 flops: 201 MFLOP per thread (AVX2)
FMA_REPS = 10
CVT_ITERS_PER_THREAD = 1 << 18  # x 64 elements: 16.8 M conversions per thread
CVT_REPS = 8
# stored dtypes whose elements a kernel converts to F32 (the kernels' own conversion)
CONVERT_DTYPES = {"f16": native.F16, "bf16": native.BF16, "i8": native.I8}
ROUNDS = 2  # the whole set twice, best of both: a burst of other work spoils only one
# A shared host's contention (another guest on the same memory controller) shows
# in no CPU counter of ours: a ceiling this far below the best this CPU model
# ever measured here counts as "busy" too.
BELOW_BEST_FRACTION = 0.85
BEST_KEYS = ("read_bw_gbs_1t", "read_bw_gbs_all", "fma_gflops_1t", "fma_gflops_all")
# The compute ceilings are the build's (an AVX2 build's FMA loop is 8 lanes wide,
# an AVX-512 build's 16): compared only with rooflines of the same build flags.
# The bandwidth ones are the machine's: compared across builds.
BUILD_KEYS = ("fma_gflops_1t", "fma_gflops_all")

CONVERT_KEYS = tuple(f"cvt_{dt}_gelems_{n}" for dt in CONVERT_DTYPES for n in ("1t", "all"))
ROOFLINE_KEYS = ("read_bw_gbs_1t", "read_bw_gbs_all", "l2_read_bw_gbs",
                 "fma_gflops_1t", "fma_gflops_all", *CONVERT_KEYS)
SCHEMA = 3

X86_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16",
             "amx_int8")
# aarch64 /proc/cpuinfo names -> the names we report
ARM_FLAGS = {"asimd": "neon", "asimdhp": "fp16", "asimddp": "dotprod", "bf16": "bf16",
             "i8mm": "i8mm", "sve": "sve", "sve2": "sve2", "sme": "sme"}

Progress = Callable[[str], None]


# ---- machine description --------------------------------------------------

def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def isa_flags() -> dict[str, bool]:
    """The ISA extensions that matter for attention kernels: name -> present."""
    flags = _cpuinfo_flags()
    arch = platform.machine().lower()
    if arch in ("x86_64", "amd64", "i686", "i386"):
        return {f: f in flags for f in X86_FLAGS}
    if arch in ("aarch64", "arm64") or "asimd" in flags:
        out = {name: raw in flags for raw, name in ARM_FLAGS.items()}
        if arch in ("aarch64", "arm64"):
            out["neon"] = True  # mandatory in AArch64
        return out
    return {}


def _parse_size(text: str) -> int | None:
    text = text.strip().upper()
    mult = {"K": 1024, "M": MiB, "G": 1 << 30}
    try:
        if text and text[-1] in mult:
            return int(text[:-1]) * mult[text[-1]]
        return int(text)
    except ValueError:
        return None


def _count_cpu_list(text: str) -> int:
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n


def cache_sizes() -> dict[str, int | None]:
    """L1d / L1i / L2 / L3 sizes of cpu0 in bytes and how many logical cpus share each."""
    out: dict[str, int | None] = {
        "l1d_bytes": None, "l1i_bytes": None, "l2_bytes": None, "l3_bytes": None,
        "l2_shared_cpus": None, "l3_shared_cpus": None}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = _parse_size((idx / "size").read_text())
        except (OSError, ValueError):
            continue
        name = {(1, "Data"): "l1d", (1, "Instruction"): "l1i"}.get((level, kind))
        if name is None and level in (2, 3) and kind in ("Unified", "Data"):
            name = f"l{level}"
        if name is None:
            continue
        out[f"{name}_bytes"] = size
        if name in ("l2", "l3"):
            try:
                out[f"{name}_shared_cpus"] = _count_cpu_list(
                    (idx / "shared_cpu_list").read_text())
            except (OSError, ValueError):
                pass
    # glibc knows the sizes where sysfs does not (containers, other kernels)
    for key, conf in (("l1d_bytes", "SC_LEVEL1_DCACHE_SIZE"), ("l2_bytes", "SC_LEVEL2_CACHE_SIZE"),
                      ("l3_bytes", "SC_LEVEL3_CACHE_SIZE")):
        if out[key] is None:
            try:
                value = os.sysconf(conf)
            except (ValueError, OSError):
                continue
            out[key] = value if value > 0 else None
    return out


def _physical_cores() -> int | None:
    cores = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        try:
            pkg = (cpu / "topology" / "physical_package_id").read_text().strip()
            core = (cpu / "topology" / "core_id").read_text().strip()
        except OSError:
            continue
        cores.add((pkg, core))
    return len(cores) or None


def mem_available() -> int | None:
    """Bytes the kernel says can be allocated without swapping (None: unknown)."""
    return meminfo("MemAvailable")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe() -> dict:
    """The machine: CPU, ISA, cores, caches, memory, OS, compiler, library versions."""
    ffi, lib, res = native.native_lib()
    chains, lanes, fused = ffi.new("int32_t *"), ffi.new("int32_t *"), ffi.new("int32_t *")
    lib.sdpa_probe_mb_fma_config(chains, lanes, fused)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    libc = platform.libc_ver()
    return {
        "cpu_model": build.cpu_model(),
        "arch": platform.machine(),
        "isa": isa_flags(),
        "hypervisor": "hypervisor" in _cpuinfo_flags(),
        "logical_cores": os.cpu_count(),
        "physical_cores": _physical_cores(),
        "usable_cores": usable,
        "default_threads": int(lib.sdpa_probe_default_threads()),
        "caches": cache_sizes(),
        "memory_bytes": meminfo("MemTotal"),
        "os": {"system": platform.system(), "release": platform.release(),
               "libc": " ".join(p for p in libc if p) or None},
        "python": platform.python_version(),
        "compiler": {"cc": res.cc, "version": res.cc_version, "flags": list(res.flags),
                     "portable_fallback": res.fallback, "module": res.module_name},
        "fma_bench": {"chains": int(chains[0]), "lanes": int(lanes[0]),
                      "fused": bool(fused[0])},
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
                       if k in os.environ},
    }


# ---- measurement ----------------------------------------------------------

def plan() -> dict:
    """Buffer sizes, repetitions and thread counts the measurement will use."""
    _, lib, _ = native.native_lib()
    caches = cache_sizes()
    l3 = caches["l3_bytes"] or 0
    dram = max(DRAM_MIN_BYTES, 4 * l3)
    avail = mem_available()
    if avail:
        dram = min(dram, max(32 * MiB, avail // 4))
    dram = min(dram, DRAM_MAX_BYTES)
    l2 = caches["l2_bytes"]
    l2_buf = max(16 * 1024, l2 // 2) if l2 else L2_FALLBACK_BYTES
    return {
        "threads_all": int(lib.sdpa_probe_default_threads()),
        "dram_buffer_bytes": int(dram), "dram_passes": DRAM_PASSES, "dram_reps": DRAM_REPS,
        "l2_buffer_bytes": int(l2_buf), "l2_reps": L2_REPS,
        "fma_iters_per_thread": FMA_ITERS_PER_THREAD, "fma_reps": FMA_REPS,
        "cvt_iters_per_thread": CVT_ITERS_PER_THREAD, "cvt_reps": CVT_REPS,
        "rounds": ROUNDS,
    }


def _result(r, scale: float) -> dict:
    return {"best": r.best / scale, "median": r.median / scale, "worst": r.worst / scale,
            "reps": int(r.reps), "threads": int(r.n_threads), "work_per_rep": int(r.work),
            "best_seconds": r.best_seconds, "total_seconds": r.total_seconds}


def _keep_best(details: dict, name: str, item: dict) -> None:
    """Keep the round with the best repetition; remember every round's best."""
    prev = details.get(name)
    rounds = (prev["round_bests"] if prev else []) + [item["best"]]
    if prev is None or item["best"] > prev["best"]:
        details[name] = item
    details[name]["round_bests"] = rounds


def _check(status: int, what: str) -> None:
    if status != 0:
        reason = {2: "invalid arguments", 3: "out of memory"}.get(status, f"status {status}")
        raise ProbeError(f"micro-benchmark {what} failed: {reason}")


def measure(progress: Progress | None = None) -> dict:
    """Run the micro-benchmarks now (about a second) and return the roofline."""
    say = progress or (lambda _msg: None)
    ffi, lib, res = native.native_lib()
    p = plan()
    nt = p["threads_all"]
    t0 = time.perf_counter()
    monitor = LoadMonitor()
    details: dict[str, dict] = {}
    r = ffi.new("sdpa_probe_mb_result *")
    dram = ffi.new("sdpa_probe_mb_buffer **")
    l2 = ffi.new("sdpa_probe_mb_buffer **")

    say(f"allocating a {p['dram_buffer_bytes'] // MiB} MiB buffer")
    _check(lib.sdpa_probe_mb_buffer_new(p["dram_buffer_bytes"], nt, dram), "buffer")
    try:
        _check(lib.sdpa_probe_mb_buffer_new(p["l2_buffer_bytes"], 1, l2), "buffer")
        try:
            for rnd in range(1, p["rounds"] + 1):
                of = f" (round {rnd}/{p['rounds']})"
                for name, threads in (("read_bw_gbs_1t", 1), ("read_bw_gbs_all", nt)):
                    say(f"DRAM read bandwidth, {threads} thread{'s' if threads > 1 else ''}{of}")
                    _check(lib.sdpa_probe_mb_read(dram[0], threads, p["dram_passes"],
                                                  p["dram_reps"], r), name)
                    _keep_best(details, name,
                               _result(r, GB) | {"buffer_bytes": p["dram_buffer_bytes"]})
                say(f"L2 read bandwidth ({p['l2_buffer_bytes'] // 1024} KiB), 1 thread{of}")
                _check(lib.sdpa_probe_mb_read(l2[0], 1, 0, p["l2_reps"], r), "l2_read_bw_gbs")
                _keep_best(details, "l2_read_bw_gbs",
                           _result(r, GB) | {"buffer_bytes": p["l2_buffer_bytes"]})
                for name, threads in (("fma_gflops_1t", 1), ("fma_gflops_all", nt)):
                    say(f"F32 FMA throughput, {threads} thread{'s' if threads > 1 else ''}{of}")
                    _check(lib.sdpa_probe_mb_fma(threads, p["fma_iters_per_thread"],
                                                 p["fma_reps"], r), name)
                    _keep_best(details, name, _result(r, GB))
                for dt, code in CONVERT_DTYPES.items():
                    for threads, n in ((1, "1t"), (nt, "all")):
                        name = f"cvt_{dt}_gelems_{n}"
                        say(f"{dt} -> F32 conversion, {threads} thread"
                            f"{'s' if threads > 1 else ''}{of}")
                        _check(lib.sdpa_probe_mb_convert(code, threads, p["cvt_iters_per_thread"],
                                                         p["cvt_reps"], r), name)
                        _keep_best(details, name, _result(r, GB))
        finally:
            lib.sdpa_probe_mb_buffer_free(l2[0])
    finally:
        lib.sdpa_probe_mb_buffer_free(dram[0])

    seconds = time.perf_counter() - t0
    out: dict = {k: round(details[k]["best"], 2) for k in ROOFLINE_KEYS}
    out.update(
        threads_all=nt,
        # machine balance: flops per byte of DRAM traffic where compute and memory bounds meet
        ridge_flops_per_byte_1t=round(out["fma_gflops_1t"] / out["read_bw_gbs_1t"], 2),
        ridge_flops_per_byte_all=round(out["fma_gflops_all"] / out["read_bw_gbs_all"], 2),
        schema=SCHEMA,
        cpu_model=build.cpu_model(),
        module=res.module_name,
        build_flags=list(res.flags),
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        measure_seconds=round(seconds, 3),
        load=monitor.result(details),
        plan=p,
        details=details,
    )
    return out


# ---- the cache ------------------------------------------------------------

def best_ceilings(flags: list[str] | None = None) -> dict:
    """Per ceiling, the best value any cached roofline of this CPU model holds (the
    bandwidths from any build, the compute ceilings from builds with these flags:
    by default the built-in library's): what this machine reaches when its host is
    quiet."""
    if flags is None:
        flags = list(native.native_lib()[2].flags)
    best: dict = {}
    cpu = build.cpu_model()
    for f in roofline_dir().glob("roofline_*.json"):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict) or d.get("cpu_model") != cpu:
            continue
        same_build = d.get("build_flags") == flags
        for k in BEST_KEYS:
            if k in BUILD_KEYS and not same_build:
                continue
            v = d.get(k)
            if isinstance(v, (int, float)) and v > best.get(k, 0):
                best[k] = v
    return best


def compare_with_best(data: dict, best: dict) -> dict:
    """Mark a fresh measurement busy where a ceiling is under BELOW_BEST_FRACTION of
    the best this CPU model reached before (`load.below_best` says which)."""
    below = {}
    for k in BEST_KEYS:
        v, b = data.get(k), best.get(k)
        if isinstance(v, (int, float)) and isinstance(b, (int, float)) and b > 0 \
                and v < BELOW_BEST_FRACTION * b:
            below[k] = {"value": v, "best": b, "fraction": round(v / b, 3)}
    load = dict(data.get("load") or {})
    load["below_best"] = below
    load["busy"] = bool(load.get("busy")) or bool(below)
    data["load"] = load
    return data


def roofline_dir() -> Path:
    return build.cache_root() / "roofline"


def cache_path() -> Path:
    """Where this machine's roofline is cached: keyed by CPU model + native module."""
    _, _, res = native.native_lib()
    key = hashlib.sha256(f"{build.cpu_model()}\0{res.module_name}".encode()).hexdigest()[:16]
    return roofline_dir() / f"roofline_{key}.json"


def provisional_path(path: Path) -> Path:
    """Where a roofline measured busy is kept until a quiet one replaces it (named
    apart from roofline_*.json: best_ceilings does not read it)."""
    return path.with_name("busy_" + path.name)


def load_cached(path: Path | None = None) -> dict | None:
    """The cached roofline of this machine and build, or None; a figure measured busy
    is not the machine's (only its provisional file holds one)."""
    path = path or cache_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    _, _, res = native.native_lib()
    if (not isinstance(data, dict) or data.get("schema") != SCHEMA
            or data.get("cpu_model") != build.cpu_model() or data.get("module") != res.module_name
            or not all(isinstance(data.get(k), (int, float)) for k in ROOFLINE_KEYS)):
        return None
    if (data.get("load") or {}).get("busy") and not path.name.startswith("busy_"):
        return None
    return data


def _store(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        # an unwritable cache only costs a re-measurement next time
        tmp.unlink(missing_ok=True)


def roofline(refresh: bool = False, progress: Progress | None = None) -> dict:
    """This machine's roofline: cached if measured before for this build, else measured now.

    Keys: read_bw_gbs_1t, read_bw_gbs_all, l2_read_bw_gbs (GB/s), fma_gflops_1t,
    fma_gflops_all (GFLOP/s), cvt_{f16,bf16,i8}_gelems_{1t,all} (G elements/s
    converted to F32), ridge points, measurement details; "cached" says
    whether it came from the cache and "cache_path" where it is kept.

    A measurement taken while the machine is busy (load.busy) is not cached as the
    machine's figure: the last quiet one is returned instead, with "busy_measurement"
    saying why the new one was dropped; with none, the busy one is returned and kept
    as provisional ("provisional": true), and a later call measures again once the
    machine is quiet.
    """
    path = cache_path()
    if not refresh:
        data = load_cached(path)
        if data is not None:
            return data | {"cached": True, "cache_path": str(path)}
    with build.file_lock(path.with_suffix(".lock")):
        if not refresh:  # another process may have measured while we waited
            data = load_cached(path)
            if data is not None:
                return data | {"cached": True, "cache_path": str(path)}
            interim = load_cached(provisional_path(path))
            if interim is not None and LoadMonitor.now()["busy"]:  # (still busy: no use)
                return interim | {"cached": True, "cache_path": str(path), "provisional": True}
        data = measure(progress)
        data = compare_with_best(data, best_ceilings(data["build_flags"]))
        if not data["load"]["busy"]:
            _store(path, data)
            provisional_path(path).unlink(missing_ok=True)
            return data | {"cached": False, "cache_path": str(path)}
        quiet = load_cached(path)  # (with refresh: the machine's figure is still there)
        if quiet is not None:
            return quiet | {"cached": True, "cache_path": str(path),
                            "busy_measurement": data["load"]}
        _store(provisional_path(path), data)
    return data | {"cached": False, "cache_path": str(path), "provisional": True}
