"""The few C library calls the tool makes itself, through cffi in ABI mode (nothing to
compile): fflush(NULL), for what a kernel printed without a newline, and prctl, for
the parent-death signal and the child subreaper of a process about to call kernels."""

from __future__ import annotations

import functools

import cffi


@functools.lru_cache(maxsize=1)
def _libc():
    ffi = cffi.FFI()
    ffi.cdef("int fflush(void *stream);\n"
             "int prctl(int option, unsigned long arg2, unsigned long arg3, "
             "unsigned long arg4, unsigned long arg5);")
    return ffi, ffi.dlopen(None)


def flush_stdio() -> None:
    """fflush(NULL): the C library's buffered output written out."""
    ffi, libc = _libc()
    libc.fflush(ffi.NULL)


def prctl(option: int, value: int) -> bool:
    """prctl(option, value); False where it fails or there is none (not Linux)."""
    try:
        return _libc()[1].prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
