"""Crashes, hangs, aborts and heap corruption in `probe check`'s worker processes: each a
record naming its cause, the other cases' run going on."""

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import needs_cxx
from kernels_for_tests import SRC, cli_records, write_variant
from typer.testing import CliRunner

from sdpa_probe.cases import Case
from sdpa_probe.check import pool
from sdpa_probe.check.pool import WorkerPool
from sdpa_probe.cli import app
from sdpa_probe.native import load_user_kernel

runner = CliRunner()


def test_crash_and_hang_are_isolated(tmp_path):
    crash = write_variant(tmp_path, "crash",
                           "if (a->kv_len > 1000) { volatile int *p = 0; *p = 1; }")
    hang = write_variant(tmp_path, "hang",
                          "if (a->kv_len == 77) { volatile int x = 1; while (x) {} }")
    names = [str(crash), str(hang)]
    for n in names:
        load_user_kernel(n)
    cases = [Case("iso", kv_len=2000), Case("iso", kv_len=77), Case("iso", kv_len=30)]
    records = []
    WorkerPool(jobs=1, timeout=4.0).run([(c, names) for c in cases], records.append)
    got = {(r["backend"].split("/")[-1], r["case"]): r for r in records}
    assert len(records) == 6
    r = got[("crash.c", cases[0].id)]
    assert r["status"] == "crash" and "SIGSEGV" in r["reason"]
    assert got[("hang.c", cases[0].id)]["status"] == "pass"  # re-queued after the crash
    assert got[("hang.c", cases[1].id)]["status"] == "timeout"
    assert got[("crash.c", cases[1].id)]["status"] == "pass"
    assert got[("crash.c", cases[2].id)]["status"] == "pass"
    assert got[("hang.c", cases[2].id)]["status"] == "pass"


def test_workers_fill_what_a_kernel_mallocs(tmp_path):
    """A kernel that reads scratch it never wrote sees 0x7F bytes in `probe check`'s
    workers (glibc's MALLOC_PERTURB_), not the zeros a fresh heap often holds."""
    k = tmp_path / "uninit.c"
    k.write_text(SRC.replace(
        "for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d]);",
        "float *junk = malloc(64);\n"
        "        for (int64_t d = 0; d < D; d++) store(&a->out, b, i, h, d, acc[d] + junk[1]);\n"
        "        free(junk);"))
    res = runner.invoke(app, ["check", "--kernel", str(k), "-k", "gqa-h8gqa4-q1-kv129-d64-f32",
                              "--json", "-"])
    assert res.exit_code == 1, res.output
    rec = json.loads(res.stdout)["records"][0]
    assert rec["status"] == "fail" and "out 3.39615e+38" in rec["reason"], rec["reason"]


@needs_cxx
def test_cxx_exception_escaping_the_abi_is_a_crash(tmp_path):
    """A C++ kernel that lets an exception out of sdpa_forward: std::terminate aborts its
    worker, and the record says what was thrown; the other kernels' run goes on."""
    recs = list(cli_records(
        tmp_path, "throws.cpp",
        '#include <stdexcept>\n#include "sdpa_probe.h"\n'
        'extern "C" int sdpa_forward(const sdpa_args *a) {\n'
        '  if (a->kv_len > 100) throw std::length_error("kv too long");\n'
        '  return SDPA_UNSUPPORTED;\n}\n', "decode", args=("--suite", "smoke")).values())
    crashed = [r for r in recs if r["status"] == "crash"]
    assert crashed and all("SIGABRT" in r["reason"] and "length_error" in r["reason"]
                           for r in crashed)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="__builtin_trap is ud2 (SIGILL) on x86")
def test_a_sigill_says_what_raises_one(tmp_path):
    """A worker killed by SIGILL: the record names the usual causes, among them AMX
    tiles used before the process asked Linux for their state."""
    src = ('#include "sdpa_probe.h"\n'
           "int sdpa_forward(const sdpa_args *a) { (void)a; __builtin_trap(); }\n")
    (rec,) = cli_records(tmp_path, "trap.c", src, "gqa-h8gqa4-q1-kv129").values()
    assert rec["status"] == "crash", rec
    assert "SIGILL (an instruction this CPU or OS does not allow" in rec["reason"], rec
    assert "arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)" in rec["reason"], rec


@pytest.mark.skipif(pool.malloc_debug_library() is None,
                    reason="no glibc malloc debugging library here")
def test_a_scratch_block_one_float_short_is_caught_by_the_heap_guard(tmp_path):
    """The row accumulator malloc'd one float short, the kind of size slip in a
    per-thread scratch computation ExecuTorch's quantized SDPA review caught by eye.
    glibc rounds a 252-byte request up to a 264-byte chunk, so the write past the end
    lands in slack and nothing else notices: before the workers' heap guard this kernel
    passed every case whose head_dim's row did not end on a chunk boundary (160 of 162,
    all but head_dim 67). The guard byte after the requested size is checked on free."""
    short = SRC.replace("float *acc = malloc((size_t)D * sizeof(float));",
                        "float *acc = malloc((size_t)D * sizeof(float) - sizeof(float));")
    assert short != SRC
    recs = cli_records(tmp_path, "acc_short.c", short, "gqa-h8", args=("--dtype", "f32"))
    caught = [r for r in recs.values()
              if r["status"] == "crash" and "glibc found its heap corrupted" in r["reason"]]
    # (the guard byte's value comes from the block's address; an output float whose low
    # byte equals it, 1 in 256, hides the overwrite for that case)
    assert len(recs) >= 4 and len(caught) >= len(recs) - 1, recs


def test_the_heap_guard_stays_off_under_a_users_preload(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "libasan.so")
    assert pool.malloc_debug_library() is None
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("SDPA_PROBE_NO_MALLOC_CHECK", "1")
    assert pool.malloc_debug_library() is None
    assert pool.explain_heap_abort("free(): invalid pointer")
    assert not pool.explain_heap_abort("Assertion `x' failed.")


def _descendants(pid: int) -> set[int]:
    """Every process below pid (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def _running(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            alive.add(p)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_run_leaves_no_process_behind(tmp_path, sig):
    """probe check killed while a kernel spins: its workers end with it (a parent-death
    signal for SIGKILL; SIGTERM ends the run as an error does), and their logs go."""
    mark = tmp_path / "spinning"
    hang = write_variant(tmp_path, "spin",
                         f'{{ FILE *f = fopen("{mark}", "w"); if (f) fclose(f); '
                         "volatile int x = 1; while (x) {} }")
    hang.write_text("#include <stdio.h>\n" + hang.read_text())
    env = dict(os.environ, TMPDIR=str(tmp_path), SDPA_PROBE_LAST_CHECK=str(tmp_path / "l.json"))
    probe = subprocess.Popen([sys.executable, "-m", "sdpa_probe", "check", "--kernel", str(hang),
                              "-k", "decode-h8gqa4-q1-kv129", "--timeout", "600"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while not mark.exists() and time.monotonic() - t0 < 300 and probe.poll() is None:
            time.sleep(0.2)
        assert mark.exists(), "the kernel never ran"
        below = _descendants(probe.pid)
        assert below
        probe.send_signal(sig)
        probe.wait(30)
        t0 = time.monotonic()
        while _running(below) and time.monotonic() - t0 < 5:
            time.sleep(0.1)
        assert not _running(below)
        if sig == signal.SIGTERM:
            assert probe.returncode == 128 + signal.SIGTERM
            assert not list(tmp_path.glob("sdpa_probe_check_*"))
    finally:
        if probe.poll() is None:
            probe.kill()
