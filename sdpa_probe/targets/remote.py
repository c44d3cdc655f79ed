"""Running the native worker on a target: under qemu-aarch64 here, or on a device over
ssh (the worker copied there once per build, each case's arena sent on ssh's standard
input and the result read from its standard output: nothing written to disk on either
side, and one connection kept open for a run's cases).

A run's outcome is what the harness judges: the worker's result, or how its process
ended (a signal, an exit inside the call, no result within the timeout), or for ssh a
connection that dropped (a clear error for that case; the next case connects again)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import shlex
import subprocess
import tempfile
import time

from .build import WorkerBuild
from .spec import QEMU, Target

# the harness's workers run with glibc filling what malloc hands out and without its
# per-thread cache (check/pool.py): the worker too, so that scratch read before it is
# written shows and the leak probe's heap count is exact
TUNABLES = "glibc.malloc.perturb=128:glibc.malloc.tcache_count=0"
SSH_OPTIONS_ENV = "SDPA_PROBE_SSH_OPTIONS"  # more ssh options (-i KEY, -o ...), shell words
EXIT_MARK = "sdpa_probe_worker_exit="
WORKER_FAULT = 97  # the worker's own exit code for an arena it cannot read (die())
CONNECT_SECONDS = 15


@dataclasses.dataclass
class Outcome:
    kind: str             # result | died | timeout | lost | fault
    data: bytes = b""     # the worker's result (kind result)
    code: int = 0         # died: the exit code, negative for a signal
    said: str = ""        # the last line the worker (or ssh) printed


def _last_line(text: bytes) -> str:
    lines = [ln.strip() for ln in text.decode(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if any(w in ln.lower() for w in ("error", "abort", "fault", "signal", "assert")):
            return ln[:240]
    return lines[-1][:240] if lines else ""


def _judge_exit(code: int, out: bytes, err: bytes) -> Outcome:
    if code == 0:
        return Outcome("result", out)
    if code == WORKER_FAULT:
        return Outcome("fault", said=_last_line(err))
    return Outcome("died", code=code, said=_last_line(err))


def run_qemu(target: Target, build: WorkerBuild, arena: bytes, timeout: float) -> Outcome:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # (qemu's, not the guest's)
    env["GLIBC_TUNABLES"] = TUNABLES
    cmd = [QEMU, "-cpu", target.qemu_cpu(), str(build.path), "-", "-"]
    try:
        proc = subprocess.run(cmd, input=arena, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Outcome("timeout")
    except OSError as exc:
        return Outcome("fault", said=f"{QEMU} cannot be run: {exc}")
    return _judge_exit(proc.returncode, proc.stdout, proc.stderr)


class SshLink:
    """One device's connection for this process: a control master ssh keeps open, the
    device's `uname -m`, and the workers already copied there."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.dir = tempfile.TemporaryDirectory(prefix="sdpa_probe_ssh_")
        self.machine = ""
        self.copied: set[str] = set()

    def command(self, remote: str) -> list[str]:
        extra = shlex.split(os.environ.get(SSH_OPTIONS_ENV, ""))
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_SECONDS}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.dir.name}/%C",
                "-o", "ControlPersist=120", *extra, *self.target.ssh_destination(), remote]

    def run(self, remote: str, stdin: bytes = b"",
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(remote), input=stdin, capture_output=True,
                              timeout=timeout)

    def uname(self) -> str:
        """The device's machine (aarch64, x86_64); ConnectionError if it cannot be reached."""
        if not self.machine:
            try:
                proc = self.run("uname -m", timeout=CONNECT_SECONDS + 15)
            except subprocess.TimeoutExpired:
                raise ConnectionError(f"{self.target.name} did not answer within "
                                      f"{CONNECT_SECONDS + 15} s") from None
            if proc.returncode != 0:
                raise ConnectionError(f"cannot reach {self.target.name}: "
                                      f"{_last_line(proc.stderr) or f'ssh exit {proc.returncode}'}")
            self.machine = proc.stdout.decode().strip()
        return self.machine

    def remote_path(self, build: WorkerBuild) -> str:
        return f"${{TMPDIR:-/tmp}}/sdpa_probe_workers/{build.path.name}"

    def ensure_copied(self, build: WorkerBuild) -> None:
        """The worker on the device (copied once per build: its name is its hash)."""
        if build.path.name in self.copied:
            return
        path = self.remote_path(build)
        script = (f'p="{path}"; test -x "$p" && exit 0; mkdir -p "$(dirname "$p")" && '
                  f'cat > "$p.$$" && chmod 755 "$p.$$" && mv "$p.$$" "$p"')
        proc = self.run(script, build.path.read_bytes(), timeout=300)
        if proc.returncode != 0:
            raise ConnectionError(f"cannot copy the worker to {self.target.name}: "
                                  f"{_last_line(proc.stderr) or f'ssh exit {proc.returncode}'}")
        self.copied.add(build.path.name)

    def run_worker(self, build: WorkerBuild, arena: bytes, timeout: float) -> Outcome:
        path = self.remote_path(build)
        # (the device's own timeout ends a worker whose connection is gone)
        limit = int(timeout) + 5
        script = (f'p="{path}"; export GLIBC_TUNABLES={TUNABLES}; '
                  f'if command -v timeout >/dev/null 2>&1; then timeout -s KILL {limit} "$p" - -; '
                  f'else "$p" - -; fi; echo "{EXIT_MARK}$?" >&2')
        t0 = time.monotonic()
        try:
            proc = self.run(script, arena, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Outcome("timeout")
        err = proc.stderr.decode(errors="replace")
        marks = [ln for ln in err.splitlines() if ln.startswith(EXIT_MARK)]
        if not marks:  # (the shell never said how the worker ended: the link went)
            self.copied.clear()  # (a device rebooted may have lost its /tmp)
            return Outcome("lost", said=_last_line(proc.stderr)
                           or f"ssh exit {proc.returncode} after {time.monotonic() - t0:.1f} s")
        code = int(marks[-1][len(EXIT_MARK):] or 0)
        if code == 137 and time.monotonic() - t0 >= limit:
            return Outcome("timeout")
        if code > 128:  # (the shell's 128 + N for a worker killed by signal N)
            code = -(code - 128)
        stderr = "\n".join(ln for ln in err.splitlines() if not ln.startswith(EXIT_MARK))
        return _judge_exit(code, proc.stdout, stderr.encode())


    def close(self) -> None:
        """The control master ended (it would outlive this process for ControlPersist)."""
        if self.machine or self.copied:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["ssh", "-o", f"ControlPath={self.dir.name}/%C", "-O", "exit",
                                *self.target.ssh_destination()], capture_output=True, timeout=10)
        self.dir.cleanup()


_links: dict[str, SshLink] = {}


def close_links() -> None:
    for link in _links.values():
        link.close()
    _links.clear()


def ssh_link(target: Target) -> SshLink:
    if target.name not in _links:
        if not _links:
            atexit.register(close_links)
        _links[target.name] = SshLink(target)
    return _links[target.name]


def run_worker(target: Target, build: WorkerBuild, arena: bytes, timeout: float) -> Outcome:
    """The worker's outcome on `target` for one arena."""
    if target.kind == "qemu":
        return run_qemu(target, build, arena, timeout)
    link = ssh_link(target)
    try:
        link.ensure_copied(build)
    except (ConnectionError, subprocess.TimeoutExpired) as exc:
        return Outcome("lost", said=str(exc))
    return link.run_worker(build, arena, timeout)
