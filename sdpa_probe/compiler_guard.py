"""A build's compilers end with the build: each compiler command runs under a guard,
this file run as a script (`python -I -S compiler_guard.py PARENT_PID CC ARGS...`,
standard library only), which puts itself and the compiler in a process group of their
own and kills that group when the build's process ends, however it ends
(PR_SET_PDEATHSIG: a SIGKILL of probe too). A SIGINT of the build kills the groups of
its running guards before the interrupt goes on (`interruptible`). cffi's compile
gets the guard through $CC and $LDSHARED (guarded()), the object compiles directly."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1
SCRIPT = os.path.abspath(__file__)


def guarded(cmd: list[str]) -> list[str]:
    """cmd run under a guard whose build is this process."""
    return [sys.executable, "-I", "-S", SCRIPT, str(os.getpid()), *cmd]


def guarded_text(cmd: list[str]) -> str:
    """guarded(cmd) as a shell-quoted line (what distutils reads from $CC)."""
    return shlex.join(guarded(cmd))


def _guards() -> list[int]:
    """This process's children that are guards (each its group's leader)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
    found = []
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if SCRIPT.encode() in fh.read().split(b"\0"):
                found.append(pid)
    return found


def kill_guards() -> None:
    """Every running guard of this process killed with its compilers."""
    for pid in _guards():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


stopping = threading.Event()  # set once an interrupt killed the guards: start no more


def run(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """cmd under a guard, its output captured (text); on a timeout or an exception its
    group is killed before the exception goes on. After an interrupt, nothing runs."""
    if stopping.is_set():
        return subprocess.CompletedProcess(cmd, 130, "", "error: the build was interrupted")
    proc = subprocess.Popen(guarded(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@contextlib.contextmanager
def interruptible():
    """A build during which SIGINT first kills the compilers, then interrupts as it
    would have; an exception out of the build kills them too."""
    prior = None
    stopping.clear()
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
        def on_interrupt(signum, frame):
            stopping.set()
            kill_guards()
            if callable(prior):
                prior(signum, frame)
            else:
                raise KeyboardInterrupt

        prior = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    except BaseException:
        stopping.set()
        kill_guards()
        raise
    finally:
        if prior is not None:
            signal.signal(signal.SIGINT, prior)


def _end_group(signum=None, frame=None) -> None:
    os.killpg(0, signal.SIGKILL)  # (the guard with it)


def _prctl(libc, option: int, value: int) -> None:
    with contextlib.suppress(AttributeError):
        libc.prctl(option, value, 0, 0, 0)


def main(argv: list[str]) -> int:
    parent, cmd = int(argv[1]), argv[2:]
    os.setpgid(0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _end_group)
    libc = ctypes.CDLL(None, use_errno=True)
    _prctl(libc, PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        _end_group()  # (the build ended while this guard started)
    guard = os.getpid()
    pid = os.fork()
    if pid == 0:
        # the compiler driver dies with the guard even when a SIGKILL ends the guard
        _prctl(libc, PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != guard:
            os._exit(1)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE,
                    signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            os.write(2, f"error: cannot run {cmd[0]}: {exc.strerror}\n".encode())
        os._exit(127)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
