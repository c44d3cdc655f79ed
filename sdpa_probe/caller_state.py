"""What a kernel call must leave as it found it in its caller, beyond the floating-point
environment (native.fp_control): the calling thread's CPU affinity, blocked signals,
scheduling, name and locale, and the process's signal handlers, locale, working
directory, umask, resource limits, interval timers and environment
(native/src/caller_state.c), its child processes and fds 0-2 (caller_processes).
`probe check` reads it around every call (verdict layer 2):
a runtime calls SDPA from its own thread per layer per token, so a kernel that pins that
thread to one CPU, blocks its SIGINT or sets OMP_NUM_THREADS changes the program around it
while its output is right."""

from __future__ import annotations

import dataclasses
import os
import signal

try:
    import resource
except ImportError:  # (not on every platform)
    resource = None

from . import caller_processes
from .native import describe_fp_change, fp_control, native_lib, set_fp_control

# glibc sets it on every handler it installs (the kernel's default reads without it)
SA_RESTORER = 0x04000000
ENV_TEXT_CAP = 1 << 16  # bytes first tried for the environment's text
_SHOWN = 60  # characters of a value shown in a description


@dataclasses.dataclass
class CallerState:
    raw: object  # sdpa_probe_caller_state (cffi)
    env: dict[str, str]
    processes: caller_processes.ProcessState


def _environ() -> dict[str, str]:
    ffi, lib = native_lib()[:2]
    cap = ENV_TEXT_CAP
    while True:
        buf = ffi.new("char[]", cap)
        need = int(lib.sdpa_probe_environ_text(buf, cap))
        if need <= cap:
            break
        cap = need + 4096  # (grown since: try again with room)
    env = {}
    for item in ffi.buffer(buf, need)[:].split(b"\0"):
        if item:
            name, _, value = item.decode("utf-8", "replace").partition("=")
            env[name] = value
    return env


def die_with_parent(parent_pid: int) -> int:
    """This process is SIGKILLed when parent_pid ends, however it ends (a worker whose
    run was killed does not spin on); 0, 1 if the parent has gone already, -1 where the
    system cannot do it."""
    return int(native_lib()[1].sdpa_probe_die_with_parent(parent_pid))


def read() -> CallerState:
    ffi, lib = native_lib()[:2]
    raw = ffi.new("sdpa_probe_caller_state *")
    lib.sdpa_probe_caller_state_read(raw)
    return CallerState(raw, _environ(), caller_processes.read())


def restore(before: CallerState, now: CallerState) -> None:
    """Puts back what the call changed, so that the cases after (and the oracle) run in
    the state they expect; a timer the call armed is disarmed."""
    ffi, lib = native_lib()[:2]
    lib.sdpa_probe_caller_state_restore(before.raw, now.raw)
    caller_processes.restore(before.processes, now.processes)
    for name in now.env.keys() - before.env.keys():
        lib.sdpa_probe_environ_put(name.encode(), ffi.NULL)
    for name, value in before.env.items():
        if now.env.get(name) != value:
            lib.sdpa_probe_environ_put(name.encode(), value.encode())


def left_changed(before: CallerState) -> list[str]:
    """What a call made since `before` was read left changed (changes()), put back."""
    now = read()
    found = changes(before, now)
    if found:
        restore(before, now)
    return found


class Guard:
    """The caller as it was when made, the floating-point environment included, for the
    commands that time kernels rather than judge them (probe bench, probe profile):
    put_back(who) restores what a call since changed, says what that was, and keeps the
    first such changes of each `who` in `left` (if given: who -> the changes)."""

    def __init__(self, left: dict[str, list[str]] | None = None) -> None:
        self.state, self.fp, self.left = read(), fp_control(), left

    def put_back(self, who: str | None = None) -> list[str]:
        changed = left_changed(self.state)
        fp = fp_control()
        if fp != self.fp:
            changed.append("the floating-point environment: " + describe_fp_change(self.fp, fp))
            set_fp_control(self.fp)
        if changed and who is not None and self.left is not None:
            self.left.setdefault(who, changed)
        return changed


def _short(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        rtmin = getattr(signal, "SIGRTMIN", 0)
        return f"SIGRTMIN+{sig - rtmin}" if rtmin and sig > rtmin else f"signal {sig}"


def _signals(bits: int) -> str:
    return ", ".join(_signal_name(s) for s in range(1, 65) if bits >> (s - 1) & 1)


def _cpus(words) -> str:
    cpus = [c for c in range(len(words) * 64) if words[c // 64] >> (c % 64) & 1]
    runs, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            runs.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(runs) or "none"


def _policy(p: int) -> str:
    names = {getattr(os, n, None): n for n in
             ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_IDLE")}
    return names.get(p, f"policy {p}")


def _rlimit_names() -> dict[int, str]:
    if resource is None:
        return {}
    names: dict[int, str] = {}
    for n in sorted(dir(resource)):  # (RLIMIT_NOFILE before its alias RLIMIT_OFILE)
        if n.startswith("RLIMIT_"):
            names.setdefault(getattr(resource, n), n)
    return names


def _limit(v: int) -> str:
    return "unlimited" if v < 0 else f"{v:,}"


def _handler(addr: int) -> str:
    return {0: "default", 1: "ignored"}.get(addr, "a handler")


_TIMERS = (("ITIMER_REAL", "SIGALRM"), ("ITIMER_VIRTUAL", "SIGVTALRM"), ("ITIMER_PROF", "SIGPROF"))


def changes(before: CallerState, now: CallerState) -> list[str]:
    """What differs, in words, one item per part (empty: left as it was)."""
    b, n = before.raw, now.raw
    out = []
    if b.cpus_known and n.cpus_known and list(b.cpus) != list(n.cpus):
        out.append(f"the calling thread's CPU affinity {_cpus(b.cpus)} -> {_cpus(n.cpus)}")
    if b.blocked_known and n.blocked_known and b.blocked != n.blocked:
        added, removed = n.blocked & ~b.blocked, b.blocked & ~n.blocked
        if added:
            out.append(f"signals blocked on the calling thread: {_signals(added)}")
        if removed:
            out.append(f"signals unblocked on the calling thread: {_signals(removed)}")
    if (b.policy, b.priority) != (n.policy, n.priority):
        out.append(f"the calling thread's scheduling {_policy(b.policy)} (priority {b.priority})"
                   f" -> {_policy(n.policy)} (priority {n.priority})")
    if b.nice != n.nice:
        out.append(f"the calling thread's nice value {b.nice} -> {n.nice}")
    bname, nname = _text(b.name), _text(n.name)
    if bname != nname:
        out.append(f"the calling thread's name {_short(bname)} -> {_short(nname)}")
    if b.thread_locale != n.thread_locale:
        out.append("the calling thread's locale (uselocale)")
    for sig in range(1, 65):
        if not (b.handler_known[sig] and n.handler_known[sig]):
            continue
        if b.handler[sig] != n.handler[sig]:
            was, now_ = _handler(b.handler[sig]), _handler(n.handler[sig])
            what = "replaced" if was == now_ else f"{was} -> {now_}"
            out.append(f"the {_signal_name(sig)} handler {what}")
        elif (b.handler_flags[sig] ^ n.handler_flags[sig]) & ~SA_RESTORER:
            out.append(f"the {_signal_name(sig)} handler's flags {b.handler_flags[sig]:#x} -> "
                       f"{n.handler_flags[sig]:#x}")
    bl, nl = _locale(_text(b.locale)), _locale(_text(n.locale))
    for cat in sorted(bl.keys() | nl.keys()):
        if bl.get(cat) != nl.get(cat):
            out.append(f"the locale's {cat} {_short(bl.get(cat, '?'))} -> "
                       f"{_short(nl.get(cat, '?'))}")
    bc, nc = _text(b.cwd), _text(n.cwd)
    if bc and bc != nc:
        out.append(f"the working directory {_short(bc)} -> {_short(nc)}")
    if b.umask >= 0 and b.umask != n.umask:
        out.append(f"the umask {b.umask:03o} -> {n.umask:03o}")
    names = _rlimit_names()
    for r in range(min(b.n_rlimits, n.n_rlimits)):
        if (b.rlim_cur[r], b.rlim_max[r]) != (n.rlim_cur[r], n.rlim_max[r]):
            out.append(f"the resource limit {names.get(r, r)} {_limit(b.rlim_cur[r])} / "
                       f"{_limit(b.rlim_max[r])} -> {_limit(n.rlim_cur[r])} / "
                       f"{_limit(n.rlim_max[r])}")
    for t, (timer, sig) in enumerate(_TIMERS):
        if not b.timer_value_us[t] and n.timer_value_us[t]:
            every = (f", then every {n.timer_interval_us[t] / 1000:g} ms"
                     if n.timer_interval_us[t] else "")
            out.append(f"an interval timer armed ({timer}: {sig} in "
                       f"{n.timer_value_us[t] / 1000:g} ms{every})")
    for name in sorted(before.env.keys() | now.env.keys()):
        was, is_ = before.env.get(name), now.env.get(name)
        if was == is_:
            continue
        if was is None:
            out.append(f"the environment variable {name} set to {_short(is_)}")
        elif is_ is None:
            out.append(f"the environment variable {name} unset (was {_short(was)})")
        else:
            out.append(f"the environment variable {name} {_short(was)} -> {_short(is_)}")
    return out + caller_processes.changes(before.processes, now.processes)


def _locale(text: str) -> dict[str, str]:
    """setlocale(LC_ALL, NULL)'s answer by category: one name for all, or glibc's
    'LC_CTYPE=...;LC_NUMERIC=...;...' when they differ."""
    if "=" not in text:
        return {"LC_ALL": text}
    return dict(part.partition("=")[::2] for part in text.split(";") if part)


def _text(chars) -> str:
    return native_lib()[0].string(chars).decode("utf-8", "replace")
