"""Running cases against backends in worker processes, so that a kernel that
crashes, aborts or hangs costs one case, not the run.

A job is one case with the list of backends to run on it: the worker builds
the inputs and the float64 reference once, then runs each backend and sends a
record per backend. If the worker dies, the backend in flight is reported as
`crash` (with the signal) and the rest of the job is re-queued on a fresh
worker; if a backend exceeds its time limit, it is `timeout`. Workers run under
sandbox's environment and limits."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

from .. import sandbox
from ..backends import parse
from ..cases import Case
from ..children import died_in_call, kill_tree, last_words, process_alive, signal_name
from ..invalid_args import describe
from ..records import base_record
from .worker import worker_main


@dataclasses.dataclass
class _Slot:
    proc: mp.Process
    conn: object
    log: str
    ready: bool = False
    case: Case | None = None
    pending: list = dataclasses.field(default_factory=list)
    deadline: float = 0.0


MALLOC_PERTURB = 0x80  # glibc fills a malloc'd block with this ^ 0xFF, freed ones with it


def malloc_debug_library() -> str | None:
    """glibc's malloc debugging library (2.34 on), beside the libc this process runs on:
    with glibc.malloc.check=3 it puts a guard byte right after each block's requested
    size and aborts when a block whose guard was overwritten is freed. None where there
    is none, or LD_PRELOAD is already set (the user's own preload, e.g. a sanitizer,
    stays alone)."""
    if os.environ.get("LD_PRELOAD") or os.environ.get("SDPA_PROBE_NO_MALLOC_CHECK"):
        return None
    try:
        with open("/proc/self/maps") as fh:
            libc = next((ln.split()[-1] for ln in fh if ln.rstrip().endswith("/libc.so.6")),
                        None)
    except OSError:
        return None
    if libc is None:
        return None
    path = os.path.join(os.path.dirname(libc), "libc_malloc_debug.so.0")
    return path if os.path.exists(path) else None


# what glibc prints when it aborts on a corrupted heap (malloc/malloc.c, malloc-check.c)
HEAP_ABORTS = ("free(): invalid", "double free or corruption", "invalid next size",
               "corrupted size vs. prev_size", "corrupted double-linked list",
               "munmap_chunk(): invalid pointer", "realloc(): invalid", "malloc(): ",
               "free(): corrupted", "malloc_consolidate(): ")


def explain_heap_abort(said: str) -> str:
    """A note on glibc's heap-corruption aborts, whose own words do not say what the
    kernel did; empty for anything else."""
    if not any(m in said for m in HEAP_ABORTS):
        return ""
    return (" (glibc found its heap corrupted: a block written past its end (check's "
            "workers guard the byte after each block's requested size), freed twice, or "
            "a pointer freed that malloc did not return)")


LOG_PREFIX = "sdpa_probe_check_"  # + the pid of the run: its workers' logs


def _clean_stale_logdirs() -> None:
    """The worker-log folders of runs that were killed (their pid no longer runs)."""
    for p in Path(tempfile.gettempdir()).glob(f"{LOG_PREFIX}*"):
        pid = p.name[len(LOG_PREFIX):].split("_", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _end_on_sigterm():
    """SIGTERM ends the run as an exception does (exit 143), so that its workers are
    killed on the way out; the previous handler (to put back), or None off the main
    thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def end(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, end)


class WorkerPool:
    """Runs jobs on N worker processes with crash and timeout isolation."""

    def __init__(self, jobs: int = 1, timeout: float = 30.0, setup: dict | None = None,
                 startup_timeout: float = 180.0, fresh_per_job: bool = False):
        self.n = max(1, jobs)
        self.fresh_per_job = fresh_per_job  # a new process for every job (check --isolate)
        self.malloc_debug = malloc_debug_library()  # (looked up once, not per worker)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.setup = setup or {}
        self.ctx = mp.get_context("spawn")
        self.slots: list[_Slot] = []
        _clean_stale_logdirs()
        self.logdir = tempfile.TemporaryDirectory(prefix=f"{LOG_PREFIX}{os.getpid()}_")
        self.n_spawned = 0
        self.limits: sandbox.Limits | None = None  # (run() knows a job's calls)

    def _spawn(self) -> _Slot:
        parent, child = self.ctx.Pipe()
        self.n_spawned += 1
        log = os.path.join(self.logdir.name, f"worker{self.n_spawned}.log")
        setup = {**self.setup, "log": log, "parent": os.getpid(), "limits": self.limits}
        proc = self.ctx.Process(target=worker_main, args=(child, setup), daemon=True)
        # glibc fills every block the worker mallocs with 0x7F bytes (3.4e38 as F32, NaN
        # as F16): a kernel that reads scratch it never wrote gets garbage every time,
        # not what the heap held (often zeros: a pass by luck). Without the per-thread
        # cache, which hands blocks back unfilled.
        tunables = [f"glibc.malloc.perturb={MALLOC_PERTURB}", "glibc.malloc.tcache_count=0"]
        env = {}
        if self.malloc_debug is not None:  # (not over the user's own preload: a sanitizer)
            env["LD_PRELOAD"] = self.malloc_debug
            tunables.append("glibc.malloc.check=3")
        env["GLIBC_TUNABLES"] = ":".join(
            t for t in (os.environ.get("GLIBC_TUNABLES"), *tunables) if t)
        with sandbox.inherited(sandbox.environment(**env)):  # (spawn takes ours)
            proc.start()
        child.close()
        return _Slot(proc, parent, log, deadline=time.monotonic() + self.startup_timeout)

    @staticmethod
    def _kill(slot: _Slot) -> None:
        """The worker, what it started (it reaps its kernels' orphans: a double fork
        with setsid is under it too) and its process group."""
        if slot.proc.pid is not None:
            kill_tree(slot.proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(slot.proc.pid, signal.SIGKILL)  # (its own group: worker_main)
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    def _retire(self, slot: _Slot) -> None:
        """Ask the worker to exit, and kill it if it has not within 2 s."""
        try:
            slot.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        slot.proc.join(2)
        self._kill(slot)

    def run(self, work: list[tuple[Case, list[str]]], on_record, stop=None) -> None:
        """Each (case, backend names) job on the workers; on_record(record) for every
        backend of every job, as it comes; once stop() says so, no job starts (those
        running finish). (Names as the records will carry them: a kernel file's older
        `user:` form is read as the file.)"""
        queue = collections.deque((case, [parse(n).name for n in names]) for case, names in work)
        # a job's calls: building the case, then each backend
        self.limits = sandbox.limits(self.n, self.timeout,
                                     1 + max((len(names) for _, names in queue), default=1))
        self.slots = [self._spawn() for _ in range(min(self.n, len(queue)) or 1)]
        on_term = _end_on_sigterm()
        try:
            self._drive(queue, on_record, stop)
        finally:
            for s in self.slots:
                self._retire(s)
            self.logdir.cleanup()
            if on_term is not None:
                signal.signal(signal.SIGTERM, on_term)

    def _drive(self, queue: collections.deque, on_record, stop=None) -> None:
        """The queue's jobs on the slots' workers until none is queued or running: each
        sent to an idle worker, its records passed on, a dead or late worker's job judged
        and the worker replaced (run's workers, or a LivePool's kept open)."""
        while queue or any(s.case is not None for s in self.slots):
            if stop is not None and stop():
                queue.clear()
                if not any(s.case is not None for s in self.slots):
                    break  # (else the wait below would sit out an idle deadline)
            for s in self.slots:
                if s.ready and s.case is None and queue:
                    case, names = queue.popleft()
                    s.case, s.pending = case, list(names)
                    s.deadline = time.monotonic() + self.timeout
                    s.conn.send((case.params(), names))
            now = time.monotonic()
            wait_for = max(0.01, min(s.deadline for s in self.slots) - now)
            ready = wait([s.conn for s in self.slots] + [s.proc.sentinel for s in self.slots],
                         timeout=wait_for)
            for i, s in enumerate(list(self.slots)):
                if s.conn in ready or s.proc.sentinel in ready:
                    self.slots[i] = self._service(s, queue, on_record)
            now = time.monotonic()
            for i, s in enumerate(list(self.slots)):
                if now > s.deadline and (s.case is not None or not s.ready):
                    self.slots[i] = self._expire(s, queue, on_record)

    def _service(self, s: _Slot, queue, on_record) -> _Slot:
        try:
            finished = worn = False  # (a job, in this call; its worker's CPU time spent)
            while s.conn.poll():
                msg = s.conn.recv()
                if msg[0] == "ready":
                    s.ready = True
                elif msg[0] == "rec":
                    rec = msg[1]
                    if s.pending and s.pending[0] == rec.backend:
                        s.pending.pop(0)
                    on_record(rec)
                    s.deadline = time.monotonic() + self.timeout
                elif msg[0] == "done":
                    s.case, s.pending, finished = None, [], True
                    worn = len(msg) > 1 and msg[1]
                    if self.fresh_per_job or worn:
                        break
            if (self.fresh_per_job or worn) and finished:
                self._retire(s)
                return self._spawn()
            return s
        except (EOFError, OSError):
            pass
        # the worker died
        s.proc.join(5)
        why = died_in_call(s.proc.exitcode) if s.pending else signal_name(s.proc.exitcode)
        why += sandbox.death_note(s.proc.exitcode, self.limits)
        said = last_words(s.log)
        if said:
            why += (f"; it printed: {said}{explain_heap_abort(said)}"
                    f"{sandbox.memory_note(said, self.limits)}")
            why += sandbox.output_note(s.log, self.limits)
        if s.case is not None and s.pending:
            on = ""
            if s.case.invalid:  # (the call it died in was one it should have refused)

                on = f" on an invalid call ({describe(s.case.invalid)}), not refused"
            return self._replace(s, queue, on_record, status="crash",
                                 reason=f"worker process died{on}: {why}")
        if not s.ready:
            raise RuntimeError(f"a check worker failed to start ({why})")
        self._kill(s)
        return self._spawn()

    def _expire(self, s: _Slot, queue, on_record) -> _Slot:
        if not s.ready:
            self._kill(s)
            raise RuntimeError("a check worker did not start in time")
        return self._replace(s, queue, on_record, status="timeout",
                             reason=f"no result within {self.timeout:g} s", seconds=self.timeout)

    def _replace(self, s: _Slot, queue, on_record, **outcome) -> _Slot:
        """Record the backend in flight with this outcome, re-queue the rest of its job
        and put a fresh worker in the slot."""
        rec = base_record(s.pending[0], s.case)
        rec.update(**outcome)
        on_record(rec)
        if s.pending[1:]:
            queue.appendleft((s.case, s.pending[1:]))
        self._kill(s)
        return self._spawn()
