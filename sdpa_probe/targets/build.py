"""The native worker (native/worker/sdpa_probe_worker.c) built with one kernel for a
target's CPU: a static executable, so that it runs under qemu-aarch64 and on a device
with nothing installed. Builds live in the build cache (build_cache.py), keyed by the
target's architecture and flags, the compiler and its version, and every source's
bytes: a change to any builds a new worker beside the old one."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import __version__, compiler_guard
from ..build import CXX_STD, CXX_SUFFIXES, INCLUDE_DIR, NATIVE_DIR, SRC_DIR
from ..build_cache import (
    build_root,
    clean_stale_builds,
    damaged,
    file_lock,
    find_intact,
    seal,
    usable_cache_root,
)
from ..errors import BuildError, ProbeError
from .spec import CROSS_CC, Target

WORKER_SOURCE = NATIVE_DIR / "worker" / "sdpa_probe_worker.c"
# the build's own flags (build.BASE_FLAGS less -march=native: the target is not this CPU)
FLAGS = ["-std=c11", "-O3", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math",
         "-pthread", "-Wall"]
# the instruction sets: NEON everywhere on aarch64 (ARMv8.0: a Cortex-A53 or A72 board runs
# it); SVE at any vector length for an -sveN target
ARCH_FLAGS = {"aarch64": ["-march=armv8-a"], "aarch64-sve": ["-march=armv8.2-a+fp16+sve"],
              "x86_64": ["-march=x86-64-v2"]}
BUILD_TIMEOUT = 600


@dataclasses.dataclass(frozen=True)
class WorkerBuild:
    path: Path
    arch: str
    cc: str
    flags: tuple[str, ...]


def arch_of(target: Target, remote_machine: str = "") -> str:
    """The ARCH_FLAGS entry a target's worker is built for (an ssh device's from its
    `uname -m`)."""
    if target.kind == "qemu":
        return "aarch64-sve" if target.sve_bits else "aarch64"
    if remote_machine in ("aarch64", "arm64"):
        return "aarch64"
    if remote_machine in ("x86_64", "amd64"):
        return "x86_64"
    raise ProbeError(f"target {target.name}: a {remote_machine or 'unknown'} device; the "
                     "native worker is built for aarch64 and x86_64 devices")


def compilers(arch: str) -> tuple[str, str]:
    """(C compiler, C++ compiler) for an architecture."""
    if arch.startswith("aarch64"):
        return CROSS_CC, CROSS_CC.replace("-gcc", "-g++")
    return "gcc", "g++"


def _digest(parts: list[str], files: list[Path]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{cc} cannot be run: {exc}") from None
    return (out.stdout.splitlines() or [""])[0]


def _sources(kernel: Path | None) -> list[Path]:
    """The worker and the kernel: a user's file, or our whole kernel set (None)."""
    if kernel is None:
        return [WORKER_SOURCE, *sorted(SRC_DIR.glob("*.c"))]
    return [WORKER_SOURCE, SRC_DIR / "caller_state.c", kernel]


def build_worker(arch: str, kernel: Path | None = None) -> WorkerBuild:
    """The worker for `arch` with `kernel` (a .c / .cpp file; None: our kernel set,
    each called by its name), from the cache or built now."""
    if kernel is not None:
        kernel = Path(kernel).resolve()
        if kernel.suffix == ".so":
            raise ProbeError(f"{kernel.name}: a prebuilt library runs on this CPU only; give "
                             "its source (.c, .cpp) to check it on another target")
    cc, cxx = compilers(arch)
    for tool in (cc,):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} not found (apt-get install gcc-aarch64-linux-gnu "
                             "libc6-dev-arm64-cross)" if tool == CROSS_CC else f"{tool} not found")
    flags = [*FLAGS, *ARCH_FLAGS[arch]]
    sources = _sources(kernel)
    headers = sorted(INCLUDE_DIR.glob("*.h")) + sorted(SRC_DIR.glob("*.h"))
    key = _digest([arch, cc, _version(cc), " ".join(flags), __version__,
                   "builtin" if kernel is None else "file"], sources + headers)
    name = f"_worker_{arch}_{'set' if kernel is None else kernel.stem}_{key}"
    root = usable_cache_root()
    found = find_intact(name, root)
    if found is not None:
        return WorkerBuild(found, arch, cc, tuple(flags))
    broot = build_root(root)
    dest = broot / name
    with file_lock(broot / (name + ".lock")):
        if damaged(dest) is None:  # (built meanwhile by another process)
            return WorkerBuild(dest, arch, cc, tuple(flags))
        clean_stale_builds(broot, name)
        with tempfile.TemporaryDirectory(prefix=f"sdpa_probe_build_{name}_", dir=broot) as tmp:
            _compile(sources, kernel, cc, cxx, flags, Path(tmp), dest)
        seal(dest)
    return WorkerBuild(dest, arch, cc, tuple(flags))


def _compile(sources: list[Path], kernel: Path | None, cc: str, cxx: str, flags: list[str],
             tmp: Path, dest: Path) -> None:
    """Each source to an object (one compiler per CPU), then a static link."""
    incs = [f"-I{INCLUDE_DIR}", f"-I{SRC_DIR}"] + ([f"-I{kernel.parent}"] if kernel else [])
    defs = ["-DSDPA_WORKER_BUILTIN"] if kernel is None else []
    cxx_kernel = kernel is not None and kernel.suffix in CXX_SUFFIXES
    if cxx_kernel and shutil.which(cxx) is None:
        raise BuildError(f"{cxx} not found for the C++ kernel {kernel.name}")

    def compile_one(job: tuple[int, Path]) -> tuple[Path, subprocess.CompletedProcess]:
        i, src = job
        obj = tmp / f"{i}_{src.stem}.o"
        if src.suffix in CXX_SUFFIXES:
            cmd = [cxx, *[CXX_STD if f == "-std=c11" else f for f in flags]]
        else:
            cmd = [cc, *flags]
        return obj, compiler_guard.run([*cmd, *defs, *incs, "-c", str(src), "-o", str(obj)],
                                       timeout=BUILD_TIMEOUT)

    jobs = sorted(enumerate(sources), key=lambda j: -j[1].stat().st_size)
    workers = max(1, min(len(jobs), len(os.sched_getaffinity(0))))
    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(compile_one, jobs))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"building the worker with {cc} failed: {exc}") from None
    for (_, src), (_, proc) in zip(jobs, done, strict=True):
        if proc.returncode != 0:
            raise BuildError(f"building {src.name} with {cc} failed: {_first_error(proc.stderr)}")
    out = tmp / dest.name
    link = [cxx if cxx_kernel else cc, "-static", "-pthread", *[str(o) for o, _ in done],
            "-o", str(out), "-lm"]
    proc = compiler_guard.run(link, timeout=BUILD_TIMEOUT)
    if proc.returncode != 0 or not out.is_file():
        raise BuildError(f"linking the worker with {cc} failed: {_first_error(proc.stderr)}")
    os.replace(out, dest)


def _first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
    return (lines or [ln.strip() for ln in text.splitlines() if ln.strip()] or ["?"])[0][:300]
