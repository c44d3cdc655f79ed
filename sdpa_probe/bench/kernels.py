"""Which native kernels a bench run times: registered kernels by name, a user's
.c / .cpp / .so files implementing sdpa_forward, and the default kernel of a dtype."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from .. import native
from ..errors import ProbeError
from .shapes import Shape

PEERS = ("torch", "executorch")  # the peers that are not native kernels
DEFAULT_KERNEL = {"f32": "flash", "f16": "flash", "bf16": "flash", "i8": "quant_int8"}


def is_kernel_file(spec: str) -> bool:
    return spec.endswith(native.KERNEL_SUFFIXES) or os.sep in spec


def resolve_kernels(specs: Sequence[str]) -> list[native.Kernel]:
    """Registered kernels by name and user kernels from .c / .cpp / .so files (built, or found
    in the build cache), in order; two files of one name are told apart by their path."""
    known = native.builtin_kernels()
    out: list[native.Kernel] = []
    for spec in specs:
        if is_kernel_file(spec):
            k = native.load_user_kernel(spec)
            if any(o.name == k.name for o in out):
                k = native.Kernel(k.ffi, k.lib, dataclasses.replace(k.info, name=f"user:{spec}"),
                                  user=True, build=k.build)
        elif spec in known:
            k = known[spec]
        else:
            raise ProbeError(f"unknown kernel {spec!r}; known: {', '.join(known)}, "
                             f"or {native.KERNEL_FILES} implementing sdpa_forward")
        if any(o.name == k.name for o in out):
            raise ProbeError(f"{spec} is given twice (as a kernel or a peer)")
        out.append(k)
    return out


def takes(kernel: native.Kernel, shape: Shape) -> bool:
    """Whether a registered kernel takes the shape's dtype (a user kernel says so by
    its status, at the first call)."""
    if kernel.user:
        return True
    if shape.dtype not in kernel.info.dtypes:
        return False
    return not (kernel.name.startswith("quant") and shape.dtype != "i8")  # int8 K/V only


def kernels_for(shape: Shape, kernels: Sequence[native.Kernel] | None) -> list[native.Kernel]:
    """The native kernels to run on a shape: the given ones that take its dtype, or
    the default fused kernel for the dtype."""
    if not kernels:
        return [native.get_kernel(DEFAULT_KERNEL[shape.dtype])]
    return [k for k in kernels if takes(k, shape)]


def check_peers(peers: Sequence[str]) -> None:
    """Refuse a peer that is neither torch / executorch, a registered kernel nor a file."""
    known = native.builtin_kernels()
    for p in peers:
        if p not in PEERS and p not in known and not is_kernel_file(p):
            raise ProbeError(f"unknown peer {p!r}; known: {', '.join(PEERS)}, a kernel "
                             f"({', '.join(known)}) or {native.KERNEL_FILES} implementing "
                             "sdpa_forward")
