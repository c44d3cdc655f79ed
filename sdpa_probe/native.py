"""Thin wrapper over the native kernel libraries (ours and a user's).

Arrays are numpy views in the logical layout [batch, seq, heads, head_dim], with
any element strides (seq-at-dim-2 layouts are just transposed views). Storage
dtypes: float32, float16, int8 (with per-token scale / zero point, see
QuantTensor) and bfloat16, which numpy lacks, carried as uint16 bit patterns.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import re
from pathlib import Path

import numpy as np

from . import _cdefs
from .build import (  # noqa: F401
    CXX_SUFFIXES,
    INCLUDE_DIR,
    SRC_DIR,
    BuildResult,
    BuildSpec,
    build,
    load,
)
from .errors import BuildError, ProbeError, SdpaInvalid, SdpaUnsupported

F32, F16, BF16, I8 = 0, 1, 2, 3
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16", I8: "i8"}
_NP_CODES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16,
             np.dtype(np.uint16): BF16, np.dtype(np.int8): I8}


@dataclasses.dataclass
class QuantTensor:
    """int8 values [B, S, H, D] with per-token scale [B, S, H] (float32) and zero point
    [B, S, H] (int8, or None for 0): real = (data - zero_point) * scale."""

    data: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray | None = None


# ---- building and loading -------------------------------------------------

def lib_spec() -> BuildSpec:
    sources = tuple(sorted(SRC_DIR.glob("*.c")))
    headers = tuple(sorted(INCLUDE_DIR.glob("*.h")) + sorted(SRC_DIR.glob("*.h")))
    return BuildSpec(
        stem="sdpa_probe_native",
        cdef=_cdefs.LIB + _cdefs.EXTRA,
        source='#include "sdpa_probe_lib.h"\n' + _cdefs.EXTRA_INCLUDES,
        sources=sources,
        headers=headers,
        include_dirs=(INCLUDE_DIR, SRC_DIR),
    )


_build_opts: dict = {}


def configure(cc: str | None = None, cflags: str | None = None) -> None:
    """Set the compiler and flags used for every later build in this process."""
    _build_opts.update(cc=cc, cflags=cflags)
    native_lib.cache_clear()


def build_lib(force: bool = False) -> BuildResult:
    return build(lib_spec(), force=force, **_build_opts)


@functools.lru_cache(maxsize=1)
def native_lib():
    """The built-in kernel library: (ffi, lib, build result)."""
    res = build_lib()
    mod = load(res)
    return mod.ffi, mod.lib, res


# What --kernel takes: a C or C++ source (compiled here) or a prebuilt shared library
SOURCE_SUFFIXES = (".c",) + CXX_SUFFIXES
KERNEL_SUFFIXES = SOURCE_SUFFIXES + (".so",)
KERNEL_FILES = "a .c, .cpp or .so file"


def user_kernel_spec(path: Path) -> BuildSpec:
    if not str(path).strip() or str(path) == ".":  # (typer reads --kernel "" as Path("."))
        raise ProbeError(f"--kernel is empty: give {KERNEL_FILES} implementing sdpa_forward")
    path = Path(path).resolve()
    if path.is_dir():
        raise ProbeError(f"--kernel {path} is a directory: give {KERNEL_FILES}")
    if not path.is_file():
        if path.exists():  # (a device, a FIFO: nothing to compile)
            raise ProbeError(f"--kernel {path} is not a regular file: give {KERNEL_FILES}")
        raise ProbeError(f"kernel file not found: {path}")
    if path.suffix in SOURCE_SUFFIXES:
        return BuildSpec(stem="sdpa_probe_user", cdef=_cdefs.USER_KERNEL,
                         source='#include "sdpa_probe.h"\n', sources=(path,),
                         headers=tuple(sorted(INCLUDE_DIR.glob("*.h"))),
                         include_dirs=(INCLUDE_DIR, path.parent))
    if path.suffix == ".so":
        # API mode against a prebuilt library: link a shim module to it
        return BuildSpec(stem="sdpa_probe_user_so", cdef=_cdefs.USER_KERNEL,
                         source='#include "sdpa_probe.h"\n',
                         headers=(path,) + tuple(sorted(INCLUDE_DIR.glob("*.h"))),
                         include_dirs=(INCLUDE_DIR,),
                         extra_link=(str(path), f"-Wl,-rpath,{path.parent}"))
    raise ProbeError(f"--kernel wants {KERNEL_FILES} (.cc, .cxx too), got {path.name}")


# ---- kernels ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KernelInfo:
    name: str
    description: str
    dtypes: tuple[str, ...]
    features: tuple[str, ...]
    index: int  # registry index in our library; -1 for a user kernel

    def as_dict(self) -> dict:
        return {"name": self.name, "description": self.description,
                "dtypes": list(self.dtypes), "features": list(self.features)}


class Kernel:
    """One callable SDPA kernel behind the C ABI."""

    def __init__(self, ffi, lib, info: KernelInfo, user: bool = False,
                 build: BuildResult | None = None):
        self.ffi, self.lib, self.info, self.user = ffi, lib, info, user
        self.build = build  # a user kernel's module (trial_call loads it in a child)

    @property
    def name(self) -> str:
        return self.info.name

    def forward_args(self, args) -> int:
        """Call with a prepared sdpa_args*; returns the raw status code."""
        if self.user:
            return int(self.lib.sdpa_forward(args))
        return int(self.lib.sdpa_probe_kernel_forward(self.info.index, args))

    def forward_watched(self, args, watch: np.ndarray, copy: np.ndarray) -> int:
        """forward_args, with watch's bytes copied into copy (in C) the moment the call
        returns: a later difference is a write made after the call had returned."""
        ffi, lib, _ = native_lib()
        a = ffi.cast("const sdpa_args *", int(self.ffi.cast("uintptr_t",
                                                            self.ffi.cast("sdpa_args *", args))))
        fn, index = ffi.NULL, self.info.index
        if self.user:
            address = self.ffi.cast("uintptr_t", self.ffi.addressof(self.lib, "sdpa_forward"))
            fn, index = ffi.cast("sdpa_probe_forward_fn", int(address)), -1
        return int(lib.sdpa_probe_call_watched(fn, index, a, ffi.from_buffer(watch),
                                               ffi.from_buffer(copy), watch.nbytes))

    def scratch_bytes(self, args) -> int:
        if self.user:
            return -1
        return int(self.lib.sdpa_probe_kernel_scratch_bytes(self.info.index, args))

    def __call__(self, q, k, v, out, **kw) -> None:
        call = prepare(self.ffi, q, k, v, out, **kw)
        raise_for_status(self.forward_args(call.args), self.name)


def _decode_info(ffi, ptr, index: int) -> KernelInfo:
    dtypes = tuple(DTYPE_NAMES[c] for c in range(4) if ptr.dtypes & (1 << c))
    feats = tuple(name for bit, name in enumerate(_cdefs.FEATURES) if ptr.features & (1 << bit))
    return KernelInfo(ffi.string(ptr.name).decode(), ffi.string(ptr.description).decode(),
                      dtypes, feats, index)


@functools.lru_cache(maxsize=1)
def builtin_kernels() -> dict[str, Kernel]:
    ffi, lib, _ = native_lib()
    out = {}
    for i in range(lib.sdpa_probe_kernel_count()):
        info = _decode_info(ffi, lib.sdpa_probe_kernel_get(i), i)
        out[info.name] = Kernel(ffi, lib, info)
    return out


def flash_bf16_why() -> str | None:
    """Why flash_bf16 refuses every call in this process (no AMX-BF16 tiles), or None."""
    ffi, lib, _ = native_lib()
    why = lib.sdpa_probe_flash_bf16_why()
    return None if why == ffi.NULL else ffi.string(why).decode()


def refused_reason(kernel: Kernel) -> str:
    """What SDPA_UNSUPPORTED means from one of our kernels: flash_bf16 (the BF16-product
    kernel) says why it cannot use the AMX tiles here; the others refuse a case alone."""
    why = flash_bf16_why() if "bf16-products" in kernel.info.features else None
    return "kernel returned SDPA_UNSUPPORTED" + (f": {why}" if why else "")


def get_kernel(name: str) -> Kernel:
    kernels = builtin_kernels()
    if name not in kernels:
        raise ProbeError(f"unknown kernel {name!r}; known: {', '.join(kernels)}")
    return kernels[name]


def load_user_module(res: BuildResult, path: Path):
    """Import a built user kernel module; a symbol the file does not define (sdpa_forward
    itself, or a helper) is a one-line BuildError naming it."""
    try:
        return load(res)
    except BuildError as exc:
        missing = re.search(r"undefined symbol: (\w+)", str(exc))
        if missing and missing.group(1) == "sdpa_forward":
            raise BuildError(f"{Path(path).name} does not define sdpa_forward, the entry point a "
                             "kernel exports: int sdpa_forward(const sdpa_args *)") from None
        if missing:
            raise BuildError(f"{Path(path).name} uses {missing.group(1)}, which it does not "
                             "define (a kernel is one self-contained .c / .cpp file, or a .so)"
                             ) from None
        raise


def load_user_kernel(path: Path, force: bool = False) -> Kernel:
    spec = user_kernel_spec(path)
    res = build(spec, force=force, **_build_opts)
    mod = load_user_module(res, path)
    info = KernelInfo(Path(path).name, f"user kernel {path}",
                      ("f32", "f16", "bf16", "i8"), (), -1)
    return Kernel(mod.ffi, mod.lib, info, user=True, build=res)


# ---- the calling thread's floating-point environment ------------------------------

def fp_control() -> int:
    """The calling thread's floating-point control state (native/src/runtime.c)."""
    return int(native_lib()[1].sdpa_probe_fp_control())


def set_fp_control(value: int) -> None:
    native_lib()[1].sdpa_probe_fp_control_set(value)


def program_break() -> int:
    """The program break (sbrk(0)) as an address; 0 where there is none."""
    return int(native_lib()[1].sdpa_probe_program_break())


def heap_in_use() -> int | None:
    """Bytes the process's C allocator has handed out and not taken back (glibc's
    mallinfo2, every arena); None where the C library does not say."""
    n = int(native_lib()[1].sdpa_probe_heap_in_use())
    return n if n >= 0 else None


_X86_ROUNDING = ("to nearest", "down", "up", "toward zero")


def describe_fp_change(before: int, after: int) -> str:
    """What a call changed in the state fp_control reads, in words where the bits are
    x86's (MXCSR in the low half, the x87 control word above), else in hex."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return f"FPCR / rounding state {before:#x} -> {after:#x}"
    parts = []
    b, a = before & 0xFFFFFFFF, after & 0xFFFFFFFF
    for bit, what in ((15, "flush-to-zero"), (6, "denormals-are-zero")):
        if (a ^ b) >> bit & 1:
            parts.append(f"MXCSR {what} {'on' if a >> bit & 1 else 'off'}")
    if (a ^ b) >> 13 & 3:
        parts.append(f"MXCSR rounding {_X86_ROUNDING[b >> 13 & 3]} -> {_X86_ROUNDING[a >> 13 & 3]}")
    if (a ^ b) >> 7 & 0x3F:
        parts.append(f"MXCSR exception masks {b >> 7 & 0x3F:#04x} -> {a >> 7 & 0x3F:#04x} "
                     "(an unmasked exception traps: SIGFPE)")
    cb, ca = before >> 32 & 0xFFFF, after >> 32 & 0xFFFF
    if cb != ca:
        parts.append(f"x87 control word {cb:#06x} -> {ca:#06x}")
    return ", ".join(parts) + f" (MXCSR {b:#06x} -> {a:#06x})"


def raise_for_status(status: int, name: str) -> None:
    if status == 0:
        return
    if status == 1:
        raise SdpaUnsupported(f"{name}: SDPA_UNSUPPORTED")
    if status == 2:
        raise SdpaInvalid(f"{name}: SDPA_INVALID")
    raise SdpaInvalid(f"{name}: unknown status {status}")


# ---- argument marshalling ---------------------------------------------------

def _root_array(a: np.ndarray) -> np.ndarray:
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


# (numpy 2 moved byte_bounds to numpy.lib.array_utils; numpy 1.26 has it at the top)
byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds


def _pointer(ffi, a: np.ndarray, keep: list):
    """A void* to a's first element. Views go through ffi.from_buffer of the
    contiguous array they view, after checking the view lies inside it."""
    if a.size == 0:  # (batch 0, q_len 0: the address numpy gives it, never read)
        keep.append(a)
        return ffi.cast("char *", a.__array_interface__["data"][0])
    root = _root_array(a)
    if root is not a and root.flags.c_contiguous:
        lo, hi = byte_bounds(a)
        rlo, rhi = byte_bounds(root)
        if not (rlo <= lo and hi <= rhi):
            raise ValueError("view lies outside its base array")
        buf = ffi.from_buffer(root.reshape(-1).view(np.uint8))
        keep.append(buf)
        return ffi.cast("char *", buf) + (a.__array_interface__["data"][0] - rlo)
    if a.flags.c_contiguous:
        buf = ffi.from_buffer(a.reshape(-1).view(np.uint8))
        keep.append(buf)
        return buf
    # a non-contiguous array whose memory numpy does not own (e.g. from torch)
    keep.append(a)
    return ffi.cast("char *", a.__array_interface__["data"][0])


def _elem_strides(a: np.ndarray) -> list[int]:
    item = a.itemsize
    if any(s % item for s in a.strides):
        raise ValueError("strides are not a multiple of the element size")
    return [s // item for s in a.strides]


def _fill_tensor(ffi, t, arr, keep: list, name: str) -> None:
    if isinstance(arr, QuantTensor):
        data = arr.data
        if data.dtype != np.int8:
            raise ValueError(f"{name}: QuantTensor data must be int8")
        if arr.scale.dtype != np.float32 or arr.scale.shape != data.shape[:3]:
            raise ValueError(f"{name}: scale must be float32 of shape {data.shape[:3]}")
        t.scale = ffi.cast("const float *", _pointer(ffi, arr.scale, keep))
        st = _elem_strides(arr.scale)
        if arr.zero_point is not None:
            zp = arr.zero_point
            if zp.dtype != np.int8 or zp.shape != data.shape[:3] or _elem_strides(zp) != st:
                raise ValueError(f"{name}: zero_point must be int8, shaped and strided as scale")
            t.zero_point = ffi.cast("const int8_t *", _pointer(ffi, zp, keep))
        for i in range(3):
            t.qstride[i] = st[i]
        arr = data
    if not isinstance(arr, np.ndarray) or arr.ndim != 4:
        raise ValueError(f"{name}: expected a 4-D array [batch, seq, heads, head_dim]")
    code = _NP_CODES.get(arr.dtype)
    if code is None:
        raise ValueError(f"{name}: unsupported dtype {arr.dtype}")
    if code == I8 and t.scale == ffi.NULL:
        raise ValueError(f"{name}: int8 storage needs a QuantTensor (scale, zero point)")
    t.data = _pointer(ffi, arr, keep)
    t.dtype = code
    for i, s in enumerate(_elem_strides(arr)):
        t.stride[i] = s


@dataclasses.dataclass
class PreparedCall:
    args: object  # sdpa_args*
    keep: list    # buffers the pointers refer to


def _shape(x) -> tuple[int, ...]:
    return (x.data if isinstance(x, QuantTensor) else x).shape


def prepare(ffi, q, k, v, out, *, mask: np.ndarray | None = None, is_causal: bool = False,
            start_pos: int = 0, scale: float = 0.0, n_threads: int = 0) -> PreparedCall:
    """Check shapes and dtypes, then fill an sdpa_args for q, k, v, out."""
    qs, ks, vs, os_ = _shape(q), _shape(k), _shape(v), _shape(out)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or len(os_) != 4:
        raise ValueError("q, k, v, out must be 4-D [batch, seq, heads, head_dim]")
    B, Lq, H, D = qs
    if ks != vs:
        raise ValueError(f"k {ks} and v {vs} shapes differ")
    if ks[0] != B or ks[3] != D:
        raise ValueError(f"k {ks} does not match q {qs} in batch or head_dim")
    if os_ != qs:
        raise ValueError(f"out {os_} must have q's shape {qs}")
    if isinstance(out, QuantTensor) or out.dtype not in (np.float32, np.float16, np.uint16):
        raise ValueError("out must be float32, float16 or bfloat16 (uint16)")
    Hkv = ks[2]
    if Hkv <= 0 or H % Hkv:
        raise ValueError(f"n_heads {H} is not a multiple of n_kv_heads {Hkv}")
    keep: list = []
    args = ffi.new("sdpa_args *")
    keep.append(args)
    args.abi_version = 1
    args.batch, args.n_heads, args.n_kv_heads = B, H, Hkv
    args.q_len, args.kv_len, args.head_dim = Lq, ks[1], D
    _fill_tensor(ffi, args.q, q, keep, "q")
    if ks[1] > 0:
        _fill_tensor(ffi, args.k, k, keep, "k")
        _fill_tensor(ffi, args.v, v, keep, "v")
    else:  # an empty cache: no pointers, but its dtype, which a kernel may dispatch on
        for t, arr in ((args.k, k), (args.v, v)):
            t.dtype = I8 if isinstance(arr, QuantTensor) else _NP_CODES.get(arr.dtype, 0)
    _fill_tensor(ffi, args.out, out, keep, "out")
    if mask is not None:
        if mask.dtype != np.float32 or mask.ndim != 2 or mask.shape != (Lq, ks[1]):
            raise ValueError(f"mask must be float32 of shape {(Lq, ks[1])}")
        if mask.strides[1] != 4 and mask.size:  # (an empty one's strides are numpy's guess)
            raise ValueError("mask rows must be contiguous")
        args.mask = ffi.cast("const float *", _pointer(ffi, mask, keep))
        args.mask_row_stride = mask.strides[0] // 4 if Lq > 1 else ks[1]
    args.is_causal = int(bool(is_causal))
    args.start_pos = int(start_pos)
    args.scale = float(scale)
    args.n_threads = int(n_threads)
    return PreparedCall(args, keep)
