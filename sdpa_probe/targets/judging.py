"""What the native worker saw, judged as a host call is: its output copied back into the
harness's own output buffer (verdict.judge's layers read it as they read a host call's),
the inputs it wrote by name, the floating-point control state in the target's own terms
(FPCR on aarch64, MXCSR on x86), the caller's thread and process state through
caller_state.changes, and the heap over repeated calls through the leak probe's rule."""

from __future__ import annotations

import numpy as np

from .. import caller_processes, caller_state
from ..inputs import OutBuffer
from ..judge.probes import LEAK_CALLS, LEAK_CONFIRM_CALLS, LEAK_WARMUP
from ..native import describe_fp_change, native_lib
from .arena import Buffer, CallResult, State, _addr

_ROUNDING = ("to nearest", "up", "down", "toward zero")  # FPCR.RMode
# FPCR bits a kernel may set for speed (or by mistake), in words
_FPCR_BITS = ((24, "flush-to-zero (FZ)"), (25, "default NaN (DN)"),
              (19, "F16 flush-to-zero (FZ16)"), (26, "alternative half precision (AHP)"))
_FPCR_TRAPS = ((8, "invalid"), (9, "divide by zero"), (10, "overflow"), (11, "underflow"),
               (12, "inexact"), (15, "input denormal"))


def describe_fpcr(before: int, after: int) -> str:
    """An AArch64 FPCR change in words."""
    parts = []
    for bit, what in _FPCR_BITS:
        if (before ^ after) >> bit & 1:
            parts.append(f"FPCR {what} {'on' if after >> bit & 1 else 'off'}")
    if (before ^ after) >> 22 & 3:
        parts.append(f"FPCR rounding {_ROUNDING[before >> 22 & 3]} -> "
                     f"{_ROUNDING[after >> 22 & 3]}")
    traps = [what for bit, what in _FPCR_TRAPS if (after & ~before) >> bit & 1]
    if traps:
        parts.append(f"FPCR traps enabled: {', '.join(traps)} (an exception traps: SIGFPE)")
    return ", ".join(parts or ["FPCR changed"]) + f" (FPCR {before:#x} -> {after:#x})"


def describe_fp(arch: str, before: int, after: int) -> str | None:
    """The change in the target's floating-point control state, or None if none."""
    if before == after:
        return None
    if arch.startswith("aarch64"):
        return describe_fpcr(before, after)
    return describe_fp_change(before, after)  # (x86: MXCSR and the x87 control word)


def fill_output(out: OutBuffer, buf: Buffer, res: CallResult) -> None:
    """The harness's output buffer as the worker's call left it: its arena (guards
    included) after the watch, and as the call returned (verdict layer 0)."""
    flat = buf.array.reshape(-1).view(np.uint8)
    flat[:] = np.frombuffer(res.final, np.uint8)
    off = _addr(out.arena) - buf.lo
    at = np.frombuffer(res.at_return, np.uint8)[off:off + out.arena.nbytes]
    out.at_return = at.view(out.arena.dtype).reshape(out.arena.shape).copy()


_NO_PROCESSES = caller_processes.ProcessState(frozenset(), (None, None, None))


def _caller(state: State):
    ffi = native_lib()[0]
    if len(state.raw) != ffi.sizeof("sdpa_probe_caller_state"):
        return None  # (a target whose struct is laid out otherwise: not compared)
    raw = ffi.new("sdpa_probe_caller_state *")
    ffi.memmove(raw, state.raw, ffi.sizeof("sdpa_probe_caller_state"))
    return caller_state.CallerState(raw, state.env, _NO_PROCESSES)


def caller_changes(before: State, after: State) -> list[str]:
    """What the calls changed in the worker's calling thread and process (its child
    processes and standard descriptors are not compared on a target)."""
    b, a = _caller(before), _caller(after)
    if b is None or a is None:
        return []
    return caller_state.changes(b, a)


def _window(series: list[int]) -> int:
    """Growth per call if the series grew on every step, else 0 (probes.growth_per_call)."""
    if series[0] < 0:
        return 0
    if all(b > a for a, b in zip(series[:-1], series[1:], strict=True)):
        return (series[-1] - series[0]) // (len(series) - 1)
    return 0


def growth(readings: list[tuple[int, int, int]]) -> dict[str, int]:
    """heap, fds and address_space growth per call over the worker's repeats: growth on
    each of LEAK_CALLS calls, confirmed over the next LEAK_CONFIRM_CALLS."""
    out = {}
    for i, name in enumerate(("heap", "fds", "address_space")):
        series = [r[i] for r in readings]
        first = _window(series[:LEAK_CALLS + 1])
        out[name] = _window(series[LEAK_CALLS:LEAK_CALLS + LEAK_CONFIRM_CALLS + 1]) if first else 0
    return out


def leak_reason(grew: dict[str, int]) -> str | None:
    """A leak in the words the host's repeat layer uses (judge/repeat.py)."""
    each = f"on each of {LEAK_CALLS + LEAK_CONFIRM_CALLS} repeats of the same call"
    after = f"(after {LEAK_WARMUP} warm-up calls)"
    if grew["fds"]:
        return (f"leaks file descriptors: the open ones grew {each}, {grew['fds']} a call "
                f"{after}; a process that decodes runs out of them")
    if grew["address_space"]:
        return (f"leaks address space: the process's mappings grew {each}, "
                f"{grew['address_space']:,} bytes a call {after} (a thread created and never "
                "joined keeps its stack mapped; a mapping never unmapped)"
                + (f"; the heap in use grew {grew['heap']:,} bytes a call" if grew["heap"]
                   else ""))
    if grew["heap"]:
        return (f"leaks memory: the heap in use grew {each}, {grew['heap']:,} bytes a call "
                f"{after}")
    return None
