"""What the processes that call a kernel apart from the run (check's workers, a trial
call, the allocation counter) get: the caller's environment through an allow-list (and
what --pass-env adds), resource limits set before any kernel runs (memory, CPU time,
processes, the size of a file: what a kernel prints), how many workers a machine takes,
and why a limit ended one, in words. docs/reliability.md says what this does not
guarantee: a kernel is native code running as the user."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time

try:
    import resource
except ImportError:  # (not on every platform)
    resource = None

from .errors import ProbeError
from .libc import prctl

# The caller's environment a kernel's process gets: what the system, the compilers, the
# threading and math libraries, glibc's allocator, sanitizers and Python (the package's
# imports in a venv or a checkout) read; probe's own SDPA_PROBE_*. Anything else (a
# token, a cloud key) only by --pass-env.
ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TMP", "TEMP",
    "XDG_CACHE_HOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "GLIBC_TUNABLES",
    "CC", "CXX", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
    "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS", "MSAN_OPTIONS",
    "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONUTF8",
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "VIRTUAL_ENV",
    "CONDA_PREFIX",
})
ENV_PREFIXES = ("LC_", "SDPA_PROBE_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "BLIS_",
                "DNNL_", "ONEDNN_", "ATEN_", "TORCH_", "MALLOC_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_passed: dict[str, str | None] = {}  # --pass-env: a name (the caller's value) or its value

MEMORY_ENV = "SDPA_PROBE_WORKER_MEMORY"  # bytes (4G, 512M) of writable memory, or none
CPU_ENV = "SDPA_PROBE_WORKER_CPU"        # CPU seconds per call, or none
MIN_MEMORY = 2 << 30   # the default's floor, whatever the machine and -j
OUTPUT_CAP = 16 << 20  # bytes of a kernel's process's any one file: its log, what it prints
OUTPUT_SLACK = 64 << 10  # (above the cap, for the harness's own words after a flood)
PROCESS_ROOM = 1024    # processes and threads a worker's user may start beyond what it runs
CPU_SLACK = 10.0       # CPU seconds a call may use beyond timeout x cores
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def parse_pass_env(values) -> dict[str, str | None]:
    """--pass-env NAME (the caller's value, if it has one) or NAME=VALUE (that value)."""
    out: dict[str, str | None] = {}
    for given in values or ():
        name, eq, value = given.partition("=")
        if not _NAME.match(name):
            raise ProbeError(f"--pass-env {given!r}: not an environment variable's name "
                             "(NAME or NAME=VALUE)")
        out[name] = value if eq else None
    return out


def pass_env(values) -> None:
    """What every kernel's process of this command gets beyond the allow-list."""
    global _passed
    _passed = parse_pass_env(values)


def environment(**extra: str) -> dict[str, str]:
    """The environment of a process that calls a kernel: the allow-listed part of ours,
    what --pass-env adds, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    for name, value in _passed.items():
        if value is not None:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    env.update(extra)
    return env


@contextlib.contextmanager
def inherited(env: dict[str, str]):
    """This process's environment is `env` for the time of a start that takes it from
    here (multiprocessing's spawn passes no environment of its own)."""
    saved = dict(os.environ)
    for k in set(saved) - set(env):
        del os.environ[k]
    os.environ.update(env)
    try:
        yield
    finally:
        for k in set(os.environ) - set(saved):
            del os.environ[k]
        os.environ.update(saved)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # (not Linux)
        return max(1, os.cpu_count() or 1)


def meminfo(field: str) -> int | None:
    """A /proc/meminfo figure (MemTotal, MemAvailable) in bytes; None without it."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident_bytes() -> int | None:
    """This process's resident size (VmRSS)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def plan_jobs(jobs: int, force: bool = False) -> tuple[int, list[str]]:
    """-j as it will run, and what to say about it: more workers than usable cores only
    slow each other (and time out), so -j is capped there unless forced; and a note when
    that many workers, each about the size of this process (torch loaded, as in a
    worker), would not fit in the memory available."""
    notes = []
    cores = usable_cores()
    if jobs > cores and not force:
        notes.append(f"-j {jobs}: capped at the {cores} usable core{'s' * (cores > 1)} "
                     f"(--force-jobs runs {jobs})")
        jobs = cores
    each, free = resident_bytes(), meminfo("MemAvailable")
    if each and free and jobs * each > free:
        notes.append(f"{jobs} workers of about {gib(each)} each (this process's resident "
                     f"size, torch loaded as in a worker) exceed the {gib(free)} of memory "
                     "available: expect swapping or the out-of-memory killer; a lower -j")
    return jobs, notes


def _size(text: str) -> int | None:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    if t in ("NONE", "0", "UNLIMITED"):
        return None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    number = t[:-1] if scale > 1 else t
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not value > 0 or value * scale < 1 << 20:
        raise ProbeError(f"${MEMORY_ENV} {text!r}: a size of at least 1M, such as 4G or "
                         "512M, or none")
    return int(value * scale)


def _seconds(text: str) -> float | None:
    if text.strip().lower() in ("none", "0", "unlimited"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e7:
        raise ProbeError(f"${CPU_ENV} {text!r}: CPU seconds per call (e.g. 120), or none")
    return value


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a kernel's process runs under: `memory` bytes of writable private memory
    (RLIMIT_DATA), `cpu` CPU seconds per call (RLIMIT_CPU's soft limit, moved on before
    each; its hard limit `calls` of them twice over: the process's life), `output`
    bytes of any one file it writes (RLIMIT_FSIZE), processes as PROCESS_ROOM says."""

    memory: int | None
    cpu: float | None
    calls: int = 1
    output: int = OUTPUT_CAP

    @property
    def memory_words(self) -> str:
        return (f"the {gib(self.memory)} of writable memory a kernel's process may use "
                f"(${MEMORY_ENV} sets it)") if self.memory else ""


def limits(jobs: int, timeout: float, calls: int = 1) -> Limits:
    """The limits of `jobs` processes that run at once, each call within `timeout`
    seconds: memory, the machine's (writable mappings reserved, not used: the `far`
    layout reserves 8 GiB and touches a few pages of it, and jobs seldom all peak at
    once), at least MIN_MEMORY;
    CPU, what the timeout allows on every usable core and CPU_SLACK. $SDPA_PROBE_WORKER_*
    overrides them."""
    if MEMORY_ENV in os.environ:
        memory = _size(os.environ[MEMORY_ENV])
    else:
        total = meminfo("MemTotal")
        memory = max(total, MIN_MEMORY) if total else None
    cpu = (_seconds(os.environ[CPU_ENV]) if CPU_ENV in os.environ
           else timeout * usable_cores() + CPU_SLACK)
    return Limits(memory, cpu, max(1, calls))


def _cpu_used() -> float:
    return time.process_time()


def _set(which: str, soft: int, hard: int) -> None:
    """setrlimit, never above what holds already (a limit the user set stays)."""
    res = getattr(resource, which)
    cur_soft, cur_hard = resource.getrlimit(res)
    if cur_hard != resource.RLIM_INFINITY:
        hard = min(hard, cur_hard)
    soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(res, (soft, hard))


def _user_tasks() -> int:
    """Processes and threads of this real user now (what RLIMIT_NPROC counts)."""
    uid, n = str(os.getuid()), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(ln.split(":", 1) for ln in fh if ":" in ln)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            n += int(fields.get("Threads", "1").strip() or 1)
    return n


def confine(lim: Limits, parent: int | None = None) -> None:
    """In a process about to call kernels: the limits set (a process it starts inherits
    them); it becomes the reaper of whatever its kernels' processes leave (a double fork
    with setsid stays its descendant, found and killed with it); with `parent`, it is
    SIGKILLed when that process ends."""
    if parent is not None:
        prctl(PR_SET_PDEATHSIG, 9)
        if os.getppid() != parent:
            os._exit(1)  # (the caller ended while this process started)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if resource is None:
        return
    _set("RLIMIT_FSIZE", lim.output, lim.output + OUTPUT_SLACK)
    if lim.memory:
        _set("RLIMIT_DATA", lim.memory, lim.memory)
    with contextlib.suppress(OSError):
        # (root is not held by it: the fork check in caller_processes still is)
        room = _user_tasks() + PROCESS_ROOM
        _set("RLIMIT_NPROC", room, room)
    if lim.cpu:
        used = _cpu_used()
        _set("RLIMIT_CPU", int(used + lim.cpu) + 1, int(used + 2 * lim.cpu * lim.calls) + 1)


def allow_cpu(lim: Limits) -> None:
    """A call's CPU seconds from now (the soft limit moved on, up to the hard one)."""
    if lim.cpu and resource is not None:
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        want = int(_cpu_used() + lim.cpu) + 1
        if soft != want:
            _set("RLIMIT_CPU", want if hard == resource.RLIM_INFINITY else min(want, hard), hard)


def worn_out(lim: Limits) -> bool:
    """Whether this process has too little CPU time left under its hard limit for
    another job of `calls` calls (its caller starts a fresh one)."""
    if not lim.cpu or resource is None:
        return False
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    return hard != resource.RLIM_INFINITY and _cpu_used() + lim.cpu * lim.calls >= hard


def output_unlimited() -> None:
    """The output cap lifted to its slack, for the harness's own last words."""
    if resource is not None:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        _set("RLIMIT_FSIZE", hard, hard)


def fresh_log(path: str) -> None:
    """A worker's log emptied for the next job: the output cap is per job, and what a
    dead worker printed is about the job it died in."""
    with contextlib.suppress(OSError):
        os.truncate(path, 0)


_MEMORY_WORDS = ("cannot allocate memory", "can't allocate memory", "bad_alloc",
                 "out of memory", "memoryerror", "enomem", "failed to allocate")


def memory_note(text: str, lim: Limits | None) -> str:
    """A note on a failure whose words say memory ran out, naming the memory limit."""
    if lim is None or not lim.memory or not any(w in text.lower() for w in _MEMORY_WORDS):
        return ""
    return f" (limited to {lim.memory_words})"


def death_note(code: int | None, lim: Limits | None) -> str:
    """A note on a worker's death by a signal probe did not send: a limit's."""
    if lim is None or code is None:
        return ""
    if code == -9:
        cpu = f"the CPU time limit ({lim.cpu:g} s a call, ${CPU_ENV}) or " if lim.cpu else ""
        return f" (not sent by probe: {cpu}the system's out-of-memory killer)"
    if code == -24 and lim.cpu:  # SIGXCPU
        return f" (its CPU time limit: {lim.cpu:g} s a call, ${CPU_ENV} sets it)"
    return ""


def output_note(log: str, lim: Limits | None) -> str:
    """A note when what a process printed reached the output cap and was cut."""
    try:
        size = os.path.getsize(log)
    except OSError:
        return ""
    if lim is None or size < lim.output:
        return ""
    return (f"; what it printed was cut at {lim.output >> 20} MiB (the rest is not kept: "
            "the last line shown is where it was cut)")
