"""Child processes that import this package (check's workers, the allocation
counter, a trial call): their environment, and how one ended, in words."""

from __future__ import annotations

import os
import signal


def last_words(log: str) -> str:
    """The most telling line a dead worker printed: an assert or error if any."""
    try:
        with open(log, errors="replace") as fh:
            lines = [ln.strip() for ln in fh.readlines()[-50:] if ln.strip()]
    except OSError:
        return ""
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
    """The environment for a `python -c` / `-m` child that imports this package: ours,
    with the package's parent put first on PYTHONPATH (a checkout that is not installed
    still imports), plus `extra`."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_parent, os.environ.get("PYTHONPATH")) if p), **extra)
