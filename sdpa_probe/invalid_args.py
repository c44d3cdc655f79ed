"""Calls a kernel must refuse: the ABI's SDPA_INVALID contract, checked.

The ABI (docs/abi.md, native/include/sdpa_probe.h) says a kernel returns a status and
never aborts: given an argument no kernel can accept it returns SDPA_INVALID and
writes nothing. A kernel that trusts its arguments instead divides by a zero head
count (SIGFPE), dereferences a NULL buffer or scale (SIGSEGV), reads the wrong heads
when the group does not divide, or computes an answer nobody asked for and returns
SDPA_OK; ExecuTorch's ops abort the process on bad shapes. Each entry below takes a
valid call (a case's prepared sdpa_args) and breaks one thing (the names, and what each
breaks in words, are data: cases.INVALID_CALLS); the case that carries it (Case.invalid)
is judged on the status and on the output staying untouched, in a worker process, so a
crash is a crash record, not the end of the run.
"""

from __future__ import annotations

from collections.abc import Callable

from .cases import INVALID_CALLS
from .judge.verdict import inputs_in_words

SDPA_OK, SDPA_UNSUPPORTED, SDPA_INVALID = 0, 1, 2

# name (cases.INVALID_CALLS) -> how to break a prepared call
_BREAK: dict[str, Callable] = {
    "abi-version": lambda a, ffi: setattr(a, "abi_version", 99),
    "heads-not-multiple": lambda a, ffi: setattr(a, "n_kv_heads", 3),
    "zero-kv-heads": lambda a, ffi: setattr(a, "n_kv_heads", 0),
    "zero-heads": lambda a, ffi: setattr(a, "n_heads", 0),
    "zero-head-dim": lambda a, ffi: setattr(a, "head_dim", 0),
    "negative-q-len": lambda a, ffi: setattr(a, "q_len", -1),
    "negative-batch": lambda a, ffi: setattr(a, "batch", -2),
    "negative-kv-len": lambda a, ffi: setattr(a, "kv_len", -1),
    "negative-start-pos": lambda a, ffi: setattr(a, "start_pos", -1),
    "nan-scale": lambda a, ffi: setattr(a, "scale", float("nan")),
    "inf-scale": lambda a, ffi: setattr(a, "scale", float("inf")),
    "null-q": lambda a, ffi: setattr(a.q, "data", ffi.NULL),
    "null-k": lambda a, ffi: setattr(a.k, "data", ffi.NULL),
    "null-v": lambda a, ffi: setattr(a.v, "data", ffi.NULL),
    "null-out": lambda a, ffi: setattr(a.out, "data", ffi.NULL),
    "zero-dim-stride": lambda a, ffi: a.q.stride.__setitem__(3, 0),
    "bad-dtype": lambda a, ffi: setattr(a.k, "dtype", 7),
    "int8-out": lambda a, ffi: setattr(a.out, "dtype", 3),
    "int8-without-scale": lambda a, ffi: setattr(a.k, "dtype", 3),
    "int8-v-without-scale": lambda a, ffi: setattr(a.v, "dtype", 3),
    "short-mask-rows": lambda a, ffi: setattr(a, "mask_row_stride", 1),
}
if set(_BREAK) != set(INVALID_CALLS):  # (a name a case may carry must break something)
    raise ImportError(f"invalid_args: breaks {sorted(set(_BREAK) ^ set(INVALID_CALLS))} "
                      "differ from cases.INVALID_CALLS")

# name -> (what is wrong, in a reason's words; how to break a prepared call)
INVALID: dict[str, tuple[str, Callable]] = {
    name: (words, _BREAK[name]) for name, words in INVALID_CALLS.items()}


def describe(name: str) -> str:
    return INVALID[name][0]


def corrupt(name: str, args, ffi) -> None:
    """Break one thing in a prepared call (sdpa_args, in place)."""
    INVALID[name][1](args, ffi)


def judge(name: str, status: int, output_changed: int,
          inputs_written: list[tuple[str, int]]) -> tuple[str, str]:
    """(status, reason) of a record for a kernel's answer to the invalid call:
    output_changed, bytes of the output arena written; inputs_written, InputGuard's."""
    what = f"an invalid call ({describe(name)})"
    if status == SDPA_OK:
        return "fail", (f"returned SDPA_OK for {what}: the ABI asks for SDPA_INVALID and "
                        "nothing written (sdpa_validate_args in sdpa_probe.h checks it)")
    if status not in (SDPA_UNSUPPORTED, SDPA_INVALID):
        return "fail", f"returned {status}, not an sdpa_status, for {what}"
    said = "SDPA_INVALID" if status == SDPA_INVALID else "SDPA_UNSUPPORTED"
    if output_changed:
        return "fail", (f"returned {said} for {what} but wrote {output_changed} bytes of "
                        "the output buffer first (nothing may be written)")
    if inputs_written:
        return "fail", (f"returned {said} for {what} but wrote into its inputs: "
                        f"{inputs_in_words(inputs_written)}")
    if status == SDPA_UNSUPPORTED:
        return "pass", (f"returned SDPA_UNSUPPORTED for {what}, nothing written "
                        "(SDPA_INVALID is the ABI's answer; a refusal is accepted)")
    return "pass", f"returned SDPA_INVALID for {what}, nothing written"
