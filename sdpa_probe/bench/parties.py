"""Every SDPA party of a bench run is made here, by the backend the name stands for
(backends.registry; Backend.timer): our kernels and a user's in the library's C
loop, torch's and a runtime's ops call by call."""

from __future__ import annotations

from .. import native
from ..backends import BackendSpec, make, parse
from ..party import NativeParty, Party
from .inputs import Inputs
from .shapes import Shape


def make_party(spec: BackendSpec | str | native.Kernel, shape: Shape, sets: list[Inputs],
               threads: int) -> Party:
    """The party for a backend on a shape's input sets: a name (parsed), a parsed spec,
    or a native kernel already resolved (kernels.resolve_kernels). Raises
    backends.Unsupported with the reason for a shape the backend cannot time."""
    if isinstance(spec, native.Kernel):
        return NativeParty(spec, shape, sets, threads)
    return make(parse(spec) if isinstance(spec, str) else spec).timer(shape, sets, threads)
