"""The processes that call a kernel apart from the run: an allow-listed environment
(--pass-env for more), resource limits set before any kernel runs (memory, CPU time,
the size of what it prints), the orphans of a double fork reaped, -j capped at the
usable cores, and a build's compilers ending with it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from kernels_for_tests import write_variant
from typer.testing import CliRunner

from sdpa_probe import sandbox
from sdpa_probe.cases import Case
from sdpa_probe.check.pool import WorkerPool
from sdpa_probe.children import last_words
from sdpa_probe.cli import app
from sdpa_probe.errors import ProbeError
from sdpa_probe.native import load_user_kernel
from sdpa_probe.trial_call import trial_call

runner = CliRunner()
SECRET = "SDPA_SANDBOX_TEST_SECRET"  # (not SDPA_PROBE_*: those are let through)
ONE_CASE = "decode-h8gqa4-q1-kv300-d64-f32-causal200"

# A kernel whose behaviour the case's kv_len picks; $SDPA_PROBE_TEST_DIR (let through:
# SDPA_PROBE_*) is where it writes what the test reads.
MISBEHAVIOURS = r"""
  const char *dir_ = getenv("SDPA_PROBE_TEST_DIR");
  char path_[4096];
  if (a->kv_len == 300 && getenv("SDPA_SANDBOX_TEST_SECRET")) return SDPA_UNSUPPORTED;
  if (a->kv_len == 11) {  /* what it was given: a secret, its limits */
    snprintf(path_, sizeof path_, "%s/seen.txt", dir_);
    FILE *f_ = fopen(path_, "w");
    struct rlimit r_;
    fprintf(f_, "secret %d\n", getenv("SDPA_SANDBOX_TEST_SECRET") != NULL);
    int res_[4] = {RLIMIT_DATA, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC};
    const char *names_[4] = {"data", "cpu", "fsize", "nproc"};
    for (int i_ = 0; i_ < 4; i_++) {
      getrlimit(res_[i_], &r_);
      fprintf(f_, "%s %d\n", names_[i_], r_.rlim_max != RLIM_INFINITY);
    }
    fclose(f_);
  }
  if (a->kv_len == 12) {  /* a sleeper in a session of its own, by a double fork */
    pid_t c_ = fork();
    if (c_ == 0) {
      if (fork() == 0) {
        setsid();
        snprintf(path_, sizeof path_, "%s/sleeper.pid", dir_);
        FILE *f_ = fopen(path_, "w");
        fprintf(f_, "%d\n", (int)getpid());
        fclose(f_);
        for (;;) pause();
      }
      _exit(0);
    }
    waitpid(c_, NULL, 0);
    for (int t_ = 0; t_ < 500; t_++) {  /* until the sleeper is there */
      snprintf(path_, sizeof path_, "%s/sleeper.pid", dir_);
      if (access(path_, F_OK) == 0) break;
      usleep(10000);
    }
    usleep(100000);
  }
  if (a->kv_len == 13) {  /* 48 MiB printed: its log must stay at the cap */
    static char line_[1 << 20];
    memset(line_, 'x', sizeof line_);
    line_[sizeof line_ - 1] = '\n';
    for (int i_ = 0; i_ < 48; i_++) (void)!write(1, line_, sizeof line_);
    struct stat st_;
    fstat(1, &st_);
    if (st_.st_size > (17 << 20)) { volatile int *z_ = 0; *z_ = 1; }
  }
  if (a->kv_len == 14) {  /* 30 GiB mapped, 1 GiB at a time */
    for (int i_ = 0; i_ < 30; i_++) {
      void *p_ = mmap(NULL, 1ull << 30, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p_ == MAP_FAILED) { perror("mmap of 1 GiB"); abort(); }
    }
  }
  if (a->kv_len == 15) {  /* every signal blocked, spinning */
    sigset_t all_;
    sigfillset(&all_);
    pthread_sigmask(SIG_BLOCK, &all_, NULL);
    for (volatile int x_ = 1; x_;) {}
  }
"""
HEADERS = ("#define _GNU_SOURCE\n#include <signal.h>\n#include <stdio.h>\n#include <sys/mman.h>\n"
           "#include <sys/resource.h>\n#include <sys/stat.h>\n#include <sys/wait.h>\n"
           "#include <unistd.h>\n#include <pthread.h>\n")


@pytest.fixture(autouse=True)
def _nothing_passed_after():
    """--pass-env is set per command, for the process: none is left to later tests."""
    yield
    sandbox.pass_env([])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sandbox")
    path = write_variant(tmp, "misbehaves", MISBEHAVIOURS)
    path.write_text(HEADERS + path.read_text())
    load_user_kernel(path)
    return path


@pytest.fixture(scope="module")
def misbehaved(kernel):
    """The records of one worker pool run on the kernel's five behaviours, with the
    secret in this process's environment, 4 GiB of memory and 1 CPU second a call."""
    path, tmp = kernel, kernel.parent
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET, "hunter2")
        mp.setenv("SDPA_PROBE_TEST_DIR", str(tmp))
        mp.setenv(sandbox.MEMORY_ENV, "4G")
        mp.setenv(sandbox.CPU_ENV, "1")
        sandbox.pass_env([])
        records = []
        # (one worker: two start no faster on two cores; a crash's replacement runs the
        # next case, none is started only to be stopped)
        WorkerPool(jobs=1, timeout=120).run(
            [(Case("sandbox", kv_len=n), [str(path)]) for n in (12, 13, 14, 15, 11)],
            records.append)
    return {r["case"].split("-kv")[1].split("-")[0]: r for r in records}, tmp


def test_a_worker_gets_no_secret_and_runs_under_limits(misbehaved):
    recs, tmp = misbehaved
    assert recs["11"]["status"] == "pass", recs["11"]["reason"]
    seen = dict(ln.split() for ln in (tmp / "seen.txt").read_text().splitlines())
    assert seen == {"secret": "0", "data": "1", "cpu": "1", "fsize": "1", "nproc": "1"}


def test_a_double_forked_sleeper_is_reaped(misbehaved):
    recs, tmp = misbehaved
    assert recs["12"]["status"] == "fail" and "child process" in recs["12"]["reason"]
    assert not _alive(int((tmp / "sleeper.pid").read_text()))


def test_what_a_kernel_prints_is_capped(misbehaved):
    """(The kernel faults if its 48 MiB reached its log.)"""
    r = misbehaved[0]["13"]
    assert r["status"] == "pass", r["reason"]


def test_a_log_cut_at_the_cap_is_said(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text("started\n" + "x" * (sandbox.OUTPUT_CAP - 8))
    note = sandbox.output_note(str(log), sandbox.Limits(None, None))
    assert "cut at 16 MiB" in note
    assert last_words(str(log)) == "x" * 240
    log.write_text("Assertion failed\n")
    assert sandbox.output_note(str(log), sandbox.Limits(None, None)) == ""


def test_a_kernel_over_the_memory_limit_is_told_so(misbehaved):
    r = misbehaved[0]["14"]
    assert r["status"] == "crash" and "Cannot allocate memory" in r["reason"], r["reason"]
    assert "4.0 GiB of writable memory" in r["reason"]


def test_cpu_time_ends_a_kernel_that_blocks_signals(misbehaved):
    r = misbehaved[0]["15"]  # (the pool's own timeout: 120 s)
    assert r["status"] == "crash" and "CPU time limit" in r["reason"], r["reason"]


def test_pass_env_gives_the_secret_and_j_is_capped(kernel, monkeypatch):
    """(The kernel takes no kv_len 300 case when it sees the secret.)"""
    monkeypatch.setenv(SECRET, "hunter2")
    jobs = sandbox.usable_cores() + 3
    res = runner.invoke(app, ["check", "--kernel", str(kernel), "-k", ONE_CASE, "--json", "-",
                              "-j", str(jobs), "--pass-env", SECRET])
    assert res.exit_code == 0, res.output
    assert f"-j {jobs}: capped at the {sandbox.usable_cores()} usable core" in res.stderr
    assert json.loads(res.stdout)["records"][0]["status"] == "unsupported"


@pytest.mark.parametrize("command", ["check", "run", "bench", "profile"])
def test_a_bad_pass_env_name_is_one_line(command):
    res = runner.invoke(app, [command, "--pass-env", "1BAD=x"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: --pass-env '1BAD=x': not an environment variable's name (NAME or NAME=VALUE)"]


def test_pass_env_forms_and_bad_limits():
    assert sandbox.parse_pass_env(["A", "B=x=y", "C="]) == {"A": None, "B": "x=y", "C": ""}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(sandbox.MEMORY_ENV, "lots")
        with pytest.raises(ProbeError, match="SDPA_PROBE_WORKER_MEMORY 'lots'"):
            sandbox.limits(1, 60)
        mp.setenv(sandbox.MEMORY_ENV, "512M")
        mp.setenv(sandbox.CPU_ENV, "-1")
        with pytest.raises(ProbeError, match="SDPA_PROBE_WORKER_CPU '-1'"):
            sandbox.limits(1, 60)


def test_a_trial_call_gets_no_secret_and_a_capped_output(tmp_path, monkeypatch):
    """bench's and profile's trial child: a kernel that aborts when it sees the secret,
    and faults when its 48 MiB of output reached the file, lived through its call."""
    k = write_variant(tmp_path, "trial", r"""
      if (getenv("SDPA_SANDBOX_TEST_SECRET")) abort();
      static char line_[1 << 20];
      memset(line_, 'x', sizeof line_);
      for (int i_ = 0; i_ < 48; i_++) (void)!write(1, line_, sizeof line_);
      struct stat st_;
      fstat(1, &st_);
      if (st_.st_size > (17 << 20)) { volatile int *z_ = 0; *z_ = 1; }""")
    k.write_text("#define _GNU_SOURCE\n#include <stdlib.h>\n#include <unistd.h>\n"
                 "#include <sys/stat.h>\n" + k.read_text())
    monkeypatch.setenv(SECRET, "hunter2")
    sandbox.pass_env([])
    shape = {"kind": "decode", "n_heads": 4, "n_kv_heads": 4, "head_dim": 64, "q_len": 1,
             "kv_len": 64, "causal": False, "dtype": "f32"}
    assert trial_call(load_user_kernel(k).build, shape, 1) is None


FAKE_CC = """#!/bin/sh
[ "$1" = --version ] && { echo "fakecc 1"; exit 0; }
sleep 300 &
echo $$ $! >> "{pids}"
wait
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_build_s_compiler_dies_with_it(tmp_path, sig):
    """A build whose compiler hangs, ended by a signal: neither the compiler nor what it
    started outlives it."""
    pids = tmp_path / "pids"
    cc = tmp_path / "fakecc"
    cc.write_text(FAKE_CC.replace("{pids}", str(pids)))
    cc.chmod(0o755)
    (tmp_path / "k.c").write_text("int sdpa_forward(void) { return 0; }\n")
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from pathlib import Path; from sdpa_probe import build, native; "
            f"build.build(native.user_kernel_spec(Path({str(tmp_path / 'k.c')!r})), "
            f"cc={str(cc)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code],
                            env={**os.environ, "SDPA_PROBE_CACHE": str(tmp_path / "cache")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if pids.exists() and len(pids.read_text().split()) == 2:
                break
            time.sleep(0.05)
        started = [int(p) for p in pids.read_text().split()]
        assert all(_alive(p) for p in started)
        proc.send_signal(sig)
        proc.wait(10)
        end = time.monotonic() + 5
        while time.monotonic() < end and any(_alive(p) for p in started):
            time.sleep(0.05)
        assert not [p for p in started if _alive(p)]
    finally:
        proc.kill()
        proc.wait()
