"""Which native kernels a bench run times: registered kernels by name, a user's
.c / .cpp / .so files implementing sdpa_forward, and the default kernel of a dtype."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .. import native
from ..backends import parse
from ..errors import ProbeError
from .shapes import Shape

DEFAULT_KERNEL = {"f32": "flash", "f16": "flash", "bf16": "flash", "i8": "quant_int8"}


def resolve_kernels(specs: Sequence[str]) -> list[native.Kernel]:
    """Our kernels by name and a user's .c / .cpp / .so files (built, or found in the
    build cache), in order; two files of one name are told apart by their path."""
    out: list[native.Kernel] = []
    for text in specs:
        spec = parse(text, what="kernel")
        if spec.kind == "file":
            k = native.load_user_kernel(spec.path)
            if any(o.name == k.name for o in out):
                k = native.Kernel(k.ffi, k.lib, dataclasses.replace(k.info, name=spec.name),
                                  user=True, build=k.build)
        elif spec.kind == "native":
            k = native.get_kernel(spec.name)
        else:
            raise ProbeError(f"{text} is not a kernel (it times as a peer: --vs {text})")
        if any(o.name == k.name for o in out):
            raise ProbeError(f"{text} is given twice (as a kernel or a peer)")
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
