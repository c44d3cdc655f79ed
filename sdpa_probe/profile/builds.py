"""Native builds behind `probe profile`: the default library, the same library built with
other compiler flags (`--ab fused@-O3,fused@-O1`), and a user kernel (`--kernel PATH`).

Every build is its own cffi module with its own ffi / lib (and so its own allocator
counters and thread pool); a model and its states live in one build. A user kernel
is a separate module too: its sdpa_forward reaches the decode step as a raw
function address (sdpa_probe_decode_set_forward).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
from pathlib import Path

from .. import __version__, build, native

DEFAULT = "default"


@dataclasses.dataclass(frozen=True)
class Build:
    """One loaded native library: the default (cflags None) or one built with cflags."""

    cflags: str | None
    ffi: object
    lib: object
    result: build.BuildResult

    @property
    def label(self) -> str:
        return DEFAULT if self.cflags is None else self.cflags

    def meta(self) -> dict:
        r = self.result
        return {"label": self.label, "extra_cflags": self.cflags, "module": r.module_name,
                "cc": r.cc, "cc_version": r.cc_version, "flags": list(r.flags),
                "portable_fallback": r.fallback}


def _compiler() -> str | None:
    return native._build_opts.get("cc")  # a compiler set for this process (probe build --cc)


def _compile(cflags: str):
    """Build (or find in the cache) the native library with cflags; (ffi, lib, result).
    The cflags come after the base flags, so -O1 overrides the base -O3."""
    res = build.build(native.lib_spec(), cflags=cflags, cc=_compiler())
    mod = build.load(res)
    return mod.ffi, mod.lib, res


def get(cflags: str | None = None) -> Build:
    """The default library (None: native.native_lib(), whatever it is configured to be)
    or the library built with cflags."""
    if cflags is None:
        return Build(None, *native.native_lib())
    return _with_flags(cflags)


@functools.cache
def _with_flags(cflags: str) -> Build:
    return Build(cflags, *_compile(cflags))


@dataclasses.dataclass(frozen=True)
class UserKernel:
    """A user's sdpa_forward (native/include/sdpa_probe.h) from a .c, .cpp or .so file."""

    path: Path
    kernel: native.Kernel
    result: build.BuildResult
    sha256: str
    cflags: str | None

    @property
    def address(self) -> int:
        ffi = self.kernel.ffi
        return int(ffi.cast("uintptr_t", ffi.addressof(self.kernel.lib, "sdpa_forward")))

    @property
    def name(self) -> str:
        return self.path.name

    def meta(self) -> dict:
        r = self.result
        return {"path": str(self.path), "sha256": self.sha256, "module": r.module_name,
                "cc": r.cc, "cc_version": r.cc_version, "flags": list(r.flags),
                "extra_cflags": self.cflags,
                # a .so is linked through a shim module: flags are the shim's, not the .so's
                "prebuilt": self.path.suffix == ".so"}


def user_kernel(path: str, cflags: str | None = None) -> UserKernel:
    """Compile a .c / .cpp kernel (with cflags after the base flags) or link a shim to a .so."""
    p = Path(path).expanduser().resolve()
    spec = native.user_kernel_spec(p)  # checks the file and its suffix
    # a prebuilt .so keeps its own flags
    flags = cflags if p.suffix in native.SOURCE_SUFFIXES else None
    res = build.build(spec, cflags=flags, cc=_compiler())
    mod = native.load_user_module(res, p)  # (a file without sdpa_forward does not load)
    info = native.KernelInfo(p.name, f"user kernel {p}",
                             ("f32", "f16", "bf16", "i8"), (), -1)
    return UserKernel(p, native.Kernel(mod.ffi, mod.lib, info, user=True, build=res), res,
                      hashlib.sha256(p.read_bytes()).hexdigest()[:16], flags)


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "neon", "asimd")


def _simd() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in SIMD_FLAGS if f in have]
    except OSError:
        pass
    return []


def machine_meta(threads: int) -> dict:
    """What ran the profile: CPU, cores, threads, OS, load at the start."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": build.cpu_model(), "simd": _simd(), "logical_cores": os.cpu_count(),
            "threads": threads,
            "machine": platform.machine(), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "sdpa_probe": __version__,
            "abi_version": int(get().lib.SDPA_ABI_VERSION), "loadavg": load}
