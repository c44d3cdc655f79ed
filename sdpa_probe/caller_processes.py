"""Two more things a kernel call must leave as it found them in its caller's process:
its child processes (a kernel that forks leaves a copy of the runtime's process
behind, or a zombie) and its standard file descriptors 0-2 (a kernel that closes
them takes the runtime's logging with it). Read around every call by caller_state."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal

STD_NAMES = ("stdin", "stdout", "stderr")
# (fd, (device, inode)) -> a copy of that fd as it was, to put back
_saved_std: dict[tuple[int, tuple], int] = {}


@dataclasses.dataclass(frozen=True)
class ProcessState:
    children: frozenset[int]
    std_fds: tuple  # per fd 0-2: (device, inode), or None when closed


def _children() -> frozenset[int]:
    """This process's child processes, every thread's (/proc; empty without it)."""
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return frozenset()
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
        except OSError:  # (a thread ended since the listing, or no CONFIG_PROC_CHILDREN)
            continue
    return frozenset(pids)


def _std_fds() -> tuple:
    out = []
    for fd in range(3):
        try:
            st = os.fstat(fd)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino))
        if (fd, out[-1]) not in _saved_std:
            _saved_std[(fd, out[-1])] = os.dup(fd)
    return tuple(out)


def read() -> ProcessState:
    return ProcessState(_children(), _std_fds())


def changes(before: ProcessState, now: ProcessState) -> list[str]:
    out = []
    started = sorted(now.children - before.children)
    if started:
        out.append(f"{len(started)} child process{'es' if len(started) > 1 else ''} started "
                   f"and still there after the call (pid {', '.join(map(str, started[:4]))}): "
                   "a kernel that forks copies the runtime's whole process")
    for fd, (was, is_) in enumerate(zip(before.std_fds, now.std_fds, strict=True)):
        if was != is_:
            what = "closed" if is_ is None else "replaced"
            out.append(f"its {STD_NAMES[fd]} (fd {fd}) {what}")
    return out


def restore(before: ProcessState, now: ProcessState) -> None:
    """The processes the call started killed and reaped; fds 0-2 put back."""
    for pid in now.children - before.children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    for fd, (was, is_) in enumerate(zip(before.std_fds, now.std_fds, strict=True)):
        if was != is_ and (fd, was) in _saved_std:
            os.dup2(_saved_std[(fd, was)], fd)
