"""Which attention graph runs in a profile's attention slot: the decomposed graph, the
fused one, any registered kernel or the --kernel file, each optionally in a native build
with other compiler flags (GRAPH@CFLAGS)."""

from __future__ import annotations

import dataclasses

from .. import native
from ..errors import ProbeError
from . import builds, decode

USER = "user"  # the attention name of --kernel PATH


@dataclasses.dataclass(frozen=True)
class Attention:
    label: str            # what the user asked for: decomposed, fused, a kernel name, user;
                          # with @CFLAGS: the same in a native build with those flags
    graph: int            # decode.GRAPH_DECOMPOSED or decode.GRAPH_KERNEL
    kernel_index: int = -1
    kernel: str | None = None  # the kernel in the attention slot (its file name for --kernel)
    cflags: str | None = None  # extra compiler flags of its native build (None: the default)
    user: builds.UserKernel | None = None

    @property
    def base(self) -> str:
        return split_build(self.label)[0]

    @property
    def build_label(self) -> str:
        return builds.DEFAULT if self.cflags is None else self.cflags

    @property
    def title(self) -> str:
        if self.kernel and self.base != self.kernel:
            return f"{self.label} ({self.kernel})"
        return self.label


def split_build(label: str) -> tuple[str, str | None]:
    """GRAPH@CFLAGS -> (GRAPH, CFLAGS); no @ -> (GRAPH, None)."""
    base, at, flags = label.strip().partition("@")
    if not at:
        return base.strip(), None
    if not flags.strip():
        raise ProbeError(f"{label!r}: no compiler flags after @ (e.g. fused@-O1)")
    return base.strip(), " ".join(flags.split())


def with_build(base: str, cflags: str | None) -> str:
    return base if cflags is None else f"{base}@{cflags}"


def resolve_attention(label: str, cache: str, kernel_path: str | None = None) -> Attention:
    """decomposed | fused | KERNEL (any registered kernel; kernel:NAME for a name clash) |
    user (the --kernel file), each optionally @CFLAGS (a native build with those flags)."""
    label = " ".join(label.split())
    base, cflags = split_build(label)
    if base == "decomposed":
        return Attention(label, decode.GRAPH_DECOMPOSED, cflags=cflags)
    if base == USER:
        if kernel_path is None:
            raise ProbeError(f"attention {label!r} is the --kernel file: give --kernel PATH.c "
                             "or PATH.so")
        uk = builds.user_kernel(kernel_path, cflags)
        return Attention(label, decode.GRAPH_KERNEL, -1, uk.name, cflags, uk)
    kernels = native.builtin_kernels()  # the registry is the same in every build
    if base == "fused":
        name = "quant_int8" if cache == "i8" else "flash"
    else:
        name = base[len("kernel:"):] if base.startswith("kernel:") else base
    if name not in kernels:  # (the slot runs a kernel of the native graph)
        raise ProbeError(f"unknown attention {label!r}; use decomposed, fused, user (with "
                         "--kernel) or a kernel: " + ", ".join(kernels))
    k = kernels[name]
    if cache not in k.info.dtypes:
        raise ProbeError(f"kernel {name} does not read a {cache} cache (it takes "
                         f"{' '.join(k.info.dtypes)}); pick another --cache or --attention")
    return Attention(label, decode.GRAPH_KERNEL, k.info.index, name, cflags)


def check_pairs(atts: list[Attention], cache: str,
                kernel_path: str | None = None) -> list[tuple[Attention, Attention]]:
    """The output checks: every non-decomposed attention against the decomposed graph of
    its own build; a decomposed graph alone against the fused graph of its build."""
    pairs = []
    for a in atts:
        if a.graph != decode.GRAPH_DECOMPOSED:
            ref = resolve_attention(with_build("decomposed", a.cflags), cache)
            pairs.append((ref, a))
    if not pairs:
        for a in atts:
            pairs.append((a, resolve_attention(with_build("fused", a.cflags), cache)))
    return pairs
