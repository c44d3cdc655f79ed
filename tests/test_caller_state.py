"""A kernel must leave its caller's thread and process as it found them (verdict layer 2,
sdpa_probe/caller_state.py): copies of the example kernel that each change one part
fail with it named, the harness puts it back, and one that restores what it changed
passes."""

import json
import locale
import os
import signal

import pytest
from conftest import EXAMPLE_KERNEL
from typer.testing import CliRunner

from sdpa_probe import caller_processes, caller_state
from sdpa_probe.backends import NativeBackend
from sdpa_probe.cases import Case
from sdpa_probe.check.calls import run_one
from sdpa_probe.cli import app
from sdpa_probe.native import load_user_kernel
from sdpa_probe.oracle import prepare_case

SRC = EXAMPLE_KERNEL.read_text()
ENTRY = "int st = sdpa_validate_args(a);"
HEADERS = ("#define _GNU_SOURCE\n#include <locale.h>\n#include <sched.h>\n#include <signal.h>\n"
           "#include <sys/prctl.h>\n#include <sys/resource.h>\n#include <sys/stat.h>\n"
           "#include <sys/time.h>\n#include <unistd.h>\n")


def _c_utf8() -> bool:
    try:
        old = locale.setlocale(locale.LC_NUMERIC)
        locale.setlocale(locale.LC_NUMERIC, "C.UTF-8")
        locale.setlocale(locale.LC_NUMERIC, old)
        return True
    except locale.Error:
        return False


# (name, C put at the start of sdpa_forward, a fragment of the reason, whether it can run
# here: a bool or a function)
CHANGES = [
    ("affinity", "cpu_set_t cs_; CPU_ZERO(&cs_); CPU_SET(sched_getcpu(), &cs_);"
                 " sched_setaffinity(0, sizeof cs_, &cs_);",
     "the calling thread's CPU affinity", len(os.sched_getaffinity(0)) > 1),
    ("sigmask", "sigset_t ss_; sigemptyset(&ss_); sigaddset(&ss_, SIGINT);"
                " pthread_sigmask(SIG_BLOCK, &ss_, NULL);",
     "signals blocked on the calling thread: SIGINT", True),
    ("handler", "signal(SIGUSR2, SIG_IGN);", "the SIGUSR2 handler default -> ignored", True),
    ("env", 'setenv("OMP_NUM_THREADS", "1", 1);',
     "the environment variable OMP_NUM_THREADS set to '1'", "OMP_NUM_THREADS" not in os.environ),
    ("locale", 'setlocale(LC_NUMERIC, "C.UTF-8");', "the locale's LC_NUMERIC", _c_utf8),
    ("timer", "alarm(1000);", "an interval timer armed (ITIMER_REAL: SIGALRM in", True),
    ("umask", "umask(0);", "-> 000", lambda: caller_state.read().raw.umask > 0),
    ("cwd", 'if (chdir("/")) return SDPA_INVALID;', "the working directory", os.getcwd() != "/"),
    ("name", 'prctl(PR_SET_NAME, "sdpa-w0", 0, 0, 0);', "'sdpa-w0'", True),
    ("rlimit", "struct rlimit rl_; getrlimit(RLIMIT_NOFILE, &rl_); rl_.rlim_cur -= 1;"
               " setrlimit(RLIMIT_NOFILE, &rl_);", "the resource limit RLIMIT_NOFILE", True),
]


def _kernel(tmp_path, name: str, code: str):
    path = tmp_path / f"{name}.c"
    path.write_text(HEADERS + SRC.replace(ENTRY, code + "\n  " + ENTRY))
    return NativeBackend(name, load_user_kernel(path))


@pytest.mark.parametrize("name,code,reason,runs", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_kernel_that_changes_its_caller_fails_and_the_caller_gets_it_back(
        tmp_path, name, code, reason, runs):
    if not (runs() if callable(runs) else runs):
        pytest.skip("this machine cannot show that change")
    backend = _kernel(tmp_path, name, code)
    case = Case("bug", kv_len=20)
    before = caller_state.read()
    rec = run_one(backend, case, prepare_case(case))
    assert caller_state.changes(before, caller_state.read()) == []  # put back
    assert rec["status"] == "fail", rec
    assert rec["reason"].startswith("left its caller changed"), rec["reason"]
    assert reason in rec["reason"], rec["reason"]


def test_a_kernel_that_puts_back_what_it_changed_passes(tmp_path):
    code = ("sigset_t ss_, old_; sigemptyset(&ss_); sigaddset(&ss_, SIGINT);"
            " pthread_sigmask(SIG_BLOCK, &ss_, &old_); pthread_sigmask(SIG_SETMASK, &old_, NULL);"
            " struct sigaction sa_, osa_; memset(&sa_, 0, sizeof sa_); sa_.sa_handler = SIG_IGN;"
            " sigaction(SIGUSR2, &sa_, &osa_); sigaction(SIGUSR2, &osa_, NULL);")
    case = Case("bug", kv_len=20)
    rec = run_one(_kernel(tmp_path, "restores", code), case, prepare_case(case))
    assert rec["status"] == "pass", rec


def test_a_change_made_only_by_a_later_call_is_caught_by_the_repeats(tmp_path):
    code = 'static int calls_ = 0; if (++calls_ == 3) setenv("SDPA_PROBE_TEST_LATE", "x", 1);'
    case = Case("bug", kv_len=20)
    rec = run_one(_kernel(tmp_path, "late", code), case, prepare_case(case))
    assert rec["status"] == "fail", rec
    assert "on a repeat of the same call" in rec["reason"], rec["reason"]
    assert "SDPA_PROBE_TEST_LATE set to 'x'" in rec["reason"]
    assert "SDPA_PROBE_TEST_LATE" not in caller_state.read().env


def test_concurrent_callers_do_not_make_a_change_the_new_normal(tmp_path):
    """Read around each call, the second caller's 'before' held the first one's change and
    put it back as found: every case after passed (28 of the default suite's)."""
    backend = _kernel(tmp_path, "env_c2", 'setenv("SDPA_PROBE_TEST_C2", "1", 1);')
    two = Case("threads", q_len=1, kv_len=100, n_heads=8, n_kv_heads=2, callers=2)
    one = Case("bug", kv_len=20)
    recs = [run_one(backend, c, prepare_case(c)) for c in (two, one)]
    assert all(r["status"] == "fail" and "SDPA_PROBE_TEST_C2 set to '1'" in r["reason"]
               for r in recs), recs
    assert recs[0]["reason"].startswith("left its caller changed after 2 concurrent calls")
    assert "SDPA_PROBE_TEST_C2" not in caller_state.read().env


def test_check_cli_names_the_change_in_every_record(tmp_path):
    """Through `probe check` (worker processes): each case fails by it, none by another
    layer, so the worker's state is put back between cases."""
    path = tmp_path / "pin.c"
    path.write_text(HEADERS + SRC.replace(ENTRY, "signal(SIGUSR1, SIG_IGN);\n  " + ENTRY))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["check", "--kernel", str(path), "--suite", "smoke",
                                   "--json", str(out)])
    assert res.exit_code == 1, res.output
    recs = [r for r in json.loads(out.read_text())["records"] if r["status"] != "unsupported"]
    assert recs and all("the SIGUSR1 handler default -> ignored" in r["reason"] for r in recs)


def test_changes_are_described_in_words():
    before = caller_state.read()
    now = caller_state.read()
    assert caller_state.changes(before, now) == []
    now.env = dict(before.env, NEW_VAR="1")
    now.env.pop(next(iter(before.env)), None)
    said = caller_state.changes(before, now)
    assert "the environment variable NEW_VAR set to '1'" in said
    assert any(s.endswith(")") and "unset (was" in s for s in said)
    now = caller_state.read()
    now.raw.blocked = before.raw.blocked | (1 << (signal.SIGTERM - 1))
    assert caller_state.changes(before, now) == ["signals blocked on the calling thread: SIGTERM"]


@pytest.mark.parametrize("inject,said", [
    ("if (fork() == 0) { sleep(30); _exit(0); }", "child process started"),
    ("if (fork() == 0) _exit(0);", "child process started"),  # (a zombie left)
    ("close(2);", "its stderr (fd 2) closed"),
    ('{ int fd = open("/dev/null", O_WRONLY); dup2(fd, 1); close(fd); }',
     "its stdout (fd 1) replaced"),
])
def test_a_kernel_that_forks_or_takes_the_standard_fds_fails(tmp_path, inject, said):
    path = tmp_path / "k.c"
    path.write_text("#include <fcntl.h>\n#include <unistd.h>\n" + SRC.replace(
        "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;",
        "if (a->batch == 0 || a->q_len == 0) return SDPA_OK;\n  " + inject))
    before = (os.fstat(1).st_ino, os.fstat(2).st_ino), caller_processes.read().children
    case = Case("caller", kv_len=40)
    rec = run_one(NativeBackend(str(path), load_user_kernel(path)), case, prepare_case(case))
    assert rec.status == "fail" and said in rec.reason, rec.reason
    # put back: the fds as they were, the processes it started killed and reaped
    assert ((os.fstat(1).st_ino, os.fstat(2).st_ino), caller_processes.read().children) == before
