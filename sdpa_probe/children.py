"""Child processes that import this package (check's workers, the allocation
counter, a trial call): their environment, how one ended, in words, and the end of
whatever they started."""

from __future__ import annotations

import contextlib
import os
import signal

from . import sandbox

TAIL_BYTES = 1 << 16  # of a log read for its last words (a flood's is OUTPUT_CAP long)


def last_words(log: str) -> str:
    """The most telling line a dead worker printed: an assert or error if any."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - TAIL_BYTES))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines()[-50:] if ln.strip()]
    for ln in reversed(lines):
        low = ln.lower()
        if any(w in low for w in ("assert", "error", "abort", "fault", "terminate")):
            return ln[:240]
    return lines[-1][:240] if lines else ""


def process_alive(pid: int) -> bool:
    """Whether a process of this pid runs (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_name(code: int | None) -> str:
    """How a child process ended, from its exit code: 'SIGSEGV', 'exit code 3'; a
    SIGILL with what usually raises it."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
        return name + SIGNAL_NOTES.get(name, "")
    return f"exit code {code}"


def died_in_call(code: int | None) -> str:
    """How a process died inside a kernel's call: a signal's name, or for an exit code
    (which only exit() or _exit() gives there) that the kernel called one."""
    if code is not None and code >= 0:
        return f"exited (code {code}) inside the call: exit() in the kernel?"
    return signal_name(code)


# What a signal's name does not say. Linux answers an AMX tile instruction with SIGILL
# until the process has asked for the tile data state (measured here: tilezero after
# ldtilecfg, without the arch_prctl, dies so).
SIGNAL_NOTES = {
    "SIGILL": (" (an instruction this CPU or OS does not allow: code built for another "
               "-march, a trap such as __builtin_trap(), or AMX tiles used before "
               "arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))"),
}


def child_env(**extra: str) -> dict:
    """The environment for a `python -c` / `-m` child that imports this package and
    calls kernels: ours as sandbox.environment lets through (--pass-env's too), with the
    package's parent put first on PYTHONPATH (a checkout that is not installed still
    imports), plus `extra`."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sandbox.environment(PYTHONPATH=os.pathsep.join(
        p for p in (package_parent, os.environ.get("PYTHONPATH")) if p), **extra)


def descendants(pid: int) -> list[int]:
    """The processes under pid, children first (/proc; none without it)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            found += [k for k in kids if k not in found]
            todo += kids
    return found


def kill_tree(pid: int, passes: int = 5) -> None:
    """SIGKILL every process under pid (not pid), again while some appear (one forked
    between the reading and the kill)."""
    for _ in range(passes):
        found = descendants(pid)
        if not found:
            return
        for p in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
