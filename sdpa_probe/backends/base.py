"""What every backend is to the rest of the tool (the Python contract, as
native/include/sdpa_probe.h is the C one), and the errors a backend's call raises.

A backend has a `name` (what reports call it), says whether it can run here and why
not (`why_unavailable`), its `version()`, which cases it can express (`supports`,
None or the reason it cannot); it makes a case's call (`run`, writing into an
OutBuffer or raising Unsupported) and what `probe bench` times on a shape's input
sets (`timer`: a party.Party, or Unsupported). The registry (backends/registry.py)
turns a name the user typed into one."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import KernelError, SdpaInvalid, SdpaUnsupported


class Unsupported(Exception):
    """The backend does not implement this case (not a failure)."""


class Nondeterministic(KernelError):
    """Two identical calls gave different bits: the op returned memory it never wrote."""


class Backend(Protocol):
    name: str
    # the invalid calls (cases.INVALID names) its own API can express; an ABI kernel
    # (one with `prepare`) is given every one through the C arguments
    INVALID: tuple[str, ...]

    @classmethod
    def why_unavailable(cls) -> str | None: ...

    def version(self) -> str: ...

    def supports(self, case) -> str | None: ...

    def run(self, data, out) -> None: ...

    def timer(self, shape, sets, threads: int): ...


def describe_failure(exc: BaseException) -> str:
    """A backend's exception as a record's reason: one line."""
    if isinstance(exc, Nondeterministic):
        return str(exc)
    if isinstance(exc, SdpaInvalid):
        return "kernel returned SDPA_INVALID for valid arguments"
    if isinstance(exc, SdpaUnsupported):
        return "kernel returned SDPA_UNSUPPORTED"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def write_bshd(out, values) -> None:
    """Copy a [B, Lq, H, D] torch result into the output view, in its dtype (BF16 as
    its bit pattern: numpy has no bfloat16)."""
    import torch  # deferred: backends that never reach here need no torch

    if out.view.dtype == np.uint16:
        out.view[...] = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    else:
        out.view[...] = values.to(torch.float32).numpy().astype(out.view.dtype)
